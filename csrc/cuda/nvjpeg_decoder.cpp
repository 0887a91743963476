#include "nvjpeg_decoder.h"

#include <stdexcept>

#include "device_ops.h"

namespace lazymedia {
namespace cuda {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

void check_nvjpeg(nvjpegStatus_t status, const char* what) {
  if (status != NVJPEG_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + nvjpeg_status_name(status));
}

// Stream-ordered device allocations for nvJPEG's internal buffers (nvjpegCreateExV2).
int device_malloc(void*, void** ptr, size_t size, cudaStream_t stream) {
  return int(cudaMallocAsync(ptr, size, stream));
}
int device_free(void*, void* ptr, size_t, cudaStream_t stream) { return int(cudaFreeAsync(ptr, stream)); }
int pinned_malloc(void*, void** ptr, size_t size, cudaStream_t) { return int(cudaHostAlloc(ptr, size, 0)); }
int pinned_free(void*, void* ptr, size_t, cudaStream_t) { return int(cudaFreeHost(ptr)); }

nvjpegDevAllocatorV2_t kDeviceAllocator{device_malloc, device_free, nullptr};
nvjpegPinnedAllocatorV2_t kPinnedAllocator{pinned_malloc, pinned_free, nullptr};

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// Stream-ordered scratch buffers, freed on the stream on every exit path (errors included).
class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  ~Scratch() {
    for (void* p : buffers_) cudaFreeAsync(p, stream_);
  }
  uint8_t* allocate(size_t bytes) {
    void* p = nullptr;
    check_cuda(cudaMallocAsync(&p, bytes, stream_), "cudaMallocAsync");
    buffers_.push_back(p);
    return static_cast<uint8_t*>(p);
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> buffers_;
};

}  // namespace

NvjpegDecoder::NvjpegDecoder(int device, bool allow_hardware, const std::string& library_path) : device_(device) {
  std::string error;
  api_ = load_nvjpeg(library_path, &error);
  if (!api_) throw std::runtime_error(error);
  DeviceGuard guard(device_);
  // Stream-ordered allocators where the backend takes them; the hardware backend may insist on
  // its defaults, so it is tried both ways before giving up on the engines.
  if (allow_hardware &&
      (api_->CreateExV2(NVJPEG_BACKEND_HARDWARE, &kDeviceAllocator, &kPinnedAllocator, NVJPEG_FLAGS_DEFAULT,
                        &handle_) == NVJPEG_STATUS_SUCCESS ||
       api_->CreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &handle_) ==
           NVJPEG_STATUS_SUCCESS)) {
    if (api_->GetHardwareDecoderInfo(handle_, &engines_, &cores_) == NVJPEG_STATUS_SUCCESS && engines_ > 0) {
      hardware_ = true;
    } else {
      api_->Destroy(handle_);
      handle_ = nullptr;
      engines_ = cores_ = 0;
    }
  }
  if (!handle_) {
    check_nvjpeg(api_->CreateExV2(NVJPEG_BACKEND_DEFAULT, &kDeviceAllocator, &kPinnedAllocator, NVJPEG_FLAGS_DEFAULT,
                                  &handle_),
                 "nvjpegCreateExV2");
  }
  check_nvjpeg(api_->JpegStateCreate(handle_, &batched_state_), "nvjpegJpegStateCreate");
  check_nvjpeg(api_->DecoderCreate(handle_, NVJPEG_BACKEND_DEFAULT, &decoder_), "nvjpegDecoderCreate");
  check_nvjpeg(api_->DecoderStateCreate(handle_, decoder_, &decoupled_state_), "nvjpegDecoderStateCreate");
  for (auto& pinned : pinned_) check_nvjpeg(api_->BufferPinnedCreateV2(handle_, &kPinnedAllocator, &pinned), "pinned buffer");
  check_nvjpeg(api_->BufferDeviceCreateV2(handle_, &kDeviceAllocator, &device_buffer_), "device buffer");
  check_nvjpeg(api_->StateAttachDeviceBuffer(decoupled_state_, device_buffer_), "attach device buffer");
  check_nvjpeg(api_->DecodeParamsCreate(handle_, &params_), "nvjpegDecodeParamsCreate");
  check_nvjpeg(api_->DecodeParamsSetOutputFormat(params_, NVJPEG_OUTPUT_RGBI), "set output format");
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaEventCreateWithFlags(&consumer_ready_, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  for (auto& event : pinned_free_) check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
}

NvjpegDecoder::~NvjpegDecoder() {
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  for (nvjpegJpegStream_t s : streams_) api_->JpegStreamDestroy(s);
  if (params_) api_->DecodeParamsDestroy(params_);
  if (decoupled_state_) api_->JpegStateDestroy(decoupled_state_);
  if (device_buffer_) api_->BufferDeviceDestroy(device_buffer_);
  for (auto pinned : pinned_)
    if (pinned) api_->BufferPinnedDestroy(pinned);
  if (decoder_) api_->DecoderDestroy(decoder_);
  if (batched_state_) api_->JpegStateDestroy(batched_state_);
  if (handle_) api_->Destroy(handle_);
  for (cudaEvent_t e : {consumer_ready_, done_, pinned_free_[0], pinned_free_[1]})
    if (e) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
}

std::vector<JpegResult> NvjpegDecoder::decode(const std::vector<JpegRequest>& requests, cudaStream_t consumer) {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceGuard guard(device_);
  std::vector<JpegResult> results(requests.size(), JpegResult{JpegOutcome::Decoded, ""});
  while (streams_.size() < requests.size()) {
    nvjpegJpegStream_t s = nullptr;
    check_nvjpeg(api_->JpegStreamCreate(handle_, &s), "nvjpegJpegStreamCreate");
    streams_.push_back(s);
  }
  // Order our private stream after everything the caller queued (output allocations included).
  check_cuda(cudaEventRecord(consumer_ready_, consumer), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream_, consumer_ready_, 0), "cudaStreamWaitEvent");

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
      hardware_items.push_back(i);
    } else {
      decoupled_items.push_back(i);
    }
  }
  // Images that need orienting decode into stream-ordered scratch, the rest straight into the
  // caller's tensor.
  std::vector<uint8_t*> targets(requests.size(), nullptr);
  Scratch scratch(stream_);
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
      check_cuda(launch_orient(targets[i], r.out, r.height, r.width, 3, r.orientation, stream_), "orient kernel");
    }
  }
  check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(consumer, done_, 0), "cudaStreamWaitEvent");
  return results;
}

