// Thin pybind11 layer over the plain C++ in csrc/. Statuses become Python values or exceptions
// here and nowhere else; work on buffers runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include "host_buffer.h"
#include "host_ops.h"
#include "leased_map.h"
#include "level_gather.h"
#include "levels.h"
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

ProbeResult probe(py::buffer data) {
  py::buffer_info info = data.request();
  if (info.ndim != 1 || info.itemsize != 1 || info.strides[0] != 1)
    throw py::value_error("probe() takes a contiguous byte buffer");
  py::gil_scoped_release release;
  return probe_image(static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size));
}

using U8Array = py::array_t<uint8_t, py::array::c_style>;
using F32Array = py::array_t<float, py::array::c_style>;

void require(bool ok, const char* what) {
  if (!ok) throw py::value_error(what);
}

// Checks an HWC uint8 array and returns (h, w, c).
std::array<int, 3> hwc_shape(const U8Array& a, const char* name) {
  if (a.ndim() != 3) throw py::value_error(std::string(name) + " must be an HWC array");
  return {int(a.shape(0)), int(a.shape(1)), int(a.shape(2))};
}

void check_output(const py::array& dst, std::initializer_list<py::ssize_t> shape, const char* fn) {
  if (!dst.writeable()) throw py::value_error(std::string(fn) + ": dst is read-only");
  if (size_t(dst.ndim()) != shape.size() || !std::equal(shape.begin(), shape.end(), dst.shape()))
    throw py::value_error(std::string(fn) + ": dst has the wrong shape");
}

void orient(U8Array src, U8Array dst, int orientation, int threads) {
  auto [h, w, c] = hwc_shape(src, "src");
  const bool swap = orientation >= 5 && orientation <= 8;
  check_output(dst, {swap ? w : h, swap ? h : w, c}, "orient()");
  require(src.data() != dst.data(), "orient(): src and dst must not alias");
  bool ok;
  {
    py::gil_scoped_release release;
    ok = orient_hwc(src.data(), dst.mutable_data(), h, w, c, orientation, threads);
  }
  require(ok, "orient(): orientation must be 1-8 and the image 1-4 channels, non-empty");
}

void resize(U8Array src, U8Array dst, const std::string& filter, int threads) {
  auto [h, w, c] = hwc_shape(src, "src");
  if (dst.ndim() != 3 || dst.shape(2) != c) throw py::value_error("resize(): dst must be HWC with src's channels");
  check_output(dst, {dst.shape(0), dst.shape(1), c}, "resize()");
  kernels::Filter f;
  if (filter == "bilinear") {
    f = kernels::Filter::Bilinear;
  } else if (filter == "bicubic") {
    f = kernels::Filter::Bicubic;
  } else {
    throw py::value_error("resize(): filter must be 'bilinear' or 'bicubic'");
  }
  const int oh = int(dst.shape(0)), ow = int(dst.shape(1));
  bool ok;
  {
    py::gil_scoped_release release;
    ok = resize_hwc(src.data(), h, w, c, dst.mutable_data(), oh, ow, f, threads);
  }
  require(ok, "resize(): sizes must be positive and the image 1-4 channels");
}

kernels::Matrix matrix_of(const std::string& name) {
  if (name == "bt601") return kernels::Matrix::BT601;
  if (name == "bt709") return kernels::Matrix::BT709;
  throw py::value_error("matrix must be 'bt601' or 'bt709'");
}

// y: (h, y_stride) plane; uv: (ceil(h/2), uv_stride) interleaved plane.
void nv12_to_rgb_py(U8Array y, U8Array uv, U8Array dst, int width, const std::string& matrix, bool full_range,
                    int threads) {
  require(y.ndim() == 2 && uv.ndim() == 2, "nv12_to_rgb(): planes must be 2-D");
  const int h = int(y.shape(0));
  require(width > 0 && y.shape(1) >= width && uv.shape(0) >= (h + 1) / 2, "nv12_to_rgb(): plane sizes do not fit");
  check_output(dst, {h, width, 3}, "nv12_to_rgb()");
  const kernels::Matrix m = matrix_of(matrix);
  bool ok;
  {
    py::gil_scoped_release release;
    ok = nv12_to_rgb(y.data(), int(y.shape(1)), uv.data(), int(uv.shape(1)), h, width, dst.mutable_data(), m,
                     full_range, threads);
  }
  require(ok, "nv12_to_rgb(): plane strides too small for the width");
}

