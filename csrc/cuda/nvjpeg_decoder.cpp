#include "nvjpeg_decoder.h"

#include <stdexcept>

namespace lazymedia {
namespace cuda {
namespace {

void check_nvjpeg(nvjpegStatus_t status, const char* what) {
  if (status != NVJPEG_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + nvjpeg_status_name(status));
}

// Strict: a damaged bitstream is an error (the CPU decoder then decides, as without a GPU).
constexpr unsigned kFlags = NVJPEG_FLAGS_BITSTREAM_STRICT;
// Chroma upsampled by interpolation, as libjpeg-turbo and Pillow do (nvJPEG >= 12.1); tried
// first, dropped where a backend refuses it.
constexpr unsigned kInterpolated = NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION;
// The hardware batch's buffers reserved at creation (a hint: larger batches grow them).
constexpr int kPreallocateBatch = 16, kPreallocateSide = 1024;
// Events the host waits on: it sleeps instead of spinning a core while it holds the mutex.
constexpr unsigned kHostWaitedEvent = cudaEventDisableTiming | cudaEventBlockingSync;
// nvJPEG's pool keeps up to this much freed memory instead of returning it at every sync.
constexpr uint64_t kPoolReleaseThreshold = 256ull << 20;

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  DeviceGuard(const CudaApi& cuda, int device) : cuda_(cuda) {
    if (cuda_.GetDevice(&previous_) != cudaSuccess || cuda_.SetDevice(device) != cudaSuccess)
      throw std::runtime_error("cannot select the decoder's CUDA device");
  }
  ~DeviceGuard() { cuda_.SetDevice(previous_); }

 private:
  const CudaApi& cuda_;
  int previous_ = 0;
};

// Stream-ordered scratch buffers from the decoder's pool, freed on the stream on every exit
// path (errors included). Without a pool: cudaMalloc, freed once the stream is idle.
class Scratch {
 public:
  Scratch(const CudaApi& cuda, cudaMemPool_t pool, cudaStream_t stream) : cuda_(cuda), pool_(pool), stream_(stream) {}
  ~Scratch() {
    if (!pool_ && !buffers_.empty()) cuda_.StreamSynchronize(stream_);
    for (void* p : buffers_) pool_ ? cuda_.FreeAsync(p, stream_) : cuda_.Free(p);
  }
  uint8_t* allocate(size_t bytes) {
    void* p = nullptr;
    cudaError_t status = pool_ ? cuda_.MallocFromPoolAsync(&p, bytes, pool_, stream_) : cuda_.Malloc(&p, bytes);
    if (status != cudaSuccess) throw std::runtime_error(std::string("scratch allocation: ") + cuda_.GetErrorString(status));
    buffers_.push_back(p);
    return static_cast<uint8_t*>(p);
  }

 private:
  const CudaApi& cuda_;
  cudaMemPool_t pool_;
  cudaStream_t stream_;
  std::vector<void*> buffers_;
};

}  // namespace

void NvjpegDecoder::check_cuda(cudaError_t status, const char* what) const {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cuda_->GetErrorString(status));
}

int NvjpegDecoder::device_malloc(void* self, void** ptr, size_t size, cudaStream_t stream) {
  auto* decoder = static_cast<NvjpegDecoder*>(self);
  if (!decoder->pool_) return int(decoder->cuda_->Malloc(ptr, size));
  return int(decoder->cuda_->MallocFromPoolAsync(ptr, size, decoder->pool_, stream));
}
int NvjpegDecoder::device_free(void* self, void* ptr, size_t, cudaStream_t stream) {
  auto* decoder = static_cast<NvjpegDecoder*>(self);
  if (!decoder->pool_) return int(decoder->cuda_->Free(ptr));  // cudaFree waits for the device
  return int(decoder->cuda_->FreeAsync(ptr, stream));
}
int NvjpegDecoder::pinned_malloc(void* self, void** ptr, size_t size, cudaStream_t) {
  return int(static_cast<NvjpegDecoder*>(self)->cuda_->HostAlloc(ptr, size, 0));
}
int NvjpegDecoder::pinned_free(void* self, void* ptr, size_t, cudaStream_t) {
  return int(static_cast<NvjpegDecoder*>(self)->cuda_->FreeHost(ptr));
}

