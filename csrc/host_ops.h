// CPU drivers for the shared kernels in kernels/: each loops the per-pixel function over rows
// split across `threads` std::threads. Called with the GIL released; return false on bad sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/alpha.h"
#include "kernels/color.h"
#include "kernels/resize.h"

namespace lazymedia {

// Applies EXIF `orientation` to an h x w x c uint8 image. dst holds h*w*c bytes and must not
// alias src. Returns false for an orientation outside 1-8 or a non-positive size.
bool orient_hwc(const uint8_t* src, uint8_t* dst, int h, int w, int c, int orientation, int threads);

// Weights of one resampling axis, computed on the host (the GPU driver uploads the same arrays).
struct ResamplePlan {
  int in_size = 0, out_size = 0, ksize = 0;
  std::vector<int> bounds;   // 2 per output: first input, count
  std::vector<int> weights;  // ksize per output, fixed point with kResamplePrecisionBits
  kernels::AxisCoeffs view() const { return {ksize, bounds.data(), weights.data()}; }
};

ResamplePlan make_resample_plan(int in_size, int out_size, kernels::Filter filter);

// Pillow 13's pass order: vertical first when the height loses more than twice as many rows as
// the width loses columns (the rounding between the passes then matches it bit for bit).
inline bool resample_vertical_first(int h, int w, int oh, int ow) { return h - oh > 0 && h - oh > (w - ow) * 2; }

// Resizes an h x w x c uint8 image to oh x ow as Pillow does (horizontal pass, then vertical).
bool resize_hwc(const uint8_t* src, int h, int w, int c, uint8_t* dst, int oh, int ow, kernels::Filter filter,
                int threads);

// NV12 (uv interleaved) or I420 (u_plane and v_plane) to packed RGB (h x w x 3).
bool nv12_to_rgb(const uint8_t* y_plane, int y_stride, const uint8_t* uv_plane, int uv_stride, int h, int w,
                 uint8_t* dst, kernels::Matrix matrix, bool full_range, int threads);
bool i420_to_rgb(const uint8_t* y_plane, int y_stride, const uint8_t* u_plane, const uint8_t* v_plane, int c_stride,
                 int h, int w, uint8_t* dst, kernels::Matrix matrix, bool full_range, int threads);

// HWC uint8 -> CHW float32, (x / 255 - mean) / std per channel.
bool hwc_to_chw_normalized(const uint8_t* src, int h, int w, int c, const float* mean, const float* std_dev, float* dst,
                           int threads);
bool hwc_to_chw(const uint8_t* src, int h, int w, int c, uint8_t* dst, int threads);
bool chw_to_hwc(const uint8_t* src, int h, int w, int c, uint8_t* dst, int threads);

// Packs `pixels` pixels of `channels` (2: gray+alpha, 4: RGB+alpha) into channels - 1 in place:
// the colour composited over `background` (channels - 1 values, kernels/alpha.h) through the
// alpha, or the alpha dropped when `background` is null. Pixel i moves from i * channels to
// i * (channels - 1), never over bytes still unread, so the pass runs front to back. Decoders that
// can only emit the alpha channel thus need no second buffer. False for other channel counts.
bool pack_alpha_in_place(uint8_t* data, size_t pixels, int channels, const uint8_t* background);

// Widens the `pixels` gray bytes at the start of `data` to RGB (3 * pixels bytes), in place,
// back to front (as Pillow's L -> RGB: each gray value three times).
void gray_to_rgb_in_place(uint8_t* data, size_t pixels);

}  // namespace lazymedia
