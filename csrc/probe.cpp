// Header probe for JPEG, PNG, GIF and WebP. See probe.h.
//
// Orientation follows Pillow's ImageOps.exif_transpose so that the CPU reference and every
// backend agree: EXIF IFD0 tag 0x0112 first (JPEG APP1, PNG eXIf or ImageMagick's hex
// "Raw profile type exif", WebP EXIF chunk), then the XMP "tiff:Orientation" attribute.
#include "probe.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace lazymedia {
namespace {

// Bounds-checked view over the input. Accessors assume the caller checked has().
struct View {
  const uint8_t* p;
  size_t n;
  bool has(size_t off, size_t len) const { return off <= n && len <= n - off; }
  uint16_t be16(size_t o) const { return uint16_t((p[o] << 8) | p[o + 1]); }
  uint16_t le16(size_t o) const { return uint16_t(p[o] | (p[o + 1] << 8)); }
  uint32_t be32(size_t o) const {
    return (uint32_t(p[o]) << 24) | (uint32_t(p[o + 1]) << 16) | (uint32_t(p[o + 2]) << 8) | p[o + 3];
  }
  uint32_t le32(size_t o) const {
    return uint32_t(p[o]) | (uint32_t(p[o + 1]) << 8) | (uint32_t(p[o + 2]) << 16) | (uint32_t(p[o + 3]) << 24);
  }
  uint32_t le24(size_t o) const { return uint32_t(p[o]) | (uint32_t(p[o + 1]) << 8) | (uint32_t(p[o + 2]) << 16); }
  bool starts_with(size_t o, const char* s) const {
    size_t len = std::strlen(s);
    return has(o, len) && std::memcmp(p + o, s, len) == 0;
  }
};

constexpr int kNoOrientation = -1;

ProbeResult fail(ProbeResult r, ProbeStatus s, const char* why) {
  r.status = s;
  r.error = why;
  return r;
}

// Orientation tag (0x0112) of IFD0 in a TIFF structure, or kNoOrientation. Accepts an optional
// "Exif\0\0" prefix as Pillow's Exif.load does.
int tiff_orientation(const uint8_t* data, size_t size) {
  View v{data, size};
  if (size >= 6 && std::memcmp(data, "Exif\0\0", 6) == 0) v = View{data + 6, size - 6};
  if (!v.has(0, 8)) return kNoOrientation;
  bool le;
  if (v.p[0] == 'I' && v.p[1] == 'I') {
    le = true;
  } else if (v.p[0] == 'M' && v.p[1] == 'M') {
    le = false;
  } else {
    return kNoOrientation;
  }
  auto r16 = [&](size_t o) { return le ? v.le16(o) : v.be16(o); };
  auto r32 = [&](size_t o) { return le ? v.le32(o) : v.be32(o); };
  if (r16(2) != 42) return kNoOrientation;
  size_t ifd = r32(4);
  if (!v.has(ifd, 2)) return kNoOrientation;
  unsigned entries = r16(ifd);
  for (unsigned i = 0; i < entries; ++i) {
    size_t e = ifd + 2 + size_t(i) * 12;
    if (!v.has(e, 12)) break;
    if (r16(e) != 0x0112) continue;
    unsigned type = r16(e + 2);
    if (r32(e + 4) < 1) return kNoOrientation;
    switch (type) {
      case 1: return v.p[e + 8];
      case 3: return r16(e + 8);
      case 4: return int(std::min<uint32_t>(r32(e + 8), 0xFFFF));
      default: return kNoOrientation;
    }
  }
  return kNoOrientation;
}

// Pillow's regex `tiff:Orientation(="|>)([0-9])`, first match.
int xmp_orientation(const uint8_t* data, size_t size) {
  static const char kTag[] = "tiff:Orientation";
  const size_t tag_len = sizeof(kTag) - 1;
  if (size < tag_len) return kNoOrientation;
  for (size_t i = 0; i + tag_len <= size; ++i) {
    if (std::memcmp(data + i, kTag, tag_len) != 0) continue;
    size_t j = i + tag_len;
    if (j + 2 < size && data[j] == '=' && data[j + 1] == '"') {
      if (data[j + 2] >= '0' && data[j + 2] <= '9') return data[j + 2] - '0';
    } else if (j + 1 < size && data[j] == '>') {
      if (data[j + 1] >= '0' && data[j + 1] <= '9') return data[j + 1] - '0';
    }
  }
  return kNoOrientation;
}

// Pillow applies orientations 2-8 and treats anything else as the identity.
int final_orientation(int exif, int xmp) {
  int o = exif != kNoOrientation ? exif : xmp;
  return (o >= 2 && o <= 8) ? o : 1;
}

int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// ImageMagick's "Raw profile type exif" text: "\nexif\n<len>\n<hex...>". IFD0 sits at the start of
// the profile, so only the first kMaxRawExif decoded bytes are kept.
int raw_profile_orientation(const uint8_t* text, size_t size) {
  constexpr size_t kMaxRawExif = 64 * 1024;
  size_t pos = 0;
  for (int newlines = 0; newlines < 3 && pos < size; ++pos) {
    if (text[pos] == '\n') ++newlines;
  }
  std::vector<uint8_t> decoded;
  decoded.reserve(std::min(kMaxRawExif, size / 2 + 1));
  int hi = -1;
  for (; pos < size && decoded.size() < kMaxRawExif; ++pos) {
    uint8_t c = text[pos];
    if (c == '\n' || c == ' ' || c == '\r' || c == '\t') continue;
    int h = hex_value(c);
    if (h < 0) break;
    if (hi < 0) {
      hi = h;
    } else {
      decoded.push_back(uint8_t(hi << 4 | h));
      hi = -1;
    }
  }
  return tiff_orientation(decoded.data(), decoded.size());
}

const char* subsampling_name(int h0, int v0, int h1, int v1) {
  if (h1 == 0 || v1 == 0 || h0 % h1 != 0 || v0 % v1 != 0) return "other";
  int h = h0 / h1, v = v0 / v1;
  if (h == 1 && v == 1) return "444";
  if (h == 2 && v == 1) return "422";
  if (h == 2 && v == 2) return "420";
  if (h == 1 && v == 2) return "440";
  if (h == 4 && v == 1) return "411";
  if (h == 4 && v == 2) return "410";
  return "other";
}

JpegEncoding sof_encoding(uint8_t m) {
  switch (m) {
    case 0xC0: return JpegEncoding::Baseline;
    case 0xC1: return JpegEncoding::ExtendedSequential;
    case 0xC2: return JpegEncoding::Progressive;
    case 0xC3: return JpegEncoding::Lossless;
    case 0xC5:
    case 0xC6:
    case 0xC7: return JpegEncoding::Hierarchical;
    case 0xC9: return JpegEncoding::Arithmetic;
    case 0xCA: return JpegEncoding::ArithmeticProgressive;
    case 0xCB:
    case 0xCD:
    case 0xCE:
    case 0xCF: return JpegEncoding::ArithmeticLossless;
    default: return JpegEncoding::None;
  }
}

ProbeResult probe_jpeg(View v) {
  ProbeResult r;
  r.format = ImageFormat::Jpeg;
  int exif = kNoOrientation, xmp = kNoOrientation;
  bool seen_exif = false, found_sof = false, ran_out = true, in_scans = false;
  size_t pos = 2;
  while (pos < v.n) {
    // Like libjpeg, skip garbage before a marker and any 0xFF fill bytes; FF00 (a stuffed byte
    // in entropy-coded data) and RSTn are skipped too, so one loop walks headers and scans.
    const void* ff = std::memchr(v.p + pos, 0xFF, v.n - pos);
    if (ff == nullptr) break;
    pos = size_t(static_cast<const uint8_t*>(ff) - v.p);
    while (pos < v.n && v.p[pos] == 0xFF) ++pos;
    if (pos >= v.n) break;
    uint8_t m = v.p[pos++];
    if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) continue;
    if (m == 0xD9) {
      ran_out = false;
      break;
    }
    if (!v.has(pos, 2)) break;
    size_t len = v.be16(pos);
    if (len < 2) {
      if (in_scans) break;  // after the first scan the decoder reports it
      return fail(r, ProbeStatus::Malformed, "JPEG segment length below 2");
    }
    size_t seg = pos + 2, seg_len = len - 2;
    pos = seg + seg_len;
    if (in_scans) {  // only scans count now; Pillow reads no marker after the first scan either
      if (m == 0xDA) ++r.scan_count;
      continue;
    }
    JpegEncoding enc = sof_encoding(m);
    if (enc != JpegEncoding::None) {
      if (!found_sof) {
        if (!v.has(seg, 6)) break;
        int ncomp = v.p[seg + 5];
        if (!v.has(seg, 6 + size_t(ncomp) * 3)) break;
        r.jpeg_encoding = enc;
        r.bit_depth = v.p[seg];
        r.height = v.be16(seg + 1);
        r.width = v.be16(seg + 3);
        r.components = ncomp;
        if (r.width == 0 || r.height == 0)
          return fail(r, ProbeStatus::Malformed, "JPEG frame has zero width or height");
        if (ncomp < 1 || ncomp > 4)
          return fail(r, ProbeStatus::Malformed, "JPEG frame has an unsupported component count");
        int hs[4], vs[4];
        for (int c = 0; c < ncomp; ++c) {
          uint8_t f = v.p[seg + 6 + size_t(c) * 3 + 1];
          hs[c] = f >> 4;
          vs[c] = f & 15;
          if (hs[c] < 1 || hs[c] > 4 || vs[c] < 1 || vs[c] > 4)
            return fail(r, ProbeStatus::Malformed, "JPEG sampling factor outside 1-4");
        }
        if (ncomp == 1) {
          r.chroma_subsampling = "gray";
        } else {
          bool same = true;
          for (int c = 2; c < ncomp; ++c) same = same && hs[c] == hs[1] && vs[c] == vs[1];
          r.chroma_subsampling = same ? subsampling_name(hs[0], vs[0], hs[1], vs[1]) : "other";
        }
        found_sof = true;
      }
    } else if (m == 0xDA) {
      if (!found_sof) return fail(r, ProbeStatus::Malformed, "JPEG scan before frame header");
      ran_out = false;
      r.scan_count = 1;
      const bool progressive =
          r.jpeg_encoding == JpegEncoding::Progressive || r.jpeg_encoding == JpegEncoding::ArithmeticProgressive;
      const bool all_components = v.has(seg, 1) && v.p[seg] == r.components;
      if (!progressive && all_components) break;  // one scan decodes the whole image
      in_scans = true;
    } else if (v.has(seg, seg_len)) {
      const uint8_t* s = v.p + seg;
      View sv{s, seg_len};
      if (m == 0xE1 && sv.has(0, 6) && std::memcmp(s, "Exif\0\0", 6) == 0) {
        if (!seen_exif) exif = tiff_orientation(s, seg_len);  // Pillow keeps the first EXIF block
        seen_exif = true;
      } else if (m == 0xE1 && sv.starts_with(0, "http://ns.adobe.com/xap/1.0/")) {
        xmp = xmp_orientation(s, seg_len);  // Pillow keeps the last XMP block
      } else if (m == 0xE2 && sv.starts_with(0, "ICC_PROFILE")) {
        r.has_icc = true;
      } else if (m == 0xEE && sv.starts_with(0, "Adobe")) {
        r.has_adobe = true;
        r.adobe_transform = seg_len >= 12 ? s[11] : -1;
      }
    }
  }
  if (!found_sof) {
    return fail(r, ran_out ? ProbeStatus::Truncated : ProbeStatus::Malformed, "JPEG has no frame header (SOF)");
  }
  r.orientation = final_orientation(exif, xmp);
  r.max_frame_width = r.width;
  r.max_frame_height = r.height;
  return r;
}

