// Alpha compositing exactly as Pillow's masked paste does it (vLLM's RGBA -> RGB rule:
// Image.new("RGB", size, background).paste(rgba, mask=alpha)), per channel, host and device.
#pragma once

#include "common.h"

namespace lazymedia {
namespace kernels {

// bg * (255 - a) + fg * a, divided by 255 rounding half up (Pillow's DIV255), bit for bit.
LM_HD uint8_t blend_over(uint8_t fg, uint8_t alpha, uint8_t bg) {
  const uint32_t t = uint32_t(bg) * (255u - alpha) + uint32_t(fg) * alpha + 128u;
  return uint8_t(((t >> 8) + t) >> 8);
}

}  // namespace kernels
}  // namespace lazymedia