namespace {
const NvjpegApi* load_or_throw(const std::string& library_path) {
  std::string error;
  const NvjpegApi* api = load_nvjpeg(library_path, &error);
  if (!api) throw std::runtime_error(error);
  return api;
}
}  // namespace

NvjpegDecoder::NvjpegDecoder(int device, bool allow_hardware, const std::string& library_path)
    : NvjpegDecoder(load_or_throw(library_path), &cuda_runtime(), device, allow_hardware) {}

NvjpegDecoder::NvjpegDecoder(const NvjpegApi* api, const CudaApi* cuda, int device, bool allow_hardware)
    : device_(device), api_(api), cuda_(cuda) {
  try {
    create(allow_hardware);
  } catch (...) {
    release();  // what was created before the failure
    throw;
  }
}

void NvjpegDecoder::note(const std::string& line) {
  creation_log_ += (creation_log_.empty() ? "" : "\n") + line;
}

bool NvjpegDecoder::create_handle(nvjpegBackend_t backend, bool v2_allocators) {
  const char* name = backend == NVJPEG_BACKEND_HARDWARE ? "hardware" : "default";
  for (unsigned flags : {kFlags | kInterpolated, kFlags}) {
    nvjpegStatus_t status =
        v2_allocators ? api_->CreateExV2(backend, &device_allocator_, &pinned_allocator_, flags, &handle_)
                      : api_->CreateEx(backend, nullptr, nullptr, flags, &handle_);
    note(std::string(v2_allocators ? "nvjpegCreateExV2(" : "nvjpegCreateEx(") + name + ", flags=" +
         std::to_string(flags) + (v2_allocators ? ", lazymedia's allocators" : ", nvJPEG's allocators") +
         "): " + nvjpeg_status_name(status));
    if (status == NVJPEG_STATUS_SUCCESS) {
      interpolated_ = (flags & kInterpolated) != 0;
      return true;
    }
    handle_ = nullptr;
  }
  return false;
}

void NvjpegDecoder::create(bool allow_hardware) {
  DeviceGuard guard(*cuda_, device_);
  int pools_supported = 0;
  if (cuda_->DeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, device_) != cudaSuccess)
    pools_supported = 0;
  if (pools_supported) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    check_cuda(cuda_->MemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    uint64_t threshold = kPoolReleaseThreshold;
    check_cuda(cuda_->MemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold), "pool threshold");
    note("device memory: a private stream-ordered pool");
  } else {
    note("device memory: cudaMalloc (the device has no stream-ordered memory pools)");
  }
  device_allocator_ = nvjpegDevAllocatorV2_t{&NvjpegDecoder::device_malloc, &NvjpegDecoder::device_free, this};
  pinned_allocator_ = nvjpegPinnedAllocatorV2_t{&NvjpegDecoder::pinned_malloc, &NvjpegDecoder::pinned_free, this};
  // Our allocators where the backend takes them; the hardware backend may insist on its
  // defaults, so it is tried both ways before giving up on the engines.
  if (allow_hardware) {
    if (create_handle(NVJPEG_BACKEND_HARDWARE, true) || create_handle(NVJPEG_BACKEND_HARDWARE, false)) {
      nvjpegStatus_t status = api_->GetHardwareDecoderInfo(handle_, &engines_, &cores_);
      note(std::string("nvjpegGetHardwareDecoderInfo: ") + nvjpeg_status_name(status) + ", " +
           std::to_string(engines_) + " engines x " + std::to_string(cores_) + " cores");
      if (status == NVJPEG_STATUS_SUCCESS && engines_ > 0) {
        hardware_ = true;
      } else {
        api_->Destroy(handle_);
        handle_ = nullptr;
        engines_ = cores_ = 0;
      }
    }
  } else {
    note("hardware backend not asked for");
  }
  if (!handle_ && !create_handle(NVJPEG_BACKEND_DEFAULT, true))
    throw std::runtime_error("nvjpegCreateExV2 failed:\n" + creation_log_);
  check_nvjpeg(api_->JpegStateCreate(handle_, &batched_state_), "nvjpegJpegStateCreate");
  if (hardware_ && api_->DecodeBatchedPreAllocate) {
    nvjpegStatus_t status = api_->DecodeBatchedPreAllocate(handle_, batched_state_, kPreallocateBatch,
                                                           kPreallocateSide, kPreallocateSide, NVJPEG_CSS_444,
                                                           NVJPEG_OUTPUT_RGBI);
    note(std::string("nvjpegDecodeBatchedPreAllocate: ") + nvjpeg_status_name(status));  // a hint: never fatal
  }
  check_nvjpeg(api_->DecoderCreate(handle_, NVJPEG_BACKEND_DEFAULT, &decoder_), "nvjpegDecoderCreate");
  check_nvjpeg(api_->DecoderStateCreate(handle_, decoder_, &decoupled_state_), "nvjpegDecoderStateCreate");
  for (auto& pinned : pinned_)
    check_nvjpeg(api_->BufferPinnedCreateV2(handle_, &pinned_allocator_, &pinned), "pinned buffer");
  check_nvjpeg(api_->BufferDeviceCreateV2(handle_, &device_allocator_, &device_buffer_), "device buffer");
  check_nvjpeg(api_->StateAttachDeviceBuffer(decoupled_state_, device_buffer_), "attach device buffer");
  check_nvjpeg(api_->DecodeParamsCreate(handle_, &params_), "nvjpegDecodeParamsCreate");
  check_nvjpeg(api_->DecodeParamsSetOutputFormat(params_, NVJPEG_OUTPUT_RGBI), "set output format");
  check_cuda(cuda_->StreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  for (cudaEvent_t* event : {&consumer_ready_, &done_})  // only streams wait on these
    check_cuda(cuda_->EventCreateWithFlags(event, cudaEventDisableTiming), "cudaEventCreate");
  for (cudaEvent_t* event : {&stream_idle_, &device_done_, &pinned_free_[0], &pinned_free_[1]})
    check_cuda(cuda_->EventCreateWithFlags(event, kHostWaitedEvent), "cudaEventCreate");
}

