// The nvJPEG decoder's own kernel: the engines' planar RGB output interleaved into the caller's
// HWC tensor, with the EXIF orientation applied in the same pass (one kernel per image instead
// of nvJPEG's per-image interleaved conversion plus an orientation pass).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lazymedia {
namespace cuda {

// `planes`: R, G and B planes of h x w bytes, back to back; `dst`: the oriented image, HWC.
cudaError_t launch_planar_to_interleaved(const uint8_t* planes, uint8_t* dst, int h, int w, int orientation,
                                         cudaStream_t stream);

}  // namespace cuda
}  // namespace lazymedia