bool png_depth_valid(int ctype, int depth) {
  switch (ctype) {
    case 0: return depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16;
    case 3: return depth == 1 || depth == 2 || depth == 4 || depth == 8;
    case 2:
    case 4:
    case 6: return depth == 8 || depth == 16;
    default: return false;
  }
}

ProbeResult probe_png(View v) {
  ProbeResult r;
  r.format = ImageFormat::Png;
  if (!v.has(8, 25)) return fail(r, ProbeStatus::Truncated, "PNG ends inside IHDR");
  if (v.be32(8) != 13 || !v.starts_with(12, "IHDR"))
    return fail(r, ProbeStatus::Malformed, "PNG does not start with IHDR");
  r.width = v.be32(16);
  r.height = v.be32(20);
  r.bit_depth = v.p[24];
  r.png_color_type = v.p[25];
  int compression = v.p[26], filter = v.p[27], interlace = v.p[28];
  if (r.width == 0 || r.height == 0 || r.width > 0x7FFFFFFFu || r.height > 0x7FFFFFFFu)
    return fail(r, ProbeStatus::Malformed, "PNG width or height out of range");
  if (!png_depth_valid(r.png_color_type, r.bit_depth))
    return fail(r, ProbeStatus::Malformed, "PNG colour type and bit depth do not match");
  if (compression != 0) return fail(r, ProbeStatus::Malformed, "PNG compression method is not deflate");
  if (filter != 0 || interlace > 1) return fail(r, ProbeStatus::Malformed, "PNG filter or interlace method unknown");
  r.png_interlaced = interlace == 1;
  static const int kComponents[7] = {1, 0, 3, 3, 2, 0, 4};
  r.components = kComponents[r.png_color_type];
  r.has_alpha = r.png_color_type == 4 || r.png_color_type == 6;

  int exif = kNoOrientation, raw_exif = kNoOrientation, xmp = kNoOrientation;
  size_t pos = 33;
  for (int chunks = 0; chunks < (1 << 20) && v.has(pos, 8); ++chunks) {
    size_t len = v.be32(pos);
    if (len > 0x7FFFFFFFu) break;
    size_t data = pos + 8;
    if (!v.has(data, len)) break;  // truncated chunk: the decoder reports it
    const uint8_t* d = v.p + data;
    View dv{d, len};
    if (v.starts_with(pos + 4, "IEND")) break;
    if (v.starts_with(pos + 4, "tRNS")) {
      r.has_alpha = true;
    } else if (v.starts_with(pos + 4, "acTL") && len >= 8) {
      r.animated = true;
      r.frame_count = int(std::min<uint32_t>(dv.be32(0), 0x7FFFFFFF));
    } else if (v.starts_with(pos + 4, "iCCP")) {
      r.has_icc = true;
      const void* nul = std::memchr(d, 0, std::min<size_t>(len, 80));
      size_t method_at = nul ? size_t(static_cast<const uint8_t*>(nul) - d) + 1 : len;
      if (method_at >= len || d[method_at] != 0)
        return fail(r, ProbeStatus::Malformed, "PNG iCCP chunk has an unknown compression method");
    } else if (v.starts_with(pos + 4, "zTXt")) {
      r.png_compressed_text = true;
    } else if (v.starts_with(pos + 4, "iTXt")) {
      // keyword, NUL, compression flag, ...: a set flag means text that inflates
      const void* nul = std::memchr(d, 0, std::min<size_t>(len, 80));
      const size_t flag_at = nul ? size_t(static_cast<const uint8_t*>(nul) - d) + 1 : len;
      if (flag_at < len && d[flag_at] != 0) {
        r.png_compressed_text = true;
      } else if (flag_at == 18 && dv.has(0, 20) && std::memcmp(d, "XML:com.adobe.xmp", 17) == 0) {
        xmp = xmp_orientation(d + 18, len - 18);  // uncompressed XMP only
      }
    } else if (v.starts_with(pos + 4, "eXIf")) {
      exif = tiff_orientation(d, len);
    } else if (v.starts_with(pos + 4, "tEXt") && dv.has(0, 22) && std::memcmp(d, "Raw profile type exif\0", 22) == 0) {
      raw_exif = raw_profile_orientation(d + 22, len - 22);
    }
    pos = data + len + 4;  // skip CRC
  }
  r.orientation = final_orientation(exif != kNoOrientation ? exif : raw_exif, xmp);
  r.max_frame_width = r.width;
  r.max_frame_height = r.height;
  return r;
}

