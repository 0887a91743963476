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

// Level coding of a tensor's element bit patterns E (uint16/32/64_t) as codes C (uint8/16_t), for
// the cache's values (lazymedia/cache/serialize.py). Element i belongs to group (i / run) % groups;
// group g's table is tables[g * levels, (g + 1) * levels), its distinct patterns in order of first
// appearance. level_encode writes codes[i] (src[i] == tables[g * levels + codes[i]], bit for bit)
// and counts[g]; false, early, when a group has more than `levels` patterns or a size is out of
// range (codes and tables then hold partial results). One pass over src on up to `threads`
// threads (each codes its chunk against tables of its own, then the codes are renumbered).
// `vectorise`: 32-bit patterns in uint8 codes take level_gather.h's write where the CPU has it.
// `half` > 0: every block of 2 * half elements must repeat its first half (bit for bit; false
// where one does not), and only the first halves are coded: codes then holds n / 2 codes, as
// level_decode's `half` reads them (run a multiple of 2 * half, n of 2 * half).
template <typename E, typename C>
bool level_encode(const E* src, size_t n, size_t run, size_t groups, size_t levels, C* codes, E* tables, size_t* counts,
                  int threads, bool vectorise = true, size_t half = 0);

// dst[i] = tables[g * length + codes[i]], on up to `threads` threads. False when a code is >= length
// (such an element is not read from the table: nothing is read out of bounds; dst is then partial)
// or a size is out of range. tables holds groups * length entries. `vectorise`: uint8 codes of
// 16/32-bit patterns take level_gather.h's read where the CPU has it (false: the portable loop).
// `half` > 0: of each block of 2 * half elements the codes hold the first half's, the second half
// repeating it (a processor's image tiled twice); dst then holds 2 * n elements, group g of element
// i is (i / run) % groups as ever, and run must be a multiple of 2 * half and n of half.
template <typename E, typename C>
bool level_decode(const C* codes, size_t n, size_t run, size_t groups, const E* tables, size_t length, E* dst,
                  int threads, bool vectorise = true, size_t half = 0);

}  // namespace lazymedia
