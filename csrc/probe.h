// Header probe: reads format, geometry and orientation from encoded bytes without decoding.
//
// Plain C++ with no Python or CUDA dependency, so the fuzz harness and the bindings share it.
// Every read is bounds-checked; work is linear in the size; memory use is constant apart from a
// capped EXIF scratch buffer for PNG "Raw profile type exif" text chunks (hex encoded).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lazymedia {

enum class ImageFormat : int { Unknown = 0, Jpeg = 1, Png = 2, Gif = 3, WebP = 4 };

enum class ProbeStatus : int {
  Ok = 0,
  UnknownFormat = 1,  // magic bytes match no supported format: not media
  Truncated = 2,      // the header ends before the fields we need
  Malformed = 3,      // the header is present but inconsistent
};

// JPEG start-of-frame kinds, named after the SOF marker that introduces the frame.
enum class JpegEncoding : int {
  None = 0,
  Baseline = 1,               // SOF0
  ExtendedSequential = 2,     // SOF1
  Progressive = 3,            // SOF2
  Lossless = 4,               // SOF3
  Hierarchical = 5,           // SOF5-7 (differential)
  Arithmetic = 6,             // SOF9
  ArithmeticProgressive = 7,  // SOF10
  ArithmeticLossless = 8,     // SOF11, SOF13-15
};

struct ProbeResult {
  ProbeStatus status = ProbeStatus::Ok;
  const char* error = "";  // static string describing a non-Ok status
  ImageFormat format = ImageFormat::Unknown;
  uint32_t width = 0;
  uint32_t height = 0;
  int components = 0;  // channels the decoder produces natively (palette counts as 3)
  int bit_depth = 0;
  bool has_alpha = false;
  int orientation = 1;  // EXIF orientation 1-8 (1 when absent or invalid)
  bool has_icc = false;
  // JPEG
  JpegEncoding jpeg_encoding = JpegEncoding::None;
  const char* chroma_subsampling = "";  // "444", "422", "420", "440", "411", "410", "gray", "other"
  bool has_adobe = false;
  int adobe_transform = -1;  // 0 = none (RGB/CMYK), 1 = YCbCr, 2 = YCCK, -1 = absent/truncated
  // Scans the decoder runs: 1 for a sequential file whose first scan holds every component;
  // otherwise (progressive, or components in separate scans) the SOS markers counted by walking
  // the marker segments through the entropy-coded data, once, to the end (linear in the size).
  int scan_count = 0;
  // PNG
  int png_color_type = -1;
  bool png_interlaced = false;
  bool png_compressed_text = false;  // a zTXt or compressed iTXt chunk (text that inflates)
  // GIF / APNG / WebP animation
  bool animated = false;
  int frame_count = 1;           // -1 when not cheaply known
  uint32_t max_frame_width = 0;  // largest frame extent (left + width), GIF only; else == width
  uint32_t max_frame_height = 0;
  // WebP
  const char* webp_kind = "";  // "VP8", "VP8L", "VP8X"
};

// Probes `size` bytes at `data`. Never reads outside [data, data + size).
ProbeResult probe_image(const uint8_t* data, size_t size);

const char* format_name(ImageFormat f);
const char* jpeg_encoding_name(JpegEncoding e);

}  // namespace lazymedia