void NvjpegDecoder::decode_hardware(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items,
                                    const std::vector<uint8_t*>& targets, std::vector<JpegResult>* results) {
  const int n = int(items.size());
  if (n != batched_size_) {
    check_nvjpeg(api_->DecodeBatchedInitialize(handle_, batched_state_, n, 1, NVJPEG_OUTPUT_RGBI),
                 "nvjpegDecodeBatchedInitialize");
    batched_size_ = n;
  }
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
  // The hardware engines do not order themselves after earlier work on the stream they are
  // given: wait on the host for everything queued so far (the caller's allocations and ours).
  check_cuda(cudaEventRecord(consumer_ready_, stream_), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(consumer_ready_), "cudaEventSynchronize");
  nvjpegStatus_t status = api_->DecodeBatched(handle_, batched_state_, data.data(), lengths.data(),
                                              destinations.data(), stream_);
  if (status != NVJPEG_STATUS_SUCCESS) {
    // The whole batch failed (one bad bitstream fails it): let the decoupled path retry each.
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
    nvjpegStatus_t status = api_->JpegStreamParse(handle_, r.data, r.size, 0, 0, streams_[i]);
    // Ping-pong: the host phase may refill a pinned buffer only once its last transfer is done.
    check_cuda(cudaEventSynchronize(pinned_free_[slot]), "cudaEventSynchronize");
    if (status == NVJPEG_STATUS_SUCCESS) status = api_->StateAttachPinnedBuffer(decoupled_state_, pinned_[slot]);
    if (status == NVJPEG_STATUS_SUCCESS)
      status = api_->DecodeJpegHost(handle_, decoder_, decoupled_state_, params_, streams_[i]);
    if (status == NVJPEG_STATUS_SUCCESS)
      status = api_->DecodeJpegTransferToDevice(handle_, decoder_, decoupled_state_, streams_[i], stream_);
    check_cuda(cudaEventRecord(pinned_free_[slot], stream_), "cudaEventRecord");
    if (status == NVJPEG_STATUS_SUCCESS) {
      nvjpegImage_t destination{};
      destination.channel[0] = targets[i];
      destination.pitch[0] = size_t(r.width) * 3;
      status = api_->DecodeJpegDevice(handle_, decoder_, decoupled_state_, &destination, stream_);
    }
    if (status != NVJPEG_STATUS_SUCCESS) {
      (*results)[i] = {JpegOutcome::Fallback, std::string("decoupled decode: ") + nvjpeg_status_name(status)};
    } else {
      (*results)[i] = {JpegOutcome::Decoded, ""};
    }
  }
}

}  // namespace cuda
}  // namespace lazymedia
