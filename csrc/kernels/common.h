// Shared per-pixel math: one definition, compiled for the host by g++ and for the device by nvcc.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LM_HD __host__ __device__ __forceinline__
#else
#define LM_HD inline
#endif

namespace lazymedia {
namespace kernels {

LM_HD uint8_t clamp_u8(int v) { return uint8_t(v < 0 ? 0 : (v > 255 ? 255 : v)); }

}  // namespace kernels
}  // namespace lazymedia
