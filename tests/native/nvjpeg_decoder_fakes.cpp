// Recording fakes of the nvJPEG and CUDA runtime entry points the decoder calls, and scenarios
// that drive the real decoder (csrc/cuda/nvjpeg_decoder.cpp) through them on a machine without a
// GPU. Each scenario prints the call sequence, one call a line; tests/test_engine_nvjpeg.py holds
// the ordering rules against it. Calls from the CUDA path's worker threads interleave; they name
// their worker through its stream ("worker0"), events ("w0.device_done") and states ("w0.p1.h":
// worker 0, page 1, HYBRID).
// Time is a fake clock per thread, moved only by the costs a scenario gives the engines
// (waiting for their batch) and the CUDA path (each host phase).
//
//   nvjpeg_decoder_fakes SCENARIO
//     hardware | hardware_failure | decoupled | orient_failure | truncated_scan | no_pools | plain_flags
//     | planar | full_parse | split | damaged | adaptive | concurrent | scheduler
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/nvjpeg_decoder.h"

namespace lazymedia {
namespace cuda {
namespace {

std::mutex calls_mutex;  // the CUDA path's workers log from their own threads
std::vector<std::string> calls;
bool hardware_engines = true;
bool batches_supported = true;
int failing_batches = 0;             // this many DecodeBatched calls fail before they succeed
bool failing_orient = false;         // the orientation kernel's launch fails
int truncated_image = -1;            // the image (first bitstream byte) whose scan data is cut: a full parse fails
int bad_huffman_image = -1;          // the image whose host (Huffman) phase fails
bool pools_supported = true;         // cudaDevAttrMemoryPoolsSupported
bool interpolation_refused = false;  // CreateEx* refuses NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION
double hardware_cost_ms = 0, cuda_cost_ms = 0;
// "concurrent": the first batch on the engines waits until the other call has staged its
// bitstreams (which it can do only outside the decoder's mutex); bounded, and logged either way.
bool hold_first_batch = false;
std::mutex staging_seen_mutex;
std::condition_variable staging_seen_changed;
int stagings_seen = 0;  // fake time the engines' batch and each host phase take
thread_local double now_ms = 0;
int dummy_objects[4096];
std::atomic<int> next_object{0};
std::map<const void*, std::string> names;  // states, decoders, jpeg streams -> a name for the log
std::map<const void*, int> parsed_image;   // jpeg stream -> the image it last parsed
std::vector<std::pair<const uint8_t*, size_t>> host_allocations;

template <typename T>
T fresh() {
  return reinterpret_cast<T>(&dummy_objects[next_object++ % 4096]);
}

void log(const std::string& call) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  calls.push_back(call);
}
std::string name_of(const void* p) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  return names[p];
}
void name(const void* p, const std::string& n) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  names[p] = n;
}
int image_of(const void* stream) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  return parsed_image[stream];
}
bool pinned(const void* p) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  for (const auto& [base, size] : host_allocations)
    if (p >= base && p < base + size) return true;
  return false;
}

std::string event_name(cudaEvent_t e) { return reinterpret_cast<const char*>(e); }
std::string stream_name(cudaStream_t s) { return reinterpret_cast<const char*>(s); }

