// The host kernels (csrc/host_ops.cpp) compiled again for _C_cuda as a translation unit of its
// own: listing host_ops.cpp in both extensions made them share one object file, which a parallel
// build could link while the other extension was rewriting it (an empty object, undefined symbols).
#include "../host_ops.cpp"
