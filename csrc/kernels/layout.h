// Layout and dtype conversions at the processor boundary: HWC uint8 <-> CHW, normalised float.
#pragma once

#include "common.h"

namespace lazymedia {
namespace kernels {

// out[c][y][x] = (in[y][x][c] / 255 - mean[c]) / std[c], written as float32 CHW.
LM_HD void hwc_u8_to_chw_normalized_pixel(const uint8_t* src, float* dst, int h, int w, int c, int y, int x,
                                          const float* mean, const float* inv_std) {
  const uint8_t* s = src + (static_cast<long long>(y) * w + x) * c;
  const long long plane = static_cast<long long>(h) * w;
  float* d = dst + static_cast<long long>(y) * w + x;
  for (int k = 0; k < c; ++k) d[k * plane] = (float(s[k]) * (1.0f / 255.0f) - mean[k]) * inv_std[k];
}

// Pure layout change, uint8: HWC -> CHW.
LM_HD void hwc_to_chw_pixel(const uint8_t* src, uint8_t* dst, int h, int w, int c, int y, int x) {
  const uint8_t* s = src + (static_cast<long long>(y) * w + x) * c;
  const long long plane = static_cast<long long>(h) * w;
  uint8_t* d = dst + static_cast<long long>(y) * w + x;
  for (int k = 0; k < c; ++k) d[k * plane] = s[k];
}

// uint8: CHW -> HWC.
LM_HD void chw_to_hwc_pixel(const uint8_t* src, uint8_t* dst, int h, int w, int c, int y, int x) {
  const long long plane = static_cast<long long>(h) * w;
  const uint8_t* s = src + static_cast<long long>(y) * w + x;
  uint8_t* d = dst + (static_cast<long long>(y) * w + x) * c;
  for (int k = 0; k < c; ++k) d[k] = s[k * plane];
}

}  // namespace kernels
}  // namespace lazymedia