void i420_to_rgb_py(U8Array y, U8Array u, U8Array v, U8Array dst, int width, const std::string& matrix, bool full_range,
                    int threads) {
  require(y.ndim() == 2 && u.ndim() == 2 && v.ndim() == 2, "i420_to_rgb(): planes must be 2-D");
  const int h = int(y.shape(0));
  require(u.shape(0) == v.shape(0) && u.shape(1) == v.shape(1), "i420_to_rgb(): U and V planes differ in size");
  require(width > 0 && y.shape(1) >= width && u.shape(0) >= (h + 1) / 2, "i420_to_rgb(): plane sizes do not fit");
  check_output(dst, {h, width, 3}, "i420_to_rgb()");
  const kernels::Matrix m = matrix_of(matrix);
  bool ok;
  {
    py::gil_scoped_release release;
    ok = i420_to_rgb(y.data(), int(y.shape(1)), u.data(), v.data(), int(u.shape(1)), h, width, dst.mutable_data(), m,
                     full_range, threads);
  }
  require(ok, "i420_to_rgb(): plane strides too small for the width");
}

void to_chw_normalized(U8Array src, F32Array dst, F32Array mean, F32Array std_dev, int threads) {
  auto [h, w, c] = hwc_shape(src, "src");
  require(mean.size() == c && std_dev.size() == c, "to_chw_normalized(): mean and std need one value per channel");
  check_output(dst, {c, h, w}, "to_chw_normalized()");
  bool ok;
  {
    py::gil_scoped_release release;
    ok = hwc_to_chw_normalized(src.data(), h, w, c, mean.data(), std_dev.data(), dst.mutable_data(), threads);
  }
  require(ok, "to_chw_normalized(): std must be non-zero and the image 1-4 channels");
}

void to_chw(U8Array src, U8Array dst, int threads) {
  auto [h, w, c] = hwc_shape(src, "src");
  check_output(dst, {c, h, w}, "to_chw()");
  bool ok;
  {
    py::gil_scoped_release release;
    ok = hwc_to_chw(src.data(), h, w, c, dst.mutable_data(), threads);
  }
  require(ok, "to_chw(): the image must have 1-4 channels");
}

void to_hwc(U8Array src, U8Array dst, int threads) {
  require(src.ndim() == 3, "to_hwc(): src must be CHW");
  const int c = int(src.shape(0)), h = int(src.shape(1)), w = int(src.shape(2));
  check_output(dst, {h, w, c}, "to_hwc()");
  bool ok;
  {
    py::gil_scoped_release release;
    ok = chw_to_hwc(src.data(), h, w, c, dst.mutable_data(), threads);
  }
  require(ok, "to_hwc(): the image must have 1-4 channels");
}

// A writable, contiguous byte buffer of at least `bytes` bytes (in-place operations convert nothing).
uint8_t* writable_bytes(py::buffer buffer, size_t bytes, const char* fn) {
  py::buffer_info info = buffer.request(true);
  require(!info.readonly, fn);
  bool contiguous = info.itemsize == 1;
  py::ssize_t expected = 1;
  for (py::ssize_t d = info.ndim - 1; d >= 0 && contiguous; --d) {
    contiguous = info.strides[size_t(d)] == expected;
    expected *= info.shape[size_t(d)];
  }
  require(contiguous, fn);
  require(size_t(info.size) >= bytes, fn);
  return static_cast<uint8_t*>(info.ptr);
}

void pack_alpha(py::buffer buffer, size_t pixels, int channels, std::optional<std::array<uint8_t, 3>> background) {
  uint8_t* data = writable_bytes(buffer, pixels * size_t(std::max(channels, 0)),
                                 "pack_alpha(): needs a writable contiguous uint8 buffer of pixels x channels");
  bool ok;
  {
    py::gil_scoped_release release;
    ok = pack_alpha_in_place(data, pixels, channels, background ? background->data() : nullptr);
  }
  require(ok, "pack_alpha(): channels must be 2 (gray+alpha) or 4 (RGB+alpha)");
}

void gray_to_rgb(py::buffer buffer, size_t pixels) {
  uint8_t* data = writable_bytes(buffer, 3 * pixels, "gray_to_rgb(): needs a writable contiguous buffer of 3 x pixels");
  py::gil_scoped_release release;
  gray_to_rgb_in_place(data, pixels);
}