NvjpegDecoder::~NvjpegDecoder() { release(); }

void NvjpegDecoder::release() {
  int current = 0;
  // At interpreter exit the CUDA runtime may already be gone: then there is nothing to free.
  if (cuda_->GetDevice(&current) == cudaErrorCudartUnloading) return;
  cuda_->SetDevice(device_);  // no throwing guard: release() runs in the destructor
  if (stream_) cuda_->StreamSynchronize(stream_);
  for (nvjpegJpegStream_t s : streams_) api_->JpegStreamDestroy(s);
  streams_.clear();
  if (params_) api_->DecodeParamsDestroy(params_);
  if (decoupled_state_) api_->JpegStateDestroy(decoupled_state_);
  if (device_buffer_) api_->BufferDeviceDestroy(device_buffer_);
  for (auto& pinned : pinned_)
    if (pinned) api_->BufferPinnedDestroy(pinned);
  if (decoder_) api_->DecoderDestroy(decoder_);
  if (batched_state_) api_->JpegStateDestroy(batched_state_);
  if (handle_) api_->Destroy(handle_);
  for (cudaEvent_t e : {consumer_ready_, stream_idle_, done_, device_done_, pinned_free_[0], pinned_free_[1]})
    if (e) cuda_->EventDestroy(e);
  if (stream_) cuda_->StreamDestroy(stream_);
  if (pool_) cuda_->MemPoolDestroy(pool_);
  params_ = nullptr, decoupled_state_ = nullptr, device_buffer_ = nullptr, decoder_ = nullptr;
  batched_state_ = nullptr, handle_ = nullptr, stream_ = nullptr, pool_ = nullptr;
  pinned_[0] = pinned_[1] = nullptr;
  consumer_ready_ = stream_idle_ = done_ = device_done_ = pinned_free_[0] = pinned_free_[1] = nullptr;
  cuda_->SetDevice(current);
}

std::vector<JpegResult> NvjpegDecoder::decode(const std::vector<JpegRequest>& requests, cudaStream_t consumer) {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceGuard guard(*cuda_, device_);
  std::vector<JpegResult> results(requests.size(), JpegResult{JpegOutcome::Decoded, ""});
  while (streams_.size() < requests.size()) {
    nvjpegJpegStream_t s = nullptr;
    check_nvjpeg(api_->JpegStreamCreate(handle_, &s), "nvjpegJpegStreamCreate");
    streams_.push_back(s);
  }
  // Order our private stream after everything the caller queued (output allocations included).
  check_cuda(cuda_->EventRecord(consumer_ready_, consumer), "cudaEventRecord");
  check_cuda(cuda_->StreamWaitEvent(stream_, consumer_ready_, 0), "cudaStreamWaitEvent");
  try {
    decode_ordered(requests, &results);
    check_cuda(cuda_->EventRecord(done_, stream_), "cudaEventRecord");
    check_cuda(cuda_->StreamWaitEvent(consumer, done_, 0), "cudaStreamWaitEvent");
  } catch (...) {
    // Writes already queued into the caller's tensors finish before the error reaches Python,
    // which frees those tensors (their memory may be handed out again at once).
    cuda_->StreamSynchronize(stream_);
    throw;
  }
  return results;
}

