// Separable antialiased resampling, the algorithm of Pillow's Image.resize (ImagingResample):
// per output pixel a window of input pixels scaled by max(1, in/out), fixed-point weights with
// 22 fractional bits, two passes rounded to uint8 in between; the pass order is Pillow 13's
// (host_ops.h: resample_vertical_first), so the output equals Pillow's bit for bit.
#pragma once

#include "common.h"

namespace lazymedia {
namespace kernels {

constexpr int kResamplePrecisionBits = 32 - 8 - 2;

enum class Filter : int { Bilinear = 0, Bicubic = 1 };

LM_HD double filter_support(Filter f) { return f == Filter::Bicubic ? 2.0 : 1.0; }

LM_HD double filter_weight(Filter f, double x) {
  x = x < 0 ? -x : x;
  if (f == Filter::Bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  const double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Weights of one axis: output i reads inputs [bounds[2i], bounds[2i] + bounds[2i+1]) with
// weights weights[i * ksize + k].
struct AxisCoeffs {
  int ksize;
  const int* bounds;
  const int* weights;
};

LM_HD uint8_t clip_fixed(int v) {
  v >>= kResamplePrecisionBits;
  return uint8_t(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// One output pixel of the horizontal pass: src row `row` (w_in x c) -> dst pixel x.
LM_HD void resample_h_pixel(const uint8_t* row, int c, const AxisCoeffs& ax, int x, uint8_t* out) {
  const int xmin = ax.bounds[2 * x], xn = ax.bounds[2 * x + 1];
  const int* k = ax.weights + static_cast<long long>(x) * ax.ksize;
  for (int ch = 0; ch < c; ++ch) {
    int ss = 1 << (kResamplePrecisionBits - 1);
    for (int i = 0; i < xn; ++i) ss += int(row[(xmin + i) * c + ch]) * k[i];
    out[ch] = clip_fixed(ss);
  }
}

// One output pixel of the vertical pass: column x of `src` (rows of `row_bytes`) -> out pixel at
// output row y. `row_offset` is subtracted from the coefficient bounds (the horizontal pass may
// have produced only the rows the vertical pass reads).
LM_HD void resample_v_pixel(const uint8_t* src, long long row_bytes, int c, const AxisCoeffs& ax, int row_offset, int y,
                            int x, uint8_t* out) {
  const int ymin = ax.bounds[2 * y] - row_offset, yn = ax.bounds[2 * y + 1];
  const int* k = ax.weights + static_cast<long long>(y) * ax.ksize;
  for (int ch = 0; ch < c; ++ch) {
    int ss = 1 << (kResamplePrecisionBits - 1);
    for (int i = 0; i < yn; ++i) ss += int(src[(ymin + i) * row_bytes + static_cast<long long>(x) * c + ch]) * k[i];
    out[ch] = clip_fixed(ss);
  }
}

}  // namespace kernels
}  // namespace lazymedia
