// EXIF orientation (1-8) as a pure index map, the same transposes Pillow's exif_transpose applies.
#pragma once

#include "common.h"

namespace lazymedia {
namespace kernels {

// Orientations 5-8 swap the axes: the output is width x height.
LM_HD bool orientation_swaps_axes(int orientation) { return orientation >= 5 && orientation <= 8; }

// For output pixel (y, x) of an image decoded as h x w, writes the source row and column.
LM_HD void orientation_source(int orientation, int h, int w, int y, int x, int* sy, int* sx) {
  switch (orientation) {
    case 2:
      *sy = y;
      *sx = w - 1 - x;
      break;  // mirror horizontal
    case 3:
      *sy = h - 1 - y;
      *sx = w - 1 - x;
      break;  // rotate 180
    case 4:
      *sy = h - 1 - y;
      *sx = x;
      break;  // mirror vertical
    case 5:
      *sy = x;
      *sx = y;
      break;  // transpose
    case 6:
      *sy = h - 1 - x;
      *sx = y;
      break;  // rotate 90 clockwise
    case 7:
      *sy = h - 1 - x;
      *sx = w - 1 - y;
      break;  // transverse
    case 8:
      *sy = x;
      *sx = w - 1 - y;
      break;  // rotate 90 counter-clockwise
    default:
      *sy = y;
      *sx = x;
      break;
  }
}

// Copies one output pixel of an HWC uint8 image with `c` channels.
LM_HD void orient_pixel(const uint8_t* src, uint8_t* dst, int orientation, int h, int w, int c, int y, int x) {
  int sy, sx;
  orientation_source(orientation, h, w, y, x, &sy, &sx);
  int out_w = orientation_swaps_axes(orientation) ? h : w;
  const uint8_t* s = src + (static_cast<long long>(sy) * w + sx) * c;
  uint8_t* d = dst + (static_cast<long long>(y) * out_w + x) * c;
  for (int k = 0; k < c; ++k) d[k] = s[k];
}

}  // namespace kernels
}  // namespace lazymedia