void NvjpegDecoder::decode_ordered(const std::vector<JpegRequest>& requests, std::vector<JpegResult>* results_out) {
  std::vector<JpegResult>& results = *results_out;

  std::vector<size_t> hardware_items, decoupled_items;
  for (size_t i = 0; i < requests.size(); ++i) {
    const JpegRequest& r = requests[i];
    if (r.orientation < 1 || r.orientation > 8 || r.width <= 0 || r.height <= 0 || !r.out) {
      results[i] = {JpegOutcome::Fallback, "invalid request"};
      continue;
    }
    nvjpegStatus_t status = api_->JpegStreamParseHeader(handle_, r.data, r.size, streams_[i]);
    unsigned w = 0, h = 0, components = 0;
    if (status == NVJPEG_STATUS_SUCCESS) status = api_->JpegStreamGetFrameDimensions(streams_[i], &w, &h);
    if (status == NVJPEG_STATUS_SUCCESS) status = api_->JpegStreamGetComponentsNum(streams_[i], &components);
    if (status != NVJPEG_STATUS_SUCCESS) {
      results[i] = {JpegOutcome::Fallback, std::string("header: ") + nvjpeg_status_name(status)};
      continue;
    }
    if (int(w) != r.width || int(h) != r.height || components != 3) {
      results[i] = {JpegOutcome::Fallback, "header disagrees with the probe"};
      continue;
    }
    int unsupported = 1;
    if (hardware_ && api_->DecodeBatchedSupported(handle_, streams_[i], &unsupported) == NVJPEG_STATUS_SUCCESS &&
        unsupported == 0) {  // 0 means supported
      // The engines get only streams that parse whole: one cut inside its scan would fail the
      // batch, or decode to pixels where the CPU answers 422 (DALI #3113 does the same).
      status = api_->JpegStreamParse(handle_, r.data, r.size, 0, 0, streams_[i]);
      if (status != NVJPEG_STATUS_SUCCESS) {
        results[i] = {JpegOutcome::Fallback, std::string("parse: ") + nvjpeg_status_name(status)};
        continue;
      }
      hardware_items.push_back(i);
    } else {
      decoupled_items.push_back(i);
    }
  }
  // Images that need orienting decode into stream-ordered scratch, the rest straight into the
  // caller's tensor.
  std::vector<uint8_t*> targets(requests.size(), nullptr);
  Scratch scratch(*cuda_, pool_, stream_);
  for (const std::vector<size_t>* items : {&hardware_items, &decoupled_items}) {
    for (size_t i : *items) {
      const JpegRequest& r = requests[i];
      targets[i] = r.orientation == 1 ? r.out : scratch.allocate(size_t(r.width) * r.height * 3);
    }
  }
  if (!hardware_items.empty()) decode_hardware(requests, hardware_items, targets, &results);
  if (!decoupled_items.empty()) decode_decoupled(requests, decoupled_items, targets, &results);
  for (const std::vector<size_t>* items : {&hardware_items, &decoupled_items}) {
    for (size_t i : *items) {
      const JpegRequest& r = requests[i];
      if (targets[i] == r.out || results[i].outcome != JpegOutcome::Decoded) continue;
      check_cuda(cuda_->Orient(targets[i], r.out, r.height, r.width, 3, r.orientation, stream_), "orient kernel");
    }
  }
}

