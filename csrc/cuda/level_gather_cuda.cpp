// level_gather.cpp compiled again for _C_cuda, which compiles host_ops.cpp (and so the level
// coder's read) as well; a translation unit of its own for the reason host_ops_cuda.cpp gives.
#include "../level_gather.cpp"