// A 1-d contiguous, aligned buffer of elements of 1, 2, 4 or 8 bytes (numpy arrays of uint8-uint64).
struct Flat {
  void* data;
  size_t size;
  size_t itemsize;
};

Flat flat(const py::buffer& buffer, bool writable, const char* fn) {
  py::buffer_info info = buffer.request(writable);
  require(!writable || !info.readonly, fn);
  require(info.ndim == 1 && (info.size <= 1 || info.strides[0] == info.itemsize), fn);
  require(info.itemsize == 1 || info.itemsize == 2 || info.itemsize == 4 || info.itemsize == 8, fn);
  require(reinterpret_cast<uintptr_t>(info.ptr) % size_t(info.itemsize) == 0, fn);  // read as its type: aligned
  return {info.ptr, size_t(info.size), size_t(info.itemsize)};
}

// Calls fn(E{}, C{}) for the element type E (2, 4, 8 bytes) and code type C (1, 2 bytes).
template <typename Fn>
bool with_level_types(size_t element, size_t code, const char* fn_name, Fn fn) {
  auto codes = [&](auto e) {
    if (code == 1) return fn(e, uint8_t{});
    require(code == 2, fn_name);
    return fn(e, uint16_t{});
  };
  if (element == 2) return codes(uint16_t{});
  if (element == 4) return codes(uint32_t{});
  require(element == 8, fn_name);
  return codes(uint64_t{});
}

// Codes src's bit patterns (with `half`: each block's first half, where every block of 2 * half
// repeats it); the tables' counts per group, or None when a group has more than `levels` patterns
// or (with half) a block's halves differ.
std::optional<std::vector<size_t>> level_encode_py(py::buffer src, size_t run, size_t groups, size_t levels,
                                                   py::buffer codes, py::buffer tables, int threads, bool vectorise,
                                                   size_t half) {
  const char* fn =
      "level_encode(): src, codes and tables must be 1-d contiguous, codes as many as src (half as many with "
      "half), tables groups x levels of src's type, src and run multiples of 2 * half";
  Flat s = flat(src, false, fn), c = flat(codes, true, fn), t = flat(tables, true, fn);
  require((half > 0 ? 2 * c.size : c.size) == s.size && t.itemsize == s.itemsize && groups > 0 && levels > 0 &&
              levels <= (size_t(1) << (8 * c.itemsize)) && groups <= t.size / levels && groups * levels == t.size &&
              (half == 0 || (half <= s.size && s.size % (2 * half) == 0 && run % (2 * half) == 0)),
          fn);
  std::vector<size_t> counts(groups);
  bool ok = with_level_types(s.itemsize, c.itemsize, fn, [&](auto e, auto k) {
    using E = decltype(e);
    using C = decltype(k);
    py::gil_scoped_release release;
    return level_encode(static_cast<const E*>(s.data), s.size, run, groups, levels, static_cast<C*>(c.data),
                        static_cast<E*>(t.data), counts.data(), threads, vectorise, half);
  });
  if (!ok) return std::nullopt;
  return counts;
}

