// CPU drivers for the shared kernels in kernels/. Called with the GIL released.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazymedia {

// Applies EXIF `orientation` to an h x w x c uint8 image. dst holds h*w*c bytes and must not
// alias src. Returns false for an orientation outside 1-8 or a non-positive size.
bool orient_hwc(const uint8_t* src, uint8_t* dst, int h, int w, int c, int orientation);

}  // namespace lazymedia
