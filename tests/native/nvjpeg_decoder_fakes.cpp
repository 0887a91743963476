// Recording fakes of the nvJPEG and CUDA runtime entry points the decoder calls, and scenarios
// that drive the real decoder (csrc/cuda/nvjpeg_decoder.cpp) through them on a machine without a
// GPU. Each scenario prints the call sequence, one call a line; tests/test_engine_nvjpeg.py holds
// the ordering rules against it.
//
//   nvjpeg_decoder_fakes SCENARIO
//     hardware | hardware_failure | decoupled | orient_failure | truncated_scan | no_pools | plain_flags
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/nvjpeg_decoder.h"

namespace lazymedia {
namespace cuda {
namespace {

std::vector<std::string> calls;
bool hardware_engines = true;
bool batches_supported = true;
int failing_batches = 0;  // this many DecodeBatched calls fail before they succeed
bool failing_orient = false;  // the orientation kernel's launch fails
int truncated_image = -1;  // the image (first bitstream byte) whose scan data is cut: a full parse fails
bool pools_supported = true;  // cudaDevAttrMemoryPoolsSupported
bool interpolation_refused = false;  // CreateEx* refuses NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION
int dummy_objects[64];
int next_object = 0;

template <typename T>
T fresh() {
  return reinterpret_cast<T>(&dummy_objects[next_object++ % 64]);
}

std::string event_name(cudaEvent_t e) {
  return reinterpret_cast<const char*>(e);
}

void log(const std::string& call) { calls.push_back(call); }

// -- nvJPEG ----------------------------------------------------------------------------------
std::string flag_text(unsigned flags) {
  return " strict=" + std::to_string((flags & NVJPEG_FLAGS_BITSTREAM_STRICT) != 0) + " interpolation=" +
         std::to_string((flags & NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION) != 0);
}
nvjpegStatus_t create_status(unsigned flags) {
  return interpolation_refused && (flags & NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION) ? NVJPEG_STATUS_INVALID_PARAMETER
                                                                                       : NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t CreateExV2(nvjpegBackend_t backend, nvjpegDevAllocatorV2_t*, nvjpegPinnedAllocatorV2_t*,
                          unsigned flags, nvjpegHandle_t* handle) {
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
  *cores = hardware_engines ? 4 : 0;
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStateCreate(nvjpegHandle_t, nvjpegJpegState_t* state) {
  *state = fresh<nvjpegJpegState_t>();
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStateDestroy(nvjpegJpegState_t) { return NVJPEG_STATUS_SUCCESS; }
int batch_in_flight = 0;
nvjpegStatus_t DecodeBatchedInitialize(nvjpegHandle_t, nvjpegJpegState_t, int batch, int, nvjpegOutputFormat_t) {
  batch_in_flight = batch;
  log("DecodeBatchedInitialize " + std::to_string(batch));
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeBatched(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char* const* data, const size_t*,
                             nvjpegImage_t*, cudaStream_t) {
  if (failing_batches > 0) {
    --failing_batches;
    log("DecodeBatched failed");
    return NVJPEG_STATUS_EXECUTION_FAILED;
  }
  std::string images;
  for (int k = 0; k < batch_in_flight; ++k) images += " " + std::to_string(data[k][0]);
  log("DecodeBatched" + images);
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeBatchedPreAllocate(nvjpegHandle_t, nvjpegJpegState_t, int batch, int, int,
                                        nvjpegChromaSubsampling_t, nvjpegOutputFormat_t) {
  log("DecodeBatchedPreAllocate " + std::to_string(batch));
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
nvjpegStatus_t JpegStreamParse(nvjpegHandle_t, const unsigned char* data, size_t, int, int, nvjpegJpegStream_t) {
  const bool truncated = data[0] == truncated_image;
  log("JpegStreamParse " + std::to_string(data[0]) + (truncated ? " failed" : ""));
  return truncated ? NVJPEG_STATUS_INCOMPLETE_BITSTREAM : NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStreamParseHeader(nvjpegHandle_t, const unsigned char*, size_t, nvjpegJpegStream_t) {
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStreamGetFrameDimensions(nvjpegJpegStream_t, unsigned* width, unsigned* height) {
  *width = 8;
  *height = 4;
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t JpegStreamGetComponentsNum(nvjpegJpegStream_t, unsigned* components) {
  *components = 3;
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecoderCreate(nvjpegHandle_t, nvjpegBackend_t, nvjpegJpegDecoder_t* decoder) {
  *decoder = fresh<nvjpegJpegDecoder_t>();
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecoderDestroy(nvjpegJpegDecoder_t) { return NVJPEG_STATUS_SUCCESS; }
nvjpegStatus_t DecoderStateCreate(nvjpegHandle_t, nvjpegJpegDecoder_t, nvjpegJpegState_t* state) {
  *state = fresh<nvjpegJpegState_t>();
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
nvjpegStatus_t DecodeParamsSetOutputFormat(nvjpegDecodeParams_t, nvjpegOutputFormat_t) {
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeJpegHost(nvjpegHandle_t, nvjpegJpegDecoder_t, nvjpegJpegState_t, nvjpegDecodeParams_t,
                              nvjpegJpegStream_t) {
  log("DecodeJpegHost");
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeJpegTransferToDevice(nvjpegHandle_t, nvjpegJpegDecoder_t, nvjpegJpegState_t, nvjpegJpegStream_t,
                                          cudaStream_t) {
  log("DecodeJpegTransferToDevice");
  return NVJPEG_STATUS_SUCCESS;
}
nvjpegStatus_t DecodeJpegDevice(nvjpegHandle_t, nvjpegJpegDecoder_t, nvjpegJpegState_t, nvjpegImage_t*,
                                cudaStream_t) {
  log("DecodeJpegDevice");
  return NVJPEG_STATUS_SUCCESS;
}

// -- CUDA runtime ---------------------------------------------------------------------------
cudaError_t GetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t SetDevice(int) { return cudaSuccess; }
const char* GetErrorString(cudaError_t) { return "fake error"; }
cudaError_t StreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = reinterpret_cast<cudaStream_t>(const_cast<char*>("private"));
  return cudaSuccess;
}
cudaError_t StreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t StreamSynchronize(cudaStream_t stream) {
  log(std::string("StreamSynchronize ") + reinterpret_cast<const char*>(stream));
  return cudaSuccess;
}
cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  log(std::string("StreamWaitEvent ") + reinterpret_cast<const char*>(stream) + " " + event_name(event));
  return cudaSuccess;
}
std::vector<std::string> event_names = {"consumer_ready", "done", "stream_idle", "device_done",
                                        "pinned_free0", "pinned_free1"};  // in the decoder's creation order
int events_created = 0;
cudaError_t EventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  const std::string& name = event_names[events_created++ % event_names.size()];
  log("EventCreate " + name + " blocking_sync=" + std::to_string((flags & cudaEventBlockingSync) != 0));
  *event = reinterpret_cast<cudaEvent_t>(const_cast<char*>(name.c_str()));
  return cudaSuccess;
}
cudaError_t EventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) {
  log("EventRecord " + event_name(event) + " " + reinterpret_cast<const char*>(stream));
  return cudaSuccess;
}
cudaError_t EventSynchronize(cudaEvent_t event) {
  log("EventSynchronize " + event_name(event));
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
  scratch.emplace_back(size);
  *ptr = scratch.back().data();
  log("MallocFromPoolAsync");
  return cudaSuccess;
}
cudaError_t FreeAsync(void*, cudaStream_t) { return cudaSuccess; }
cudaError_t HostAlloc(void** ptr, size_t, unsigned) {
  *ptr = fresh<void*>();
  return cudaSuccess;
}
cudaError_t FreeHost(void*) { return cudaSuccess; }
cudaError_t Malloc(void** ptr, size_t size) {
  scratch.emplace_back(size);
  *ptr = scratch.back().data();
  log("Malloc");
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

const NvjpegApi kNvjpeg{CreateExV2, CreateEx, Destroy, GetHardwareDecoderInfo, JpegStateCreate, JpegStateDestroy,
                        DecodeBatchedInitialize, DecodeBatched, DecodeBatchedSupported, JpegStreamCreate,
                        JpegStreamDestroy, JpegStreamParse, JpegStreamParseHeader, JpegStreamGetFrameDimensions,
                        JpegStreamGetComponentsNum, DecoderCreate, DecoderDestroy, DecoderStateCreate,
                        BufferPinnedCreateV2, BufferPinnedDestroy, BufferDeviceCreateV2, BufferDeviceDestroy,
                        StateAttachPinnedBuffer, StateAttachDeviceBuffer, DecodeParamsCreate, DecodeParamsDestroy,
                        DecodeParamsSetOutputFormat, DecodeJpegHost, DecodeJpegTransferToDevice, DecodeJpegDevice,
                        GetProperty, GetProperty, DecodeBatchedPreAllocate};
const CudaApi kCuda{GetDevice,       SetDevice,      GetErrorString,      StreamCreateWithFlags, StreamDestroy,
                    StreamSynchronize, StreamWaitEvent, EventCreateWithFlags, EventDestroy,        EventRecord,
                    EventSynchronize, MemPoolCreate,  MemPoolDestroy,      MemPoolSetAttribute,   MallocFromPoolAsync,
                    FreeAsync,       HostAlloc,      FreeHost,            Malloc,                Free,
                    DeviceGetAttribute, Orient};

std::vector<JpegRequest> requests(int count, std::vector<uint8_t>* storage, int orientation = 1) {
  static uint8_t bitstreams[16][4];
  storage->assign(size_t(count) * 8 * 4 * 3, 0);
  std::vector<JpegRequest> out;
  for (int i = 0; i < count; ++i) {
    bitstreams[i][0] = uint8_t(i);  // the parse log names the image
    out.push_back(JpegRequest{bitstreams[i], 4, 8, 4, orientation, storage->data() + size_t(i) * 8 * 4 * 3});
  }
  return out;
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
  cudaStream_t consumer = reinterpret_cast<cudaStream_t>(const_cast<char*>("consumer"));
  std::vector<uint8_t> storage;
  {
    NvjpegDecoder decoder(&kNvjpeg, &kCuda, 0, true);
    std::string creation = decoder.creation_log();
    for (size_t at = creation.find('\n'); at != std::string::npos; at = creation.find('\n')) creation[at] = '|';
    log("creation log: " + creation + (decoder.upsampling_interpolated() ? " (interpolated)" : " (plain)"));
    log("-- batch 1");
    decoder.decode(requests(3, &storage), consumer);
    if (scenario == "hardware_failure") failing_batches = 1;
    if (scenario == "truncated_scan") truncated_image = 1;
    log("-- batch 2");
    std::vector<JpegResult> second = decoder.decode(requests(3, &storage), consumer);
    for (size_t i = 0; i < second.size(); ++i)
      log("result " + std::to_string(i) + " " + (second[i].outcome == JpegOutcome::Decoded ? "decoded" : "fallback") +
          (second[i].reason.empty() ? "" : " " + second[i].reason));
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
  for (const std::string& call : calls) std::printf("%s\n", call.c_str());
  return 0;
}