// dst = the tables gathered by the codes (each block's first `half` repeated, where half > 0);
// False when a code is past its table (a corrupt value).
bool level_decode_py(py::buffer codes, size_t run, size_t groups, py::buffer tables, py::buffer dst, int threads,
                     bool vectorise, size_t half) {
  const char* fn =
      "level_decode(): codes, tables and dst must be 1-d contiguous, dst as many as codes (twice as many "
      "with half) and of the tables' type, tables a multiple of groups, run a multiple of 2 * half and "
      "the codes of half";
  Flat c = flat(codes, false, fn), t = flat(tables, false, fn), d = flat(dst, true, fn);
  require(d.size == (half > 0 ? 2 : 1) * c.size && d.itemsize == t.itemsize && groups > 0 && t.size % groups == 0 &&
              t.size > 0 && (half == 0 || (half <= c.size && c.size % half == 0 && run % (2 * half) == 0)),
          fn);
  return with_level_types(t.itemsize, c.itemsize, fn, [&](auto e, auto k) {
    using E = decltype(e);
    using C = decltype(k);
    py::gil_scoped_release release;
    return level_decode(static_cast<const C*>(c.data), c.size, run, groups, static_cast<const E*>(t.data),
                        t.size / groups, static_cast<E*>(d.data), threads, vectorise, half);
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "lazymedia native core: header probe, shared pixel kernels, the level coder, host buffers (CPU build)";
  // Fields are read lazily from the copied struct, so a probe costs one small object.
  py::class_<ProbeResult>(m, "ProbeResult")
      .def_property_readonly("status", [](const ProbeResult& r) { return status_name(r.status); })
      .def_property_readonly("error", [](const ProbeResult& r) { return r.error; })
      .def_property_readonly("format", [](const ProbeResult& r) { return format_name(r.format); })
      .def_readonly("width", &ProbeResult::width)
      .def_readonly("height", &ProbeResult::height)
      .def_readonly("components", &ProbeResult::components)
      .def_readonly("bit_depth", &ProbeResult::bit_depth)
      .def_readonly("has_alpha", &ProbeResult::has_alpha)
      .def_readonly("orientation", &ProbeResult::orientation)
      .def_readonly("has_icc", &ProbeResult::has_icc)
      .def_property_readonly("jpeg_encoding", [](const ProbeResult& r) { return jpeg_encoding_name(r.jpeg_encoding); })
      .def_property_readonly("chroma_subsampling", [](const ProbeResult& r) { return r.chroma_subsampling; })
      .def_readonly("has_adobe", &ProbeResult::has_adobe)
      .def_readonly("adobe_transform", &ProbeResult::adobe_transform)
      .def_readonly("scan_count", &ProbeResult::scan_count)
      .def_readonly("png_color_type", &ProbeResult::png_color_type)
      .def_readonly("png_interlaced", &ProbeResult::png_interlaced)
      .def_readonly("png_compressed_text", &ProbeResult::png_compressed_text)
      .def_readonly("animated", &ProbeResult::animated)
      .def_readonly("frame_count", &ProbeResult::frame_count)
      .def_readonly("max_frame_width", &ProbeResult::max_frame_width)
      .def_readonly("max_frame_height", &ProbeResult::max_frame_height)
      .def_property_readonly("webp_kind", [](const ProbeResult& r) { return r.webp_kind; });
  m.def("probe", &probe, py::arg("data"), "Parse an image header from encoded bytes; .status is 'ok' or says why not.");
  m.def("orient", &orient, py::arg("src"), py::arg("dst"), py::arg("orientation"), py::arg("threads") = 1,
        "Apply EXIF orientation 1-8 from an HWC uint8 array into dst.");
  m.def("resize", &resize, py::arg("src"), py::arg("dst"), py::arg("filter") = "bicubic", py::arg("threads") = 1,
        "Antialiased resize of an HWC uint8 array to dst's height and width (Pillow's algorithm).");
  m.def("nv12_to_rgb", &nv12_to_rgb_py, py::arg("y"), py::arg("uv"), py::arg("dst"), py::arg("width"),
        py::arg("matrix") = "bt709", py::arg("full_range") = false, py::arg("threads") = 1);
  m.def("i420_to_rgb", &i420_to_rgb_py, py::arg("y"), py::arg("u"), py::arg("v"), py::arg("dst"), py::arg("width"),
        py::arg("matrix") = "bt709", py::arg("full_range") = false, py::arg("threads") = 1);
  m.def("to_chw_normalized", &to_chw_normalized, py::arg("src"), py::arg("dst"), py::arg("mean"), py::arg("std"),
        py::arg("threads") = 1);
  m.def("to_chw", &to_chw, py::arg("src"), py::arg("dst"), py::arg("threads") = 1);
  m.def("pack_alpha", &pack_alpha, py::arg("buffer"), py::arg("pixels"), py::arg("channels"),
        py::arg("background") = py::none(),
        "In place: pixels x channels (2 or 4) -> pixels x (channels - 1), composited over background "
        "(Pillow's masked paste, bit for bit) or with the alpha dropped.");
  m.def("gray_to_rgb", &gray_to_rgb, py::arg("buffer"), py::arg("pixels"),
        "In place: the first `pixels` gray bytes of buffer -> pixels x 3 RGB.");
  m.def("level_encode", &level_encode_py, py::arg("src"), py::arg("run"), py::arg("groups"), py::arg("levels"),
        py::arg("codes"), py::arg("tables"), py::arg("threads") = 1, py::arg("vectorise") = true, py::arg("half") = 0,
        "Level-codes src's bit patterns per group ((i // run) % groups; half > 0: each block's first half, the "
        "blocks repeating it): counts per group, or None past `levels` or where a block's halves differ");
  m.def("level_decode", &level_decode_py, py::arg("codes"), py::arg("run"), py::arg("groups"), py::arg("tables"),
        py::arg("dst"), py::arg("threads") = 1, py::arg("vectorise") = true, py::arg("half") = 0,
        "dst = tables gathered by the codes (half > 0: each block's first half repeated); False for a code past "
        "its table");
  m.def("level_gather_vectorised", &level_gather_vectorised,
        "Whether the level coder's vectorised forms (uint8 codes, AVX-512 VBMI) run on this CPU");
  m.def("to_hwc", &to_hwc, py::arg("src"), py::arg("dst"), py::arg("threads") = 1);

  py::class_<HostBuffer, std::shared_ptr<HostBuffer>>(m, "HostBuffer", py::buffer_protocol())
      .def_property_readonly("nbytes", &HostBuffer::size)
      .def_property_readonly("pinned", &HostBuffer::pinned)
      .def_buffer([](HostBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1, {py::ssize_t(b.size())},
                               {py::ssize_t(1)}, /*readonly=*/false);
      });
  py::class_<LeasedMap, std::shared_ptr<LeasedMap>>(m, "LeasedMap", py::buffer_protocol())
      .def_static(
          "lease",
          [](int fd) {
            std::string reason;
            std::shared_ptr<LeasedMap> map;
            {
              py::gil_scoped_release release;
              map = LeasedMap::lease(fd, &reason);
            }
            return py::make_tuple(map ? py::cast(map) : py::none(), reason);
          },
          py::arg("fd"),
          "(map, reason): the file open at fd, leased and mapped privately; (None, why) where it cannot be.")
      .def_property_readonly("nbytes", &LeasedMap::size)
      .def_buffer([](LeasedMap& map) {
        return py::buffer_info(map.data(), 1, py::format_descriptor<uint8_t>::format(), 1, {py::ssize_t(map.size())},
                               {py::ssize_t(1)}, /*readonly=*/false);
      });
  m.def("leased_map_stats", [] {
    LeasedMapStats stats = leased_map_stats();
    py::dict d;
    d["live"] = stats.live;
    d["copied"] = stats.copied;
    d["failed"] = stats.failed;
    return d;
  });
  py::class_<HostBufferPool, std::shared_ptr<HostBufferPool>>(m, "HostBufferPool")
      .def(py::init([](size_t max_cached_bytes, bool pinned) {
             return std::make_shared<HostBufferPool>(max_cached_bytes, pinned);
           }),
           py::arg("max_cached_bytes"), py::arg("pinned"))
      .def_property_readonly("pinned", &HostBufferPool::pinned)
      .def(
          "acquire",
          [](HostBufferPool& pool, size_t nbytes) {
            std::shared_ptr<HostBuffer> b;
            {
              py::gil_scoped_release release;
              b = pool.acquire(nbytes);
            }
            if (!b) throw std::bad_alloc();
            return b;
          },
          py::arg("nbytes"))
      .def("stats",
           [](HostBufferPool& pool) {
             HostBufferStats s = pool.stats();
             py::dict d;
             d["allocations"] = s.allocations;
             d["reuses"] = s.reuses;
             d["cached_bytes"] = s.cached_bytes;
             d["cached_buffers"] = s.cached_buffers;
             d["leased_bytes"] = s.leased_bytes;
             d["leased_buffers"] = s.leased_buffers;
             d["released_bytes"] = s.released_bytes;
             return d;
           })
      .def(
          "release_idle",
          [](HostBufferPool& pool, double idle_seconds) {
            py::gil_scoped_release release;
            return pool.release_idle(idle_seconds);
          },
          py::arg("idle_seconds"), "Frees the cached buffers returned more than idle_seconds ago; the bytes freed.");
  m.def(
      "pinned_memory_available",
      [] {
        std::string reason;
        bool ok = pinned_memory_available(&reason);
        return py::make_tuple(ok, reason);
      },
      "(available, reason): whether page-locked host memory can be allocated here.");
}