// Skips GIF data sub-blocks starting at pos; returns the position after the terminator.
size_t skip_gif_subblocks(View v, size_t pos) {
  while (pos < v.n) {
    size_t len = v.p[pos++];
    if (len == 0) return pos;
    pos += len;
  }
  return v.n + 1;
}

ProbeResult probe_gif(View v) {
  ProbeResult r;
  r.format = ImageFormat::Gif;
  if (!v.has(0, 13)) return fail(r, ProbeStatus::Truncated, "GIF ends inside the screen descriptor");
  r.width = v.le16(6);
  r.height = v.le16(8);
  if (r.width == 0 || r.height == 0) return fail(r, ProbeStatus::Malformed, "GIF screen has zero width or height");
  r.components = 3;
  r.bit_depth = 8;
  uint8_t packed = v.p[10];
  size_t pos = 13;
  if (packed & 0x80) pos += 3u << ((packed & 7) + 1);
  uint32_t max_w = r.width, max_h = r.height;
  int frames = 0;
  constexpr int kMaxCountedFrames = 1 << 16;
  bool counted_all = true;
  while (pos < v.n) {
    uint8_t b = v.p[pos++];
    if (b == 0x21) {  // extension
      if (pos >= v.n) break;
      uint8_t label = v.p[pos++];
      if (label == 0xF9 && v.has(pos, 2) && v.p[pos] >= 4 && (v.p[pos + 1] & 1)) r.has_alpha = true;
      pos = skip_gif_subblocks(v, pos);
    } else if (b == 0x2C) {  // image descriptor
      if (!v.has(pos, 9)) break;
      uint32_t left = v.le16(pos), top = v.le16(pos + 2), w = v.le16(pos + 4), h = v.le16(pos + 6);
      uint8_t ipacked = v.p[pos + 8];
      pos += 9;
      max_w = std::max(max_w, left + w);
      max_h = std::max(max_h, top + h);
      if (frames == 0) {  // like Pillow, the canvas grows to hold the first frame
        r.width = max_w;
        r.height = max_h;
      }
      if (ipacked & 0x80) pos += 3u << ((ipacked & 7) + 1);
      pos += 1;  // LZW minimum code size
      if (pos > v.n) break;
      pos = skip_gif_subblocks(v, pos);
      if (++frames >= kMaxCountedFrames) {
        counted_all = false;
        break;
      }
    } else {
      break;  // trailer (0x3B) or garbage
    }
  }
  if (frames == 0) return fail(r, ProbeStatus::Malformed, "GIF contains no image");
  r.frame_count = counted_all ? frames : -1;
  r.animated = frames > 1;
  r.max_frame_width = max_w;
  r.max_frame_height = max_h;
  return r;
}

