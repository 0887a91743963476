// Thin pybind11 layer over the plain C++ in csrc/. Statuses become Python values or exceptions
// here and nowhere else; work on buffers runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "host_ops.h"
#include "probe.h"

namespace py = pybind11;
using namespace lazymedia;

namespace {

const char* status_name(ProbeStatus s) {
  switch (s) {
    case ProbeStatus::Ok: return "ok";
    case ProbeStatus::UnknownFormat: return "unknown_format";
    case ProbeStatus::Truncated: return "truncated";
    default: return "malformed";
  }
}

py::dict probe(py::buffer data) {
  py::buffer_info info = data.request();
  if (info.ndim != 1 || info.itemsize != 1 || (info.ndim == 1 && info.strides[0] != 1))
    throw py::value_error("probe() takes a contiguous byte buffer");
  ProbeResult r;
  {
    py::gil_scoped_release release;
    r = probe_image(static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size));
  }
  py::dict d;
  d["status"] = status_name(r.status);
  d["error"] = r.error;
  d["format"] = format_name(r.format);
  d["width"] = r.width;
  d["height"] = r.height;
  d["components"] = r.components;
  d["bit_depth"] = r.bit_depth;
  d["has_alpha"] = r.has_alpha;
  d["orientation"] = r.orientation;
  d["has_icc"] = r.has_icc;
  d["jpeg_encoding"] = jpeg_encoding_name(r.jpeg_encoding);
  d["chroma_subsampling"] = r.chroma_subsampling;
  d["has_adobe"] = r.has_adobe;
  d["adobe_transform"] = r.adobe_transform;
  d["png_color_type"] = r.png_color_type;
  d["png_interlaced"] = r.png_interlaced;
  d["animated"] = r.animated;
  d["frame_count"] = r.frame_count;
  d["max_frame_width"] = r.max_frame_width;
  d["max_frame_height"] = r.max_frame_height;
  d["webp_kind"] = r.webp_kind;
  return d;
}

using U8Array = py::array_t<uint8_t, py::array::c_style>;

void orient(U8Array src, U8Array dst, int orientation) {
  if (src.ndim() != 3 || dst.ndim() != 3) throw py::value_error("orient() takes HWC arrays");
  const int h = int(src.shape(0)), w = int(src.shape(1)), c = int(src.shape(2));
  const bool swap = orientation >= 5 && orientation <= 8;
  if (dst.shape(0) != (swap ? w : h) || dst.shape(1) != (swap ? h : w) || dst.shape(2) != c)
    throw py::value_error("orient(): dst has the wrong shape for this orientation");
  if (!dst.writeable()) throw py::value_error("orient(): dst is read-only");
  const uint8_t* s = src.data();
  uint8_t* d = dst.mutable_data();
  if (s == d) throw py::value_error("orient(): src and dst must not alias");
  bool ok;
  {
    py::gil_scoped_release release;
    ok = orient_hwc(s, d, h, w, c, orientation);
  }
  if (!ok) throw py::value_error("orient(): orientation must be 1-8 and the image non-empty");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "lazymedia native core: header probe and shared pixel kernels (CPU build)";
  m.def("probe", &probe, py::arg("data"),
        "Parse an image header from encoded bytes; returns a dict whose 'status' is 'ok' or why not.");
  m.def("orient", &orient, py::arg("src"), py::arg("dst"), py::arg("orientation"),
        "Apply EXIF orientation 1-8 from an HWC uint8 array into dst.");
}
