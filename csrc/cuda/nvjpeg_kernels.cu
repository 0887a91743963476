#include "nvjpeg_kernels.h"

#include "../kernels/orientation.h"

namespace lazymedia {
namespace cuda {
namespace {

constexpr int kBlockX = 32, kBlockY = 8;

__global__ void planar_to_interleaved_kernel(const uint8_t* planes, uint8_t* dst, int h, int w, int orientation,
                                             int out_h, int out_w) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= out_w || y >= out_h) return;
  int sy, sx;
  kernels::orientation_source(orientation, h, w, y, x, &sy, &sx);
  const long long plane = static_cast<long long>(h) * w, at = static_cast<long long>(sy) * w + sx;
  uint8_t* d = dst + (static_cast<long long>(y) * out_w + x) * 3;
  d[0] = planes[at];
  d[1] = planes[plane + at];
  d[2] = planes[2 * plane + at];
}

}  // namespace

cudaError_t launch_planar_to_interleaved(const uint8_t* planes, uint8_t* dst, int h, int w, int orientation,
                                         cudaStream_t stream) {
  if (orientation < 1 || orientation > 8 || h <= 0 || w <= 0) return cudaErrorInvalidValue;
  const bool swap = kernels::orientation_swaps_axes(orientation);
  const int out_h = swap ? w : h, out_w = swap ? h : w;
  const dim3 grid((out_w + kBlockX - 1) / kBlockX, (out_h + kBlockY - 1) / kBlockY);
  planar_to_interleaved_kernel<<<grid, dim3(kBlockX, kBlockY), 0, stream>>>(planes, dst, h, w, orientation, out_h,
                                                                            out_w);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace lazymedia
