// pybind11 layer of lazymedia._C_cuda: the GPU kernels and the nvJPEG decoder over raw device
// pointers and stream handles (torch tensors' data_ptr() / cuda_stream), so the extension needs
// no libtorch. CUDA and nvJPEG failures become RuntimeError / ValueError with the reason.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../host_ops.h"
#include "device_ops.h"
#include "nvjpeg_decoder.h"

namespace py = pybind11;
using namespace lazymedia;

namespace {

#ifndef LAZYMEDIA_CUDA_ARCHES
#define LAZYMEDIA_CUDA_ARCHES "unknown"
#endif

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

cudaStream_t stream_of(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

void check(cudaError_t status, const char* what) {
  if (status == cudaErrorInvalidValue) throw py::value_error(std::string(what) + ": invalid arguments");
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

py::tuple device_count() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return py::make_tuple(0, std::string(cudaGetErrorString(status)));
  return py::make_tuple(count, std::string(""));
}

// Makes the device that owns `address` current for the scope (kernels launch on the current
// device; the calling thread's may be another), restoring the previous one after.
class PointerDeviceGuard {
 public:
  explicit PointerDeviceGuard(uintptr_t address) {
    cudaPointerAttributes attributes{};
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    check(cudaPointerGetAttributes(&attributes, reinterpret_cast<const void*>(address)), "cudaPointerGetAttributes");
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
      throw py::value_error("expected device memory");
    check(cudaSetDevice(attributes.device), "cudaSetDevice");
  }
  ~PointerDeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// Device copies of a resample plan's arrays, freed on the stream when done.
struct DevicePlan {
  int* bounds = nullptr;
  int* weights = nullptr;
  cudaStream_t stream;
  DevicePlan(const ResamplePlan& plan, cudaStream_t s) : stream(s) {
    try {
      check(cudaMallocAsync(reinterpret_cast<void**>(&bounds), plan.bounds.size() * sizeof(int), s), "cudaMallocAsync");
      check(cudaMallocAsync(reinterpret_cast<void**>(&weights), plan.weights.size() * sizeof(int), s),
            "cudaMallocAsync");
      // From pageable memory cudaMemcpyAsync has staged the source before it returns.
      check(cudaMemcpyAsync(bounds, plan.bounds.data(), plan.bounds.size() * sizeof(int), cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync");
      check(cudaMemcpyAsync(weights, plan.weights.data(), plan.weights.size() * sizeof(int), cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync");
    } catch (...) {  // a constructor that throws runs no destructor: free what was allocated
      free();
      throw;
    }
  }
  ~DevicePlan() { free(); }
  void free() {
    if (bounds) cudaFreeAsync(bounds, stream);
    if (weights) cudaFreeAsync(weights, stream);
    bounds = weights = nullptr;
  }
  kernels::AxisCoeffs view(int ksize) const { return {ksize, bounds, weights}; }
};

void py_resize(uintptr_t src, int h, int w, int c, uintptr_t dst, int oh, int ow, const std::string& filter,
               uintptr_t stream_handle) {
  if (filter != "bilinear" && filter != "bicubic") throw py::value_error("filter must be 'bilinear' or 'bicubic'");
  if (h <= 0 || w <= 0 || oh <= 0 || ow <= 0 || c <= 0 || c > 4) throw py::value_error("resize: bad sizes");
  const kernels::Filter f = filter == "bicubic" ? kernels::Filter::Bicubic : kernels::Filter::Bilinear;
  cudaStream_t stream = stream_of(stream_handle);
  py::gil_scoped_release release;
  PointerDeviceGuard device(src);
  if (oh == h && ow == w) {
    check(cudaMemcpyAsync(ptr<uint8_t>(dst), ptr<uint8_t>(src), size_t(h) * w * c, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
    return;
  }
  const ResamplePlan hplan = make_resample_plan(w, ow, f), vplan = make_resample_plan(h, oh, f);
  if (oh == h) {
    DevicePlan hp(hplan, stream);
    check(cuda::launch_resample_horizontal(ptr<uint8_t>(src), h, w, c, 0, hp.view(hplan.ksize), ow, ptr<uint8_t>(dst),
                                           stream),
          "resize");
    return;
  }
  DevicePlan vp(vplan, stream);
  if (ow == w) {
    check(
        cuda::launch_resample_vertical(ptr<uint8_t>(src), w, c, 0, vp.view(vplan.ksize), oh, ptr<uint8_t>(dst), stream),
        "resize");
    return;
  }
  DevicePlan hp(hplan, stream);
  void* temp = nullptr;
  if (resample_vertical_first(h, w, oh, ow)) {  // the CPU driver's pass order, Pillow's rounding
    check(cudaMallocAsync(&temp, size_t(oh) * w * c, stream), "cudaMallocAsync");
    cudaError_t status = cuda::launch_resample_vertical(ptr<uint8_t>(src), w, c, 0, vp.view(vplan.ksize), oh,
                                                        static_cast<uint8_t*>(temp), stream);
    if (status == cudaSuccess)
      status = cuda::launch_resample_horizontal(static_cast<uint8_t*>(temp), oh, w, c, 0, hp.view(hplan.ksize), ow,
                                                ptr<uint8_t>(dst), stream);
    cudaFreeAsync(temp, stream);
    check(status, "resize");
    return;
  }
  // Horizontal over only the rows the vertical pass reads, then vertical.
  const int first = vplan.bounds[0], last = vplan.bounds[2 * (oh - 1)] + vplan.bounds[2 * (oh - 1) + 1];
  check(cudaMallocAsync(&temp, size_t(last - first) * ow * c, stream), "cudaMallocAsync");
  cudaError_t status = cuda::launch_resample_horizontal(ptr<uint8_t>(src), last - first, w, c, first,
                                                        hp.view(hplan.ksize), ow, static_cast<uint8_t*>(temp), stream);
  if (status == cudaSuccess)
    status = cuda::launch_resample_vertical(static_cast<uint8_t*>(temp), ow, c, first, vp.view(vplan.ksize), oh,
                                            ptr<uint8_t>(dst), stream);
  cudaFreeAsync(temp, stream);
  check(status, "resize");
}

void py_orient(uintptr_t src, uintptr_t dst, int h, int w, int c, int orientation, uintptr_t stream) {
  py::gil_scoped_release release;
  PointerDeviceGuard device(src);
  check(cuda::launch_orient(ptr<uint8_t>(src), ptr<uint8_t>(dst), h, w, c, orientation, stream_of(stream)), "orient");
}

void py_nv12_to_rgb(uintptr_t src, long long frame_bytes, long long uv_offset, int pitch, int frames, int h, int w,
                    uintptr_t dst, const std::string& matrix, bool full_range, uintptr_t stream) {
  if (matrix != "bt601" && matrix != "bt709") throw py::value_error("matrix must be 'bt601' or 'bt709'");
  const auto coeffs =
      kernels::make_yuv_to_rgb(matrix == "bt709" ? kernels::Matrix::BT709 : kernels::Matrix::BT601, full_range);
  py::gil_scoped_release release;
  PointerDeviceGuard device(src);
  check(cuda::launch_nv12_to_rgb(ptr<uint8_t>(src), frame_bytes, uv_offset, pitch, frames, h, w, ptr<uint8_t>(dst),
                                 coeffs, stream_of(stream)),
        "nv12_to_rgb");
}

void py_to_chw_normalized(uintptr_t src, int h, int w, int c, std::vector<float> mean, std::vector<float> std_dev,
                          uintptr_t dst, uintptr_t stream) {
  if (c < 1 || c > 4 || int(mean.size()) != c || int(std_dev.size()) != c)
    throw py::value_error("mean and std need one value per channel (1-4)");
  cuda::Normalization norm{};
  for (int k = 0; k < c; ++k) {
    if (std_dev[k] == 0.0f) throw py::value_error("std must be non-zero");
    norm.mean[k] = mean[k];
    norm.inv_std[k] = 1.0f / std_dev[k];
  }
  py::gil_scoped_release release;
  PointerDeviceGuard device(src);
  check(cuda::launch_to_chw_normalized(ptr<uint8_t>(src), h, w, c, norm, ptr<float>(dst), stream_of(stream)),
        "to_chw_normalized");
}

// items: (encoded bytes, coded width, coded height, orientation, output device pointer).
// Returns one (decoded, fallback_reason, path) per item; path is "hardware", "cuda" or "".
std::vector<std::tuple<bool, std::string, std::string>> decode_jpegs(cuda::NvjpegDecoder& decoder, py::list items,
                                                                     uintptr_t consumer_stream) {
  std::vector<cuda::JpegRequest> requests;
  std::vector<py::buffer_info> keep;  // the buffers stay valid while the GIL is released
  requests.reserve(items.size());
  keep.reserve(items.size());
  for (py::handle item : items) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 5) throw py::value_error("decode items are (data, width, height, orientation, out_ptr)");
    keep.push_back(py::reinterpret_borrow<py::buffer>(t[0]).request());
    const py::buffer_info& info = keep.back();
    if (info.ndim != 1 || info.itemsize != 1 || (info.size > 1 && info.strides[0] != 1))
      throw py::value_error("JPEG data must be a contiguous byte buffer");
    requests.push_back({static_cast<const uint8_t*>(info.ptr), size_t(info.size), t[1].cast<int>(), t[2].cast<int>(),
                        t[3].cast<int>(), ptr<uint8_t>(t[4].cast<uintptr_t>())});
  }
  std::vector<cuda::JpegResult> results;
  {
    py::gil_scoped_release release;
    results = decoder.decode(requests, stream_of(consumer_stream));
  }
  std::vector<std::tuple<bool, std::string, std::string>> out;
  out.reserve(results.size());
  for (const auto& r : results)
    out.emplace_back(r.outcome == cuda::JpegOutcome::Decoded, r.reason,
                     r.path == cuda::JpegPath::Hardware ? "hardware"
                     : r.path == cuda::JpegPath::Cuda   ? "cuda"
                                                        : "");
  return out;
}

// NvjpegOptions from keyword arguments (bench_gpu.py --grid); an unknown knob is a ValueError.
cuda::NvjpegOptions nvjpeg_options(const py::dict& given) {
  cuda::NvjpegOptions o;
  for (auto item : given) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (key == "interpolation")
      o.interpolation = v.cast<bool>();
    else if (key == "planar")
      o.planar = v.cast<bool>();
    else if (key == "preallocate_batch")
      o.preallocate_batch = v.cast<int>();
    else if (key == "preallocate_height")
      o.preallocate_height = v.cast<int>();
    else if (key == "preallocate_width")
      o.preallocate_width = v.cast<int>();
    else if (key == "pool_threshold")
      o.pool_threshold = v.cast<uint64_t>();
    else if (key == "full_parse")
      o.full_parse = v.cast<bool>();
    else if (key == "pinned_staging")
      o.pinned_staging = v.cast<bool>();
    else if (key == "hardware_load")
      o.hardware_load = v.cast<double>();
    else if (key == "cuda_workers")
      o.cuda_workers = v.cast<int>();
    else if (key == "gpu_hybrid_pixels")
      o.gpu_hybrid_pixels = v.cast<long long>();
    else
      throw py::value_error("unknown nvJPEG option: " + key);
  }
  if (o.hardware_load > 1) throw py::value_error("hardware_load must be in [0, 1], or negative for adaptive");
  return o;
}

py::dict nvjpeg_stats(cuda::NvjpegDecoder& decoder) {
  const cuda::NvjpegStats s = decoder.stats();
  py::dict d;
  d["prepare_us"] = s.prepare_us, d["stage_us"] = s.stage_us, d["hardware_submit_us"] = s.hardware_submit_us;
  d["hardware_ms"] = s.hardware_ms, d["cuda_ms"] = s.cuda_ms, d["total_us"] = s.total_us;
  d["hardware_items"] = s.hardware_items, d["cuda_items"] = s.cuda_items, d["gpu_hybrid_items"] = s.gpu_hybrid_items;
  d["size_class"] = s.size_class, d["load"] = s.load;
  d["device_mallocs"] = s.device_mallocs, d["device_frees"] = s.device_frees;
  d["device_malloc_bytes"] = s.device_malloc_bytes, d["staged_bytes"] = s.staged_bytes;
  return d;
}

std::string version_text(int version) {  // CUDA's 1000 * major + 10 * minor
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// The versions `lazymedia info` reports: libnvjpeg's own and the cudart it was built with, this
// extension's (static) cudart, and what the driver supports; a part that cannot be read says why.
py::dict versions(const std::string& library_path) {
  py::dict out;
  int runtime = 0, driver = 0;
  out["cudart_static"] = cudaRuntimeGetVersion(&runtime) == cudaSuccess ? version_text(runtime) : "unknown";
  cudaError_t status = cudaDriverGetVersion(&driver);
  out["driver_cuda"] = status == cudaSuccess && driver ? version_text(driver) : "no driver";
  std::string error;
  const cuda::NvjpegApi* api = cuda::load_nvjpeg(library_path, &error);
  if (!api) {
    out["nvjpeg"] = error;
    return out;
  }
  auto property = [](decltype(api->GetProperty) get, libraryPropertyType type) {
    int value = -1;
    return get(type, &value) == NVJPEG_STATUS_SUCCESS ? std::to_string(value) : std::string("?");
  };
  out["nvjpeg"] = property(api->GetProperty, MAJOR_VERSION) + "." + property(api->GetProperty, MINOR_VERSION) + "." +
                  property(api->GetProperty, PATCH_LEVEL);
  out["nvjpeg_built_with_cudart"] =
      property(api->GetCudartProperty, MAJOR_VERSION) + "." + property(api->GetCudartProperty, MINOR_VERSION);
  return out;
}

}  // namespace

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "lazymedia CUDA part: shared pixel kernels on the GPU and the batched nvJPEG decoder";
  m.def("arches", [] { return std::string(LAZYMEDIA_CUDA_ARCHES); }, "Architectures this module was compiled for.");
  m.def("device_count", &device_count, "(count, error): CUDA devices visible, or 0 and why.");
  m.def("versions", &versions, py::arg("library_path") = "",
        "nvJPEG, the cudart it was built with, this module's cudart and the driver's CUDA version.");
  m.def("resize", &py_resize, py::arg("src"), py::arg("h"), py::arg("w"), py::arg("c"), py::arg("dst"), py::arg("oh"),
        py::arg("ow"), py::arg("filter"), py::arg("stream"));
  m.def("orient", &py_orient, py::arg("src"), py::arg("dst"), py::arg("h"), py::arg("w"), py::arg("c"),
        py::arg("orientation"), py::arg("stream"));
  m.def("nv12_to_rgb", &py_nv12_to_rgb, py::arg("src"), py::arg("frame_bytes"), py::arg("uv_offset"), py::arg("pitch"),
        py::arg("frames"), py::arg("h"), py::arg("w"), py::arg("dst"), py::arg("matrix"), py::arg("full_range"),
        py::arg("stream"));
  m.def("to_chw_normalized", &py_to_chw_normalized, py::arg("src"), py::arg("h"), py::arg("w"), py::arg("c"),
        py::arg("mean"), py::arg("std"), py::arg("dst"), py::arg("stream"));
  py::class_<cuda::NvjpegDecoder, std::unique_ptr<cuda::NvjpegDecoder>>(m, "NvjpegDecoder")
      .def(py::init([](int device, bool allow_hardware, const std::string& library_path, py::kwargs options) {
             cuda::NvjpegOptions parsed = nvjpeg_options(options);
             py::gil_scoped_release release;
             return std::make_unique<cuda::NvjpegDecoder>(device, allow_hardware, library_path, parsed);
           }),
           py::arg("device"), py::arg("allow_hardware") = true, py::arg("library_path") = "",
           "Keyword options: the knobs of NvjpegOptions (nvjpeg_decoder.h).")
      .def_property_readonly("hardware", &cuda::NvjpegDecoder::hardware)
      .def_property_readonly("engines", &cuda::NvjpegDecoder::engines)
      .def_property_readonly("cores_per_engine", &cuda::NvjpegDecoder::cores_per_engine)
      .def_property_readonly("device", &cuda::NvjpegDecoder::device)
      .def_property_readonly("upsampling_interpolated", &cuda::NvjpegDecoder::upsampling_interpolated)
      .def_property_readonly("stream_ordered_pool", &cuda::NvjpegDecoder::stream_ordered_pool)
      .def_property_readonly("creation_log", &cuda::NvjpegDecoder::creation_log)
      .def_property_readonly("cuda_workers", &cuda::NvjpegDecoder::cuda_workers)
      .def_property_readonly("stats", &nvjpeg_stats,
                             "What the latest decode did: phase times, items per path, allocations.")
      .def("load", &cuda::NvjpegDecoder::load, py::arg("size_class"),
           "The engines' share of the hardware candidates for a size class (0: < 0.5 MP, 1: < 2.5 MP, 2: larger).")
      .def("decode", &decode_jpegs, py::arg("items"), py::arg("consumer_stream"),
           "Decode JPEGs into device buffers; one (decoded, fallback_reason, path) per item.");
}