void NvjpegDecoder::decode_hardware(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items,
                                    const std::vector<uint8_t*>& targets, std::vector<JpegResult>* results) {
  const int n = int(items.size());
  std::vector<const unsigned char*> data(n);
  std::vector<size_t> lengths(n);
  std::vector<nvjpegImage_t> destinations(n);
  for (int k = 0; k < n; ++k) {
    const JpegRequest& r = requests[items[k]];
    data[k] = r.data;
    lengths[k] = r.size;
    destinations[k] = nvjpegImage_t{};
    destinations[k].channel[0] = targets[items[k]];
    destinations[k].pitch[0] = size_t(r.width) * 3;
  }
  // The engines neither order themselves after earlier work on the stream nor let the batched
  // state be reinitialised while a batch runs: the host waits for everything queued so far (the
  // previous batch, the caller's allocations, our scratch) before touching the state.
  check_cuda(cuda_->EventRecord(stream_idle_, stream_), "cudaEventRecord");
  check_cuda(cuda_->EventSynchronize(stream_idle_), "cudaEventSynchronize");
  nvjpegStatus_t status = NVJPEG_STATUS_SUCCESS;
  if (n != batched_size_) {  // 0 after a failed batch: nvJPEG then wants a fresh initialisation
    status = api_->DecodeBatchedInitialize(handle_, batched_state_, n, 1, NVJPEG_OUTPUT_RGBI);
    batched_size_ = status == NVJPEG_STATUS_SUCCESS ? n : 0;
  }
  if (status == NVJPEG_STATUS_SUCCESS)
    status = api_->DecodeBatched(handle_, batched_state_, data.data(), lengths.data(), destinations.data(), stream_);
  if (status != NVJPEG_STATUS_SUCCESS) {
    batched_size_ = 0;
    // The whole batch failed: the decoupled path retries each image, once whatever the engines
    // had started writing into the same outputs has finished.
    check_cuda(cuda_->StreamSynchronize(stream_), "cudaStreamSynchronize");
    std::string reason = std::string("hardware batch: ") + nvjpeg_status_name(status);
    decode_decoupled(requests, items, targets, results);
    for (size_t i : items)
      if ((*results)[i].outcome == JpegOutcome::Fallback) (*results)[i].reason = reason + "; " + (*results)[i].reason;
  }
}

void NvjpegDecoder::decode_decoupled(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items,
                                     const std::vector<uint8_t*>& targets, std::vector<JpegResult>* results) {
  for (size_t k = 0; k < items.size(); ++k) {
    const size_t i = items[k];
    const JpegRequest& r = requests[i];
    const int slot = int(k % 2);
    // Host phase (Huffman decoding on this thread) into pinned buffer `slot`, once the device
    // phase of the image that last used that buffer is done; it overlaps image k-1's device phase.
    nvjpegStatus_t status = api_->JpegStreamParse(handle_, r.data, r.size, 0, 0, streams_[i]);
    check_cuda(cuda_->EventSynchronize(pinned_free_[slot]), "cudaEventSynchronize");
    if (status == NVJPEG_STATUS_SUCCESS) status = api_->StateAttachPinnedBuffer(decoupled_state_, pinned_[slot]);
    if (status == NVJPEG_STATUS_SUCCESS)
      status = api_->DecodeJpegHost(handle_, decoder_, decoupled_state_, params_, streams_[i]);
    // The transfer and device phase share the state's device buffer with the previous image's,
    // of this call or an earlier one (an event never recorded is complete).
    check_cuda(cuda_->EventSynchronize(device_done_), "cudaEventSynchronize");
    if (status == NVJPEG_STATUS_SUCCESS)
      status = api_->DecodeJpegTransferToDevice(handle_, decoder_, decoupled_state_, streams_[i], stream_);
    if (status == NVJPEG_STATUS_SUCCESS) {
      nvjpegImage_t destination{};
      destination.channel[0] = targets[i];
      destination.pitch[0] = size_t(r.width) * 3;
      status = api_->DecodeJpegDevice(handle_, decoder_, decoupled_state_, &destination, stream_);
    }
    check_cuda(cuda_->EventRecord(device_done_, stream_), "cudaEventRecord");
    check_cuda(cuda_->EventRecord(pinned_free_[slot], stream_), "cudaEventRecord");
    if (status != NVJPEG_STATUS_SUCCESS) {
      (*results)[i] = {JpegOutcome::Fallback, std::string("decoupled decode: ") + nvjpeg_status_name(status)};
    } else {
      (*results)[i] = {JpegOutcome::Decoded, ""};
    }
  }
}

}  // namespace cuda
}  // namespace lazymedia
