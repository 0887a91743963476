#include "host_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/layout.h"
#include "kernels/orientation.h"
#include "parallel.h"

namespace lazymedia {
namespace {

bool valid(int h, int w, int c) { return h > 0 && w > 0 && c > 0 && c <= 4; }

}  // namespace

namespace {

template <int Orientation, int C>
void orient_rows(const uint8_t* src, uint8_t* dst, int h, int w, int threads) {
  constexpr bool swap = Orientation >= 5;
  const int out_h = swap ? w : h, out_w = swap ? h : w;
  parallel_rows(out_h, threads, [&](int y) {
    for (int x = 0; x < out_w; ++x) kernels::orient_pixel(src, dst, Orientation, h, w, C, y, x);
  });
}

template <int C>
void orient_dispatch(const uint8_t* src, uint8_t* dst, int h, int w, int orientation, int threads) {
  switch (orientation) {
    case 1: orient_rows<1, C>(src, dst, h, w, threads); break;
    case 2: orient_rows<2, C>(src, dst, h, w, threads); break;
    case 3: orient_rows<3, C>(src, dst, h, w, threads); break;
    case 4: orient_rows<4, C>(src, dst, h, w, threads); break;
    case 5: orient_rows<5, C>(src, dst, h, w, threads); break;
    case 6: orient_rows<6, C>(src, dst, h, w, threads); break;
    case 7: orient_rows<7, C>(src, dst, h, w, threads); break;
    default: orient_rows<8, C>(src, dst, h, w, threads); break;
  }
}

}  // namespace

bool orient_hwc(const uint8_t* src, uint8_t* dst, int h, int w, int c, int orientation, int threads) {
  if (orientation < 1 || orientation > 8 || !valid(h, w, c)) return false;
  switch (c) {
    case 1: orient_dispatch<1>(src, dst, h, w, orientation, threads); break;
    case 2: orient_dispatch<2>(src, dst, h, w, orientation, threads); break;
    case 3: orient_dispatch<3>(src, dst, h, w, orientation, threads); break;
    default: orient_dispatch<4>(src, dst, h, w, orientation, threads); break;
  }
  return true;
}

ResamplePlan make_resample_plan(int in_size, int out_size, kernels::Filter filter) {
  ResamplePlan plan;
  plan.in_size = in_size;
  plan.out_size = out_size;
  const double scale = double(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = kernels::filter_support(filter) * filterscale;
  plan.ksize = int(std::ceil(support)) * 2 + 1;
  plan.bounds.resize(size_t(out_size) * 2);
  plan.weights.assign(size_t(out_size) * plan.ksize, 0);
  std::vector<double> k(plan.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = int(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = kernels::filter_weight(filter, (x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[x] / ww : k[x];
      const double fixed = w * (1 << kernels::kResamplePrecisionBits);
      plan.weights[size_t(xx) * plan.ksize + x] = int(w < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    plan.bounds[2 * xx] = xmin;
    plan.bounds[2 * xx + 1] = xmax;
  }
  return plan;
}

namespace {

// One separable pass over an image: the horizontal pass reads rows [row0, row0 + rows) of src
// (w x C) and writes rows x ow; the vertical pass reads src rows through the plan's bounds. The
// channel count is a template argument so the per-pixel channel loop unrolls.
template <int C>
void horizontal_pass(const uint8_t* src, int w, int row0, int rows, const ResamplePlan& plan, uint8_t* dst,
                     int threads) {
  const kernels::AxisCoeffs ax = plan.view();
  const int ow = plan.out_size;
  parallel_rows(rows, threads, [&](int r) {
    const uint8_t* row = src + size_t(row0 + r) * w * C;
    uint8_t* out = dst + size_t(r) * ow * C;
    for (int x = 0; x < ow; ++x) kernels::resample_h_pixel(row, C, ax, x, out + size_t(x) * C);
  });
}

template <int C>
void vertical_pass(const uint8_t* src, int w, int row_offset, const ResamplePlan& plan, uint8_t* dst, int threads) {
  const kernels::AxisCoeffs ax = plan.view();
  const long long row_bytes = static_cast<long long>(w) * C;
  parallel_rows(plan.out_size, threads, [&](int y) {
    uint8_t* out = dst + size_t(y) * w * C;
    for (int x = 0; x < w; ++x) kernels::resample_v_pixel(src, row_bytes, C, ax, row_offset, y, x, out + size_t(x) * C);
  });
}

template <int C>
void resize_c(const uint8_t* src, int h, int w, uint8_t* dst, int oh, int ow, kernels::Filter filter, int threads) {
  const bool need_h = ow != w, need_v = oh != h;
  const ResamplePlan hplan = make_resample_plan(w, ow, filter);
  const ResamplePlan vplan = make_resample_plan(h, oh, filter);
  if (!need_v) {
    horizontal_pass<C>(src, w, 0, h, hplan, dst, threads);
    return;
  }
  if (!need_h) {
    vertical_pass<C>(src, w, 0, vplan, dst, threads);
    return;
  }
  if (resample_vertical_first(h, w, oh, ow)) {
    std::vector<uint8_t> temp(size_t(oh) * w * C);
    vertical_pass<C>(src, w, 0, vplan, temp.data(), threads);
    horizontal_pass<C>(temp.data(), w, 0, oh, hplan, dst, threads);
    return;
  }
  // Horizontal over only the rows the vertical pass reads, then vertical.
  const int first_row = vplan.bounds[0];
  const int last_row = vplan.bounds[2 * (oh - 1)] + vplan.bounds[2 * (oh - 1) + 1];
  std::vector<uint8_t> temp(size_t(last_row - first_row) * ow * C);
  horizontal_pass<C>(src, w, first_row, last_row - first_row, hplan, temp.data(), threads);
  vertical_pass<C>(temp.data(), ow, first_row, vplan, dst, threads);
}

}  // namespace

bool resize_hwc(const uint8_t* src, int h, int w, int c, uint8_t* dst, int oh, int ow, kernels::Filter filter,
                int threads) {
  if (!valid(h, w, c) || oh <= 0 || ow <= 0) return false;
  if (ow == w && oh == h) {
    std::copy(src, src + size_t(h) * w * c, dst);
    return true;
  }
  switch (c) {
    case 1: resize_c<1>(src, h, w, dst, oh, ow, filter, threads); break;
    case 2: resize_c<2>(src, h, w, dst, oh, ow, filter, threads); break;
    case 3: resize_c<3>(src, h, w, dst, oh, ow, filter, threads); break;
    default: resize_c<4>(src, h, w, dst, oh, ow, filter, threads); break;
  }
  return true;
}

bool nv12_to_rgb(const uint8_t* y_plane, int y_stride, const uint8_t* uv_plane, int uv_stride, int h, int w,
                 uint8_t* dst, kernels::Matrix matrix, bool full_range, int threads) {
  if (!valid(h, w, 3) || y_stride < w || uv_stride < ((w + 1) / 2) * 2) return false;
  const kernels::YuvToRgb t = kernels::make_yuv_to_rgb(matrix, full_range);
  parallel_rows(h, threads, [&](int y) {
    for (int x = 0; x < w; ++x)
      kernels::nv12_pixel(t, y_plane, y_stride, uv_plane, uv_stride, y, x, dst + (size_t(y) * w + x) * 3);
  });
  return true;
}

bool i420_to_rgb(const uint8_t* y_plane, int y_stride, const uint8_t* u_plane, const uint8_t* v_plane, int c_stride,
                 int h, int w, uint8_t* dst, kernels::Matrix matrix, bool full_range, int threads) {
  if (!valid(h, w, 3) || y_stride < w || c_stride < (w + 1) / 2) return false;
  const kernels::YuvToRgb t = kernels::make_yuv_to_rgb(matrix, full_range);
  parallel_rows(h, threads, [&](int y) {
    for (int x = 0; x < w; ++x)
      kernels::i420_pixel(t, y_plane, y_stride, u_plane, v_plane, c_stride, y, x, dst + (size_t(y) * w + x) * 3);
  });
  return true;
}

bool hwc_to_chw_normalized(const uint8_t* src, int h, int w, int c, const float* mean, const float* std_dev, float* dst,
                           int threads) {
  if (!valid(h, w, c)) return false;
  float inv_std[4];
  for (int k = 0; k < c; ++k) {
    if (!(std_dev[k] != 0.0f)) return false;
    inv_std[k] = 1.0f / std_dev[k];
  }
  parallel_rows(h, threads, [&](int y) {
    for (int x = 0; x < w; ++x) kernels::hwc_u8_to_chw_normalized_pixel(src, dst, h, w, c, y, x, mean, inv_std);
  });
  return true;
}

bool hwc_to_chw(const uint8_t* src, int h, int w, int c, uint8_t* dst, int threads) {
  if (!valid(h, w, c)) return false;
  parallel_rows(h, threads, [&](int y) {
    for (int x = 0; x < w; ++x) kernels::hwc_to_chw_pixel(src, dst, h, w, c, y, x);
  });
  return true;
}

bool chw_to_hwc(const uint8_t* src, int h, int w, int c, uint8_t* dst, int threads) {
  if (!valid(h, w, c)) return false;
  parallel_rows(h, threads, [&](int y) {
    for (int x = 0; x < w; ++x) kernels::chw_to_hwc_pixel(src, dst, h, w, c, y, x);
  });
  return true;
}

bool pack_alpha_in_place(uint8_t* data, size_t pixels, int channels, const uint8_t* background) {
  if (channels != 2 && channels != 4) return false;
  const int colour = channels - 1;
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* in = data + i * channels;
    uint8_t* out = data + i * colour;
    const uint8_t alpha = in[colour];
    for (int k = 0; k < colour; ++k) {
      out[k] = background ? kernels::blend_over(in[k], alpha, background[k]) : in[k];  // out[k] <= in[k]: read first
    }
  }
  return true;
}

void gray_to_rgb_in_place(uint8_t* data, size_t pixels) {
  for (size_t i = pixels; i-- > 0;) {
    const uint8_t v = data[i];
    data[3 * i] = v;
    data[3 * i + 1] = v;
    data[3 * i + 2] = v;
  }
}

}  // namespace lazymedia