ProbeResult probe_webp(View v) {
  ProbeResult r;
  r.format = ImageFormat::WebP;
  if (!v.has(12, 8)) return fail(r, ProbeStatus::Truncated, "WebP ends before its first chunk");
  size_t riff_end = std::min<size_t>(v.n, size_t(8) + v.le32(4));
  View rv{v.p, riff_end};
  size_t len = rv.has(16, 4) ? rv.le32(16) : 0;
  size_t data = 20;
  int exif = kNoOrientation, xmp = kNoOrientation;
  if (rv.starts_with(12, "VP8 ")) {
    r.webp_kind = "VP8";
    if (!rv.has(data, 10)) return fail(r, ProbeStatus::Truncated, "WebP VP8 frame header truncated");
    if ((rv.p[data] & 1) != 0 || rv.p[data + 3] != 0x9D || rv.p[data + 4] != 0x01 || rv.p[data + 5] != 0x2A)
      return fail(r, ProbeStatus::Malformed, "WebP VP8 key frame start code missing");
    r.width = rv.le16(data + 6) & 0x3FFF;
    r.height = rv.le16(data + 8) & 0x3FFF;
  } else if (rv.starts_with(12, "VP8L")) {
    r.webp_kind = "VP8L";
    if (!rv.has(data, 5)) return fail(r, ProbeStatus::Truncated, "WebP VP8L header truncated");
    if (rv.p[data] != 0x2F) return fail(r, ProbeStatus::Malformed, "WebP VP8L signature missing");
    uint32_t bits = rv.le32(data + 1);
    r.width = (bits & 0x3FFF) + 1;
    r.height = ((bits >> 14) & 0x3FFF) + 1;
    r.has_alpha = (bits >> 28) & 1;
  } else if (rv.starts_with(12, "VP8X")) {
    r.webp_kind = "VP8X";
    if (!rv.has(data, 10)) return fail(r, ProbeStatus::Truncated, "WebP VP8X header truncated");
    uint8_t flags = rv.p[data];
    r.width = rv.le24(data + 4) + 1;
    r.height = rv.le24(data + 7) + 1;
    r.animated = flags & 0x02;
    r.has_alpha = flags & 0x10;
    r.has_icc = flags & 0x20;
    int frames = 0;
    size_t pos = data + len + (len & 1);
    for (int chunks = 0; chunks < (1 << 20) && rv.has(pos, 8); ++chunks) {
      size_t clen = rv.le32(pos + 4);
      size_t cdata = pos + 8;
      if (!rv.has(cdata, clen)) break;
      if (rv.starts_with(pos, "EXIF")) {
        exif = tiff_orientation(rv.p + cdata, clen);
      } else if (rv.starts_with(pos, "XMP ")) {
        xmp = xmp_orientation(rv.p + cdata, clen);
      } else if (rv.starts_with(pos, "ANMF")) {
        ++frames;
      } else if (rv.starts_with(pos, "ALPH")) {
        r.has_alpha = true;
      }
      pos = cdata + clen + (clen & 1);
    }
    if (r.animated) r.frame_count = frames;
  } else {
    return fail(r, ProbeStatus::Malformed, "WebP first chunk is not VP8, VP8L or VP8X");
  }
  if (r.width == 0 || r.height == 0) return fail(r, ProbeStatus::Malformed, "WebP has zero width or height");
  r.components = r.has_alpha ? 4 : 3;
  r.bit_depth = 8;
  r.orientation = final_orientation(exif, xmp);
  r.max_frame_width = r.width;
  r.max_frame_height = r.height;
  return r;
}

}  // namespace

