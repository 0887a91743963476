// YUV (NV12 / I420, as decoders and NVDEC emit them) to RGB, per pixel, host and device.
#pragma once

#include "common.h"

namespace lazymedia {
namespace kernels {

enum class Matrix : int { BT601 = 0, BT709 = 1 };

// Conversion constants for one matrix and range, derived from Kr and Kb.
struct YuvToRgb {
  float y_scale, y_offset, c_scale;
  float rv, gu, gv, bu;
};

inline YuvToRgb make_yuv_to_rgb(Matrix matrix, bool full_range) {
  const double kr = matrix == Matrix::BT709 ? 0.2126 : 0.299;
  const double kb = matrix == Matrix::BT709 ? 0.0722 : 0.114;
  const double kg = 1.0 - kr - kb;
  YuvToRgb t;
  t.y_scale = full_range ? 1.0f : float(255.0 / 219.0);
  t.y_offset = full_range ? 0.0f : 16.0f;
  t.c_scale = full_range ? 1.0f : float(255.0 / 224.0);
  t.rv = float(2.0 * (1.0 - kr));
  t.gu = float(-2.0 * kb * (1.0 - kb) / kg);
  t.gv = float(-2.0 * kr * (1.0 - kr) / kg);
  t.bu = float(2.0 * (1.0 - kb));
  return t;
}

LM_HD uint8_t round_u8(float v) {
  v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
  return uint8_t(int(v + 0.5f));
}

LM_HD void yuv_to_rgb_pixel(const YuvToRgb& t, uint8_t y, uint8_t u, uint8_t v, uint8_t* rgb) {
  const float yf = (float(y) - t.y_offset) * t.y_scale;
  const float uf = (float(u) - 128.0f) * t.c_scale;
  const float vf = (float(v) - 128.0f) * t.c_scale;
  rgb[0] = round_u8(yf + t.rv * vf);
  rgb[1] = round_u8(yf + t.gu * uf + t.gv * vf);
  rgb[2] = round_u8(yf + t.bu * uf);
}

// NV12: full-resolution Y plane, half-resolution interleaved UV plane. Chroma is sampled at the
// co-sited (top-left) position of each 2x2 block.
LM_HD void nv12_pixel(const YuvToRgb& t, const uint8_t* y_plane, int y_stride, const uint8_t* uv_plane, int uv_stride,
                      int y, int x, uint8_t* rgb) {
  const uint8_t* uv = uv_plane + (y >> 1) * uv_stride + (x >> 1) * 2;
  yuv_to_rgb_pixel(t, y_plane[y * y_stride + x], uv[0], uv[1], rgb);
}

// I420: Y plane plus separate half-resolution U and V planes.
LM_HD void i420_pixel(const YuvToRgb& t, const uint8_t* y_plane, int y_stride, const uint8_t* u_plane,
                      const uint8_t* v_plane, int c_stride, int y, int x, uint8_t* rgb) {
  const int c = (y >> 1) * c_stride + (x >> 1);
  yuv_to_rgb_pixel(t, y_plane[y * y_stride + x], u_plane[c], v_plane[c], rgb);
}

}  // namespace kernels
}  // namespace lazymedia
