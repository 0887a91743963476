// Launchers of the shared per-pixel kernels (csrc/kernels/*.h) on the GPU. All pointers are
// device pointers, all work is enqueued on `stream`, and each returns the launch status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../kernels/color.h"
#include "../kernels/resize.h"

namespace lazymedia {
namespace cuda {

cudaError_t launch_orient(const uint8_t* src, uint8_t* dst, int h, int w, int c, int orientation, cudaStream_t stream);

// NV12 frames as NVDEC writes them: `frames` luma+chroma planes of `pitch` bytes per row, the
// UV plane starting `uv_offset` bytes after each frame's Y plane; frames are `frame_bytes` apart.
cudaError_t launch_nv12_to_rgb(const uint8_t* nv12, long long frame_bytes, long long uv_offset, int pitch, int frames,
                               int h, int w, uint8_t* rgb, kernels::YuvToRgb coeffs, cudaStream_t stream);

// One separable pass of the antialiased resize. `bounds` and `weights` are device copies of a
// ResamplePlan (host_ops.h); horizontal maps rows x w_in -> rows x w_out, vertical maps
// h_in x w -> h_out x w reading rows shifted by row_offset.
cudaError_t launch_resample_horizontal(const uint8_t* src, int rows, int w_in, int c, int row0,
                                       kernels::AxisCoeffs coeffs, int w_out, uint8_t* dst, cudaStream_t stream);
cudaError_t launch_resample_vertical(const uint8_t* src, int w, int c, int row_offset, kernels::AxisCoeffs coeffs,
                                     int h_out, uint8_t* dst, cudaStream_t stream);

struct Normalization {
  float mean[4];
  float inv_std[4];
};

cudaError_t launch_to_chw_normalized(const uint8_t* src, int h, int w, int c, Normalization norm, float* dst,
                                     cudaStream_t stream);

}  // namespace cuda
}  // namespace lazymedia