ProbeResult probe_image(const uint8_t* data, size_t size) {
  View v{data, size};
  if (v.has(0, 3) && v.p[0] == 0xFF && v.p[1] == 0xD8 && v.p[2] == 0xFF) return probe_jpeg(v);
  if (v.starts_with(0, "\x89PNG\r\n\x1a\n")) return probe_png(v);
  if (v.starts_with(0, "GIF87a") || v.starts_with(0, "GIF89a")) return probe_gif(v);
  if (v.starts_with(0, "RIFF") && v.starts_with(8, "WEBP")) return probe_webp(v);
  ProbeResult r;
  return fail(r, ProbeStatus::UnknownFormat, "not a JPEG, PNG, GIF or WebP image");
}

const char* format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::Jpeg: return "jpeg";
    case ImageFormat::Png: return "png";
    case ImageFormat::Gif: return "gif";
    case ImageFormat::WebP: return "webp";
    default: return "unknown";
  }
}

const char* jpeg_encoding_name(JpegEncoding e) {
  switch (e) {
    case JpegEncoding::Baseline: return "baseline";
    case JpegEncoding::ExtendedSequential: return "extended";
    case JpegEncoding::Progressive: return "progressive";
    case JpegEncoding::Lossless: return "lossless";
    case JpegEncoding::Hierarchical: return "hierarchical";
    case JpegEncoding::Arithmetic: return "arithmetic";
    case JpegEncoding::ArithmeticProgressive: return "arithmetic-progressive";
    case JpegEncoding::ArithmeticLossless: return "arithmetic-lossless";
    default: return "";
  }
}

}  // namespace lazymedia
