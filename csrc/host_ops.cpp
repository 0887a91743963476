#include "host_ops.h"

#include "kernels/orientation.h"

namespace lazymedia {

bool orient_hwc(const uint8_t* src, uint8_t* dst, int h, int w, int c, int orientation) {
  if (orientation < 1 || orientation > 8 || h <= 0 || w <= 0 || c <= 0) return false;
  const bool swap = kernels::orientation_swaps_axes(orientation);
  const int out_h = swap ? w : h, out_w = swap ? h : w;
  for (int y = 0; y < out_h; ++y)
    for (int x = 0; x < out_w; ++x) kernels::orient_pixel(src, dst, orientation, h, w, c, y, x);
  return true;
}

}  // namespace lazymedia