// -- nvJPEG ----------------------------------------------------------------------------------
std::string flag_text(unsigned flags) {
  return " strict=" + std::to_string((flags & NVJPEG_FLAGS_BITSTREAM_STRICT) != 0) +
         " interpolation=" + std::to_string((flags & NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION) != 0);
}
nvjpegStatus_t create_status(unsigned flags) {
  return interpolation_refused && (flags & NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION) ? NVJPEG_STATUS_INVALID_PARAMETER
                                                                                       : NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t CreateExV2(nvjpegBackend_t backend, nvjpegDevAllocatorV2_t*, nvjpegPinnedAllocatorV2_t*, unsigned flags,
                          nvjpegHandle_t* handle) {
  log("CreateExV2 backend=" + std::to_string(int(backend)) + flag_text(flags));
  *handle = fresh<nvjpegHandle_t>();
  return create_status(flags);
}
nvjpegStatus_t CreateEx(nvjpegBackend_t, nvjpegDevAllocator_t*, nvjpegPinnedAllocator_t*, unsigned flags,
                        nvjpegHandle_t* handle) {
  log("CreateEx" + flag_text(flags));
  *handle = fresh<nvjpegHandle_t>();
  return create_status(flags);
}
nvjpegStatus_t Destroy(nvjpegHandle_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t GetHardwareDecoderInfo(nvjpegHandle_t, unsigned* engines, unsigned* cores) {
  *engines = hardware_engines ? 1 : 0;
  *cores = hardware_engines ? 4 : 0;  // one round of the engines: 4 images
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStateCreate(nvjpegHandle_t, nvjpegJpegState_t* state) {
  *state = fresh<nvjpegJpegState_t>();
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStateDestroy(nvjpegJpegState_t) { return NVJPEG_STATUS_SUCCESS; }
int batch_in_flight = 0;
nvjpegStatus_t DecodeBatchedInitialize(nvjpegHandle_t, nvjpegJpegState_t, int batch, int, nvjpegOutputFormat_t format) {
  batch_in_flight = batch;
  log("DecodeBatchedInitialize " + std::to_string(batch) + (format == NVJPEG_OUTPUT_RGB ? " planar" : ""));
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeBatched(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char* const* data, const size_t*,
                             nvjpegImage_t* destinations, cudaStream_t) {
  if (failing_batches > 0) {
    --failing_batches;
    log("DecodeBatched failed");
    return NVJPEG_STATUS_EXECUTION_FAILED;
  }
  std::string waited;
  if (hold_first_batch) {
    hold_first_batch = false;
    std::unique_lock<std::mutex> lock(staging_seen_mutex);
    const bool seen = staging_seen_changed.wait_for(lock, std::chrono::seconds(30), [] { return stagings_seen >= 2; });
    waited = seen ? " (the other call staged meanwhile)" : " (the other call never staged)";
  }
  std::string images;
  bool all_pinned = true, planar = true;
  for (int k = 0; k < batch_in_flight; ++k) {
    images += " " + std::to_string(data[k][0]);
    all_pinned = all_pinned && pinned(data[k]);
    planar = planar && destinations[k].channel[1] != nullptr;
  }
  log("DecodeBatched" + images + (all_pinned ? " (pinned)" : " (pageable)") + (planar ? " (planar)" : "") + waited);
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeBatchedPreAllocate(nvjpegHandle_t, nvjpegJpegState_t, int batch, int width, int height,
                                        nvjpegChromaSubsampling_t, nvjpegOutputFormat_t) {
  log("DecodeBatchedPreAllocate " + std::to_string(batch) + " " + std::to_string(width) + "x" + std::to_string(height));
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t GetProperty(libraryPropertyType, int* value) {
  *value = 13;
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeBatchedSupported(nvjpegHandle_t, nvjpegJpegStream_t, int* unsupported) {
  *unsupported = batches_supported ? 0 : 1;
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStreamCreate(nvjpegHandle_t, nvjpegJpegStream_t* stream) {
  *stream = fresh<nvjpegJpegStream_t>();
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStreamDestroy(nvjpegJpegStream_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t JpegStreamParse(nvjpegHandle_t, const unsigned char* data, size_t, int, int, nvjpegJpegStream_t s) {
  const bool truncated = data[0] == truncated_image;
  {
    std::lock_guard<std::mutex> lock(calls_mutex);
    parsed_image[s] = data[0];
  }
  log("JpegStreamParse " + std::to_string(data[0]) + (truncated ? " failed" : ""));
  return truncated ? NVJPEG_STATUS_INCOMPLETE_BITSTREAM : NVJPEG_STATUS_SUCCESS;
}
// A fake bitstream: [image id, width, height, 0, SOS, 0, 0, EOI] (the EOI dropped where cut).
nvjpegStatus_t JpegStreamParseHeader(nvjpegHandle_t, const unsigned char* data, size_t, nvjpegJpegStream_t s) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  parsed_image[s] = data[0] | (data[1] << 8) | (data[2] << 16);
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStreamGetFrameDimensions(nvjpegJpegStream_t s, unsigned* width, unsigned* height) {
  const int header = image_of(s);
  *width = unsigned((header >> 8) & 0xFF);
  *height = unsigned((header >> 16) & 0xFF);
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStreamGetComponentsNum(nvjpegJpegStream_t, unsigned* components) {
  *components = 3;
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStreamGetJpegEncoding(nvjpegJpegStream_t, nvjpegJpegEncoding_t* encoding) {
  *encoding = NVJPEG_ENCODING_BASELINE_DCT;
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecoderJpegSupported(nvjpegJpegDecoder_t, nvjpegJpegStream_t, nvjpegDecodeParams_t, int* unsupported) {
  *unsupported = 0;
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecoderCreate(nvjpegHandle_t, nvjpegBackend_t backend, nvjpegJpegDecoder_t* decoder) {
  *decoder = fresh<nvjpegJpegDecoder_t>();
  name(*decoder, backend == NVJPEG_BACKEND_GPU_HYBRID ? "gpu_hybrid"
                 : backend == NVJPEG_BACKEND_HYBRID   ? "hybrid"
                                                      : "other");
  log("DecoderCreate " + name_of(*decoder));
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecoderDestroy(nvjpegJpegDecoder_t) { return NVJPEG_STATUS_SUCCESS; }
int states_created = 0;
// Named in the decoder's creation order: per worker, per page, a HYBRID then a GPU_HYBRID state.
nvjpegStatus_t DecoderStateCreate(nvjpegHandle_t, nvjpegJpegDecoder_t, nvjpegJpegState_t* state) {
  *state = fresh<nvjpegJpegState_t>();
  const int n = states_created++;
  name(*state, "w" + std::to_string(n / 4) + ".p" + std::to_string(n / 2 % 2) + (n % 2 ? ".g" : ".h"));
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t BufferPinnedCreateV2(nvjpegHandle_t, nvjpegPinnedAllocatorV2_t*, nvjpegBufferPinned_t* buffer) {
  *buffer = fresh<nvjpegBufferPinned_t>();
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t BufferPinnedDestroy(nvjpegBufferPinned_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t BufferDeviceCreateV2(nvjpegHandle_t, nvjpegDevAllocatorV2_t*, nvjpegBufferDevice_t* buffer) {
  *buffer = fresh<nvjpegBufferDevice_t>();
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t BufferDeviceDestroy(nvjpegBufferDevice_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t StateAttachPinnedBuffer(nvjpegJpegState_t, nvjpegBufferPinned_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t StateAttachDeviceBuffer(nvjpegJpegState_t, nvjpegBufferDevice_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t DecodeParamsCreate(nvjpegHandle_t, nvjpegDecodeParams_t* params) {
  *params = fresh<nvjpegDecodeParams_t>();
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeParamsDestroy(nvjpegDecodeParams_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t DecodeParamsSetOutputFormat(nvjpegDecodeParams_t, nvjpegOutputFormat_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t DecodeJpegHost(nvjpegHandle_t, nvjpegJpegDecoder_t decoder, nvjpegJpegState_t state,
                              nvjpegDecodeParams_t, nvjpegJpegStream_t s) {
  const int image = image_of(s);
  now_ms += cuda_cost_ms;
  log("DecodeJpegHost " + std::to_string(image) + " " + name_of(state) + " " + name_of(decoder) +
      (image == bad_huffman_image ? " failed" : ""));
  return image == bad_huffman_image ? NVJPEG_STATUS_BAD_JPEG : NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeJpegTransferToDevice(nvjpegHandle_t, nvjpegJpegDecoder_t, nvjpegJpegState_t state,
                                          nvjpegJpegStream_t s, cudaStream_t stream) {
  log("DecodeJpegTransferToDevice " + std::to_string(image_of(s)) + " " + name_of(state) + " " + stream_name(stream));
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeJpegDevice(nvjpegHandle_t, nvjpegJpegDecoder_t, nvjpegJpegState_t state, nvjpegImage_t*,
                                cudaStream_t stream) {
  log("DecodeJpegDevice " + name_of(state) + " " + stream_name(stream));
  return NVJPEG_STATUS_SUCCESS;
}

// -- CUDA runtime ---------------------------------------------------------------------------
cudaError_t GetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t SetDevice(int) { return cudaSuccess; }
const char* GetErrorString(cudaError_t) { return "fake error"; }
std::vector<std::string> stream_names = {"private", "worker0", "worker1"};  // in the decoder's creation order
int streams_created = 0;
cudaError_t StreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = reinterpret_cast<cudaStream_t>(const_cast<char*>(stream_names.at(size_t(streams_created++)).c_str()));
  return cudaSuccess;
}
cudaError_t StreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t StreamSynchronize(cudaStream_t stream) {
  log("StreamSynchronize " + stream_name(stream));
  return cudaSuccess;
}
cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  log("StreamWaitEvent " + stream_name(stream) + " " + event_name(event));
  return cudaSuccess;
}
std::vector<std::string> event_names = {
    // in the decoder's creation order
    "consumer_ready", "done",           "scratch_ready",   "stream_idle",     "hardware_done",  "staging_free0",
    "staging_free1",  "w0.device_done", "w0.pinned_free0", "w0.pinned_free1", "w1.device_done", "w1.pinned_free0",
    "w1.pinned_free1"};
int events_created = 0;
cudaError_t EventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  const std::string& name = event_names.at(size_t(events_created++));
  log("EventCreate " + name + " blocking_sync=" + std::to_string((flags & cudaEventBlockingSync) != 0));
  *event = reinterpret_cast<cudaEvent_t>(const_cast<char*>(name.c_str()));
  return cudaSuccess;
}
cudaError_t EventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) {
  log("EventRecord " + event_name(event) + " " + stream_name(stream));
  return cudaSuccess;
}
cudaError_t EventSynchronize(cudaEvent_t event) {
  if (event_name(event) == "hardware_done") now_ms += hardware_cost_ms;
  log("EventSynchronize " + event_name(event));
  if (event_name(event).rfind("staging_free", 0) == 0) {
    std::lock_guard<std::mutex> lock(staging_seen_mutex);
    ++stagings_seen;
    staging_seen_changed.notify_all();
  }
  return cudaSuccess;
}
cudaError_t MemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps*) {
  log("MemPoolCreate");
  *pool = fresh<cudaMemPool_t>();
  return cudaSuccess;
}
cudaError_t MemPoolDestroy(cudaMemPool_t) { return cudaSuccess; }
cudaError_t MemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr attribute, void* value) {
  if (attribute == cudaMemPoolAttrReleaseThreshold)
    log("MemPoolSetAttribute release_threshold=" + std::to_string(*static_cast<uint64_t*>(value)));
  return cudaSuccess;
}
std::vector<std::vector<uint8_t>> scratch;
cudaError_t MallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t, cudaStream_t) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  scratch.emplace_back(size);
  *ptr = scratch.back().data();
  calls.push_back("MallocFromPoolAsync");
  return cudaSuccess;
}
cudaError_t FreeAsync(void*, cudaStream_t) { return cudaSuccess; }
std::vector<std::vector<uint8_t>> host_memory;
cudaError_t HostAlloc(void** ptr, size_t size, unsigned) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  host_memory.emplace_back(size);
  *ptr = host_memory.back().data();
  host_allocations.emplace_back(host_memory.back().data(), size);
  calls.push_back("HostAlloc " + std::to_string(size));
  return cudaSuccess;
}
cudaError_t FreeHost(void* ptr) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  for (auto& a : host_allocations)
    if (a.first == ptr) a.second = 0;  // freed: pointers into it are no longer pinned memory
  calls.push_back("FreeHost");
  return cudaSuccess;
}
cudaError_t Malloc(void** ptr, size_t size) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  scratch.emplace_back(size);
  *ptr = scratch.back().data();
  calls.push_back("Malloc");
  return cudaSuccess;
}
cudaError_t Free(void*) {
  log("Free");
  return cudaSuccess;
}
cudaError_t DeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  *value = attribute == cudaDevAttrMemoryPoolsSupported ? int(pools_supported) : 0;
  return cudaSuccess;
}
cudaError_t Orient(const uint8_t*, uint8_t*, int, int, int, int orientation, cudaStream_t) {
  log("Orient " + std::to_string(orientation) + (failing_orient ? " failed" : ""));
  return failing_orient ? cudaErrorLaunchFailure : cudaSuccess;
}
cudaError_t PlanarToInterleaved(const uint8_t*, uint8_t*, int, int, int orientation, cudaStream_t stream) {
  log("PlanarToInterleaved " + std::to_string(orientation) + " " + stream_name(stream));
  return cudaSuccess;
}

const NvjpegApi kNvjpeg{CreateExV2,
                        CreateEx,
                        Destroy,
                        GetHardwareDecoderInfo,
                        JpegStateCreate,
                        JpegStateDestroy,
                        DecodeBatchedInitialize,
                        DecodeBatched,
                        DecodeBatchedSupported,
                        JpegStreamCreate,
                        JpegStreamDestroy,
                        JpegStreamParse,
                        JpegStreamParseHeader,
                        JpegStreamGetFrameDimensions,
                        JpegStreamGetComponentsNum,
                        JpegStreamGetJpegEncoding,
                        DecoderJpegSupported,
                        DecoderCreate,
                        DecoderDestroy,
                        DecoderStateCreate,
                        BufferPinnedCreateV2,
                        BufferPinnedDestroy,
                        BufferDeviceCreateV2,
                        BufferDeviceDestroy,
                        StateAttachPinnedBuffer,
                        StateAttachDeviceBuffer,
                        DecodeParamsCreate,
                        DecodeParamsDestroy,
                        DecodeParamsSetOutputFormat,
                        DecodeJpegHost,
                        DecodeJpegTransferToDevice,
                        DecodeJpegDevice,
                        GetProperty,
                        GetProperty,
                        DecodeBatchedPreAllocate};
const CudaApi kCuda{GetDevice,
                    SetDevice,
                    GetErrorString,
                    StreamCreateWithFlags,
                    StreamDestroy,
                    StreamSynchronize,
                    StreamWaitEvent,
                    EventCreateWithFlags,
                    EventDestroy,
                    EventRecord,
                    EventSynchronize,
                    MemPoolCreate,
                    MemPoolDestroy,
                    MemPoolSetAttribute,
                    MallocFromPoolAsync,
                    FreeAsync,
                    HostAlloc,
                    FreeHost,
                    Malloc,
                    Free,
                    DeviceGetAttribute,
                    Orient,
                    PlanarToInterleaved};

// `count` images; image i is (8 + i) x 4 pixels when `growing`, else 8 x 4 (same area: the
// split keeps their order).
std::vector<JpegRequest> requests(int count, std::vector<uint8_t>* storage, int orientation = 1, bool growing = false) {
  static uint8_t bitstreams[64][10];
  storage->assign(size_t(count) * 72 * 4 * 3, 0);
  std::vector<JpegRequest> out;
  for (int i = 0; i < count; ++i) {
    const int width = growing ? 8 + i : 8;
    const uint8_t bytes[10] = {uint8_t(i), uint8_t(width), 4, 0, 0xFF, 0xDA, 0, 0, 0xFF, 0xD9};
    std::memcpy(bitstreams[i], bytes, sizeof(bytes));
    const bool cut = i == truncated_image;  // a cut stream has no EOI marker
    out.push_back(JpegRequest{bitstreams[i], cut ? size_t(8) : size_t(10), width, 4, orientation,
                              storage->data() + size_t(i) * 72 * 4 * 3});
  }
  return out;
}

void log_results(const std::vector<JpegResult>& results) {
  static const char* paths[] = {"", " hardware", " cuda"};
  for (size_t i = 0; i < results.size(); ++i)
    log("result " + std::to_string(i) + " " + (results[i].outcome == JpegOutcome::Decoded ? "decoded" : "fallback") +
        (results[i].reason.empty() ? "" : " " + results[i].reason) + paths[int(results[i].path)]);
}

}  // namespace

// The delegating constructor's runtime: the fakes here (runtime_api.cpp is not linked).
const CudaApi& cuda_runtime() { return kCuda; }

}  // namespace cuda
}  // namespace lazymedia

int main(int argc, char** argv) {
  using namespace lazymedia::cuda;
  const std::string scenario = argc > 1 ? argv[1] : "";
  hardware_engines = scenario != "decoupled";
  batches_supported = scenario != "decoupled";
  pools_supported = scenario != "no_pools";
  interpolation_refused = scenario == "plain_flags";
  NvjpegOptions options;
  options.cuda_workers = 2;
  options.planar = scenario == "planar";
  options.full_parse = scenario == "full_parse";
  if (scenario == "split" || scenario == "damaged") options.hardware_load = 0.5;
  if (scenario == "split") options.gpu_hybrid_pixels = 40;  // images 3 and larger: GPU-assisted Huffman
  if (scenario == "scheduler") {  // SplitScheduler alone: shares, rounding, the adaptation rule
    SplitScheduler fixed(0.5);
    for (int n : {0, 1, 3, 7, 8, 12, 64}) std::printf("fixed0.5 n=%d unit=7 -> %d\n", n, fixed.hardware_count(n, 0, 7));
    std::printf("fixed0 n=12 -> %d\n", SplitScheduler(0).hardware_count(12, 0, 4));
    SplitScheduler adaptive(-1);
    std::printf("adaptive start %.4f n=64 unit=7 -> %d\n", adaptive.load(2), adaptive.hardware_count(64, 2, 7));
    const double timings[][2] = {{30, 10}, {30, 10}, {30, 29}, {10, 30}, {30, 30}};
    for (const auto& t : timings) {
      adaptive.observe(2, t[0], t[1]);
      std::printf("observe hw=%.0f cuda=%.0f -> load %.4f step %.4f; class 0 load %.4f\n", t[0], t[1], adaptive.load(2),
                  adaptive.step(2), adaptive.load(0));
    }
    fixed.observe(0, 30, 10);
    std::printf("fixed after observe %.4f\n", fixed.load(0));
    for (double mp : {0.25, 0.5, 2.07, 8.3})
      std::printf("size class %.2f MP -> %d\n", mp, SplitScheduler::size_class(mp * 1e6));
    return 0;
  }
  cudaStream_t consumer = reinterpret_cast<cudaStream_t>(const_cast<char*>("consumer"));
  std::vector<uint8_t> storage;
  {
    NvjpegDecoder decoder(&kNvjpeg, &kCuda, 0, true, options, [] { return now_ms; });
    std::string creation = decoder.creation_log();
    for (size_t at = creation.find('\n'); at != std::string::npos; at = creation.find('\n')) creation[at] = '|';
    log("creation log: " + creation + (decoder.upsampling_interpolated() ? " (interpolated)" : " (plain)"));
    if (scenario == "split" || scenario == "damaged") {
      if (scenario == "damaged") truncated_image = 6, bad_huffman_image = 1;
      log("-- batch 1");
      log_results(decoder.decode(requests(scenario == "split" ? 12 : 8, &storage, 1, true), consumer));
      log("-- teardown");
    } else if (scenario == "concurrent") {  // two callers: one stages while the other's batch runs
      hold_first_batch = true;
      std::vector<uint8_t> other_storage;
      std::vector<JpegResult> first, second;
      const std::vector<JpegRequest> mine = requests(3, &storage), theirs = requests(3, &other_storage);
      log("-- batch 1");
      std::thread other([&] { second = decoder.decode(theirs, consumer); });
      first = decoder.decode(mine, consumer);
      other.join();
      log_results(first);
      log_results(second);
      log("-- teardown");
    } else if (scenario == "adaptive") {
      for (int batch = 1; batch <= 12; ++batch) {
        // first the engines are the slow side, then the CUDA path is
        hardware_cost_ms = batch <= 6 ? 50 : 1;
        cuda_cost_ms = batch <= 6 ? 1 : 100;
        log("-- batch " + std::to_string(batch));
        decoder.decode(requests(12, &storage, 1, true), consumer);
        const NvjpegStats stats = decoder.stats();
        log("split hardware=" + std::to_string(stats.hardware_items) + " cuda=" + std::to_string(stats.cuda_items) +
            " load=" + std::to_string(decoder.load(stats.size_class)));
      }
      log("-- teardown");
    } else {
      log("-- batch 1");
      decoder.decode(requests(3, &storage), consumer);
      if (scenario == "hardware_failure") failing_batches = 1;
      if (scenario == "truncated_scan" || scenario == "full_parse") truncated_image = 1;
      log("-- batch 2");
      log_results(decoder.decode(requests(3, &storage), consumer));
      truncated_image = -1;
      log("-- batch 3");
      decoder.decode(requests(3, &storage, scenario == "decoupled" || scenario == "no_pools" ? 6 : 1), consumer);
      if (scenario == "orient_failure") {
        failing_orient = true;
        log("-- batch 4");
        try {
          decoder.decode(requests(3, &storage, 6), consumer);
        } catch (const std::exception& error) {
          log(std::string("decode threw: ") + error.what());
        }
      }
      log("-- teardown");
    }
  }
  for (const std::string& call : calls) std::printf("%s\n", call.c_str());
  return 0;
}
