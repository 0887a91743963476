// CUDA wrappers of the shared per-pixel functions: one thread per output pixel, the math is the
// host-tested code in csrc/kernels/.
#include "device_ops.h"

#include "../kernels/layout.h"
#include "../kernels/orientation.h"

namespace lazymedia {
namespace cuda {
namespace {

constexpr int kBlockX = 32, kBlockY = 8;

dim3 grid_for(int w, int h, int depth = 1) {
  return dim3((w + kBlockX - 1) / kBlockX, (h + kBlockY - 1) / kBlockY, depth);
}

__global__ void orient_kernel(const uint8_t* src, uint8_t* dst, int h, int w, int c, int orientation, int out_h,
                              int out_w) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < out_w && y < out_h) kernels::orient_pixel(src, dst, orientation, h, w, c, y, x);
}

__global__ void nv12_kernel(const uint8_t* nv12, long long frame_bytes, long long uv_offset, int pitch, int h, int w,
                            uint8_t* rgb, kernels::YuvToRgb coeffs) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  const int frame = blockIdx.z;
  if (x >= w || y >= h) return;
  const uint8_t* y_plane = nv12 + frame * frame_bytes;
  uint8_t* out = rgb + (static_cast<long long>(frame) * h * w + static_cast<long long>(y) * w + x) * 3;
  kernels::nv12_pixel(coeffs, y_plane, pitch, y_plane + uv_offset, pitch, y, x, out);
}

__global__ void resample_h_kernel(const uint8_t* src, int rows, int w_in, int c, int row0, kernels::AxisCoeffs ax,
                                  int w_out, uint8_t* dst) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= w_out || r >= rows) return;
  const uint8_t* row = src + static_cast<long long>(row0 + r) * w_in * c;
  kernels::resample_h_pixel(row, c, ax, x, dst + (static_cast<long long>(r) * w_out + x) * c);
}

__global__ void resample_v_kernel(const uint8_t* src, int w, int c, int row_offset, kernels::AxisCoeffs ax, int h_out,
                                  uint8_t* dst) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= w || y >= h_out) return;
  kernels::resample_v_pixel(src, static_cast<long long>(w) * c, c, ax, row_offset, y, x,
                            dst + (static_cast<long long>(y) * w + x) * c);
}

__global__ void chw_kernel(const uint8_t* src, int h, int w, int c, Normalization norm, float* dst) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) kernels::hwc_u8_to_chw_normalized_pixel(src, dst, h, w, c, y, x, norm.mean, norm.inv_std);
}

}  // namespace

cudaError_t launch_orient(const uint8_t* src, uint8_t* dst, int h, int w, int c, int orientation, cudaStream_t stream) {
  if (orientation < 1 || orientation > 8 || h <= 0 || w <= 0 || c <= 0) return cudaErrorInvalidValue;
  const bool swap = kernels::orientation_swaps_axes(orientation);
  const int out_h = swap ? w : h, out_w = swap ? h : w;
  orient_kernel<<<grid_for(out_w, out_h), dim3(kBlockX, kBlockY), 0, stream>>>(src, dst, h, w, c, orientation, out_h,
                                                                               out_w);
  return cudaGetLastError();
}

cudaError_t launch_nv12_to_rgb(const uint8_t* nv12, long long frame_bytes, long long uv_offset, int pitch, int frames,
                               int h, int w, uint8_t* rgb, kernels::YuvToRgb coeffs, cudaStream_t stream) {
  if (frames <= 0 || h <= 0 || w <= 0 || pitch < w || frames > 65535) return cudaErrorInvalidValue;
  nv12_kernel<<<grid_for(w, h, frames), dim3(kBlockX, kBlockY), 0, stream>>>(nv12, frame_bytes, uv_offset, pitch, h, w,
                                                                             rgb, coeffs);
  return cudaGetLastError();
}

cudaError_t launch_resample_horizontal(const uint8_t* src, int rows, int w_in, int c, int row0,
                                       kernels::AxisCoeffs coeffs, int w_out, uint8_t* dst, cudaStream_t stream) {
  if (rows <= 0 || w_in <= 0 || w_out <= 0 || c <= 0) return cudaErrorInvalidValue;
  resample_h_kernel<<<grid_for(w_out, rows), dim3(kBlockX, kBlockY), 0, stream>>>(src, rows, w_in, c, row0, coeffs,
                                                                                  w_out, dst);
  return cudaGetLastError();
}

cudaError_t launch_resample_vertical(const uint8_t* src, int w, int c, int row_offset, kernels::AxisCoeffs coeffs,
                                     int h_out, uint8_t* dst, cudaStream_t stream) {
  if (w <= 0 || h_out <= 0 || c <= 0) return cudaErrorInvalidValue;
  resample_v_kernel<<<grid_for(w, h_out), dim3(kBlockX, kBlockY), 0, stream>>>(src, w, c, row_offset, coeffs, h_out,
                                                                               dst);
  return cudaGetLastError();
}

cudaError_t launch_to_chw_normalized(const uint8_t* src, int h, int w, int c, Normalization norm, float* dst,
                                     cudaStream_t stream) {
  if (h <= 0 || w <= 0 || c <= 0 || c > 4) return cudaErrorInvalidValue;
  chw_kernel<<<grid_for(w, h), dim3(kBlockX, kBlockY), 0, stream>>>(src, h, w, c, norm, dst);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace lazymedia
