#include "nvjpeg_decoder.h"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace lazymedia {
namespace cuda {
namespace {

void check_nvjpeg(nvjpegStatus_t status, const char* what) {
  if (status != NVJPEG_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + nvjpeg_status_name(status));
}

// Strict: a damaged bitstream is an error (the CPU decoder then decides, as without a GPU).
constexpr unsigned kFlags = NVJPEG_FLAGS_BITSTREAM_STRICT;
// Chroma upsampled by interpolation, as libjpeg-turbo and Pillow do (nvJPEG >= 12.1).
constexpr unsigned kInterpolated = NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION;
// Events the host waits on: it sleeps instead of spinning a core while it holds the mutex.
constexpr unsigned kHostWaitedEvent = cudaEventDisableTiming | cudaEventBlockingSync;
constexpr int kMaxWorkers = 16;  // CUDA path threads by default: every core, up to this many

// An NVTX range for one phase (no-op unless a profiler is attached).
class Range {
 public:
  explicit Range(const char* name) { nvtxRangePushA(name); }
  ~Range() { nvtxRangePop(); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
};

double steady_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
    if (status != cudaSuccess)
      throw std::runtime_error(std::string("scratch allocation: ") + cuda_.GetErrorString(status));
    buffers_.push_back(p);
    return static_cast<uint8_t*>(p);
  }

 private:
  const CudaApi& cuda_;
  cudaMemPool_t pool_;
  cudaStream_t stream_;
  std::vector<void*> buffers_;
};

// Structurally whole: a scan starts (SOS) and the stream ends in an EOI marker (trailing bytes
// tolerated). Scan data stuffs every 0xFF, so a stream cut inside its scan has no EOI.
bool structurally_whole(const uint8_t* data, size_t size) {
  static const uint8_t sos[2] = {0xFF, 0xDA};
  if (std::search(data, data + size, sos, sos + 2) == data + size) return false;
  const size_t from = size > 64 ? size - 64 : 0;
  for (size_t k = size; k-- > from + 1;)
    if (data[k - 1] == 0xFF && data[k] == 0xD9) return true;
  return false;
}

double pixels(const JpegRequest& r) { return double(r.width) * double(r.height); }

}  // namespace

void NvjpegDecoder::check_cuda(cudaError_t status, const char* what) const {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cuda_->GetErrorString(status));
}

int NvjpegDecoder::device_malloc(void* self, void** ptr, size_t size, cudaStream_t stream) {
  auto* decoder = static_cast<NvjpegDecoder*>(self);
  ++decoder->mallocs_;
  decoder->malloc_bytes_ += (long long)size;
  if (!decoder->pool_) return int(decoder->cuda_->Malloc(ptr, size));
  return int(decoder->cuda_->MallocFromPoolAsync(ptr, size, decoder->pool_, stream));
}
int NvjpegDecoder::device_free(void* self, void* ptr, size_t, cudaStream_t stream) {
  auto* decoder = static_cast<NvjpegDecoder*>(self);
  ++decoder->frees_;
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

NvjpegDecoder::NvjpegDecoder(int device, bool allow_hardware, const std::string& library_path,
                             const NvjpegOptions& options)
    : NvjpegDecoder(load_or_throw(library_path), &cuda_runtime(), device, allow_hardware, options) {}

NvjpegDecoder::NvjpegDecoder(const NvjpegApi* api, const CudaApi* cuda, int device, bool allow_hardware,
                             const NvjpegOptions& options, std::function<double()> clock_ms)
    : device_(device),
      api_(api),
      cuda_(cuda),
      options_(options),
      clock_ms_(clock_ms ? std::move(clock_ms) : std::function<double()>(steady_ms)),
      scheduler_(options.hardware_load) {
  try {
    create(allow_hardware);
  } catch (...) {
    release();  // what was created before the failure
    throw;
  }
}

void NvjpegDecoder::note(const std::string& line) { creation_log_ += (creation_log_.empty() ? "" : "\n") + line; }

bool NvjpegDecoder::create_handle(nvjpegBackend_t backend, bool v2_allocators) {
  const char* name = backend == NVJPEG_BACKEND_HARDWARE ? "hardware" : "default";
  std::vector<unsigned> attempts;
  if (options_.interpolation) attempts.push_back(kFlags | kInterpolated);
  attempts.push_back(kFlags);
  for (unsigned flags : attempts) {
    nvjpegStatus_t status = v2_allocators
                                ? api_->CreateExV2(backend, &device_allocator_, &pinned_allocator_, flags, &handle_)
                                : api_->CreateEx(backend, nullptr, nullptr, flags, &handle_);
    note(std::string(v2_allocators ? "nvjpegCreateExV2(" : "nvjpegCreateEx(") + name +
         ", flags=" + std::to_string(flags) + (v2_allocators ? ", lazymedia's allocators" : ", nvJPEG's allocators") +
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
    uint64_t threshold = options_.pool_threshold;
    check_cuda(cuda_->MemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold), "pool threshold");
    note("device memory: a private stream-ordered pool (release threshold " + std::to_string(threshold >> 20) +
         " MiB)");
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
  if (hardware_ && api_->DecodeBatchedPreAllocate && options_.preallocate_batch > 0) {
    // The real batch shape, in whole rounds of the engines (nvImageCodec and DALI do the same).
    const int unit = int(std::max(1u, engines_ * cores_));
    const int batch = (options_.preallocate_batch + unit - 1) / unit * unit;
    nvjpegStatus_t status = api_->DecodeBatchedPreAllocate(handle_, batched_state_, batch, options_.preallocate_width,
                                                           options_.preallocate_height, NVJPEG_CSS_444,
                                                           options_.planar ? NVJPEG_OUTPUT_RGB : NVJPEG_OUTPUT_RGBI);
    note("nvjpegDecodeBatchedPreAllocate(" + std::to_string(batch) + " x " +
         std::to_string(options_.preallocate_width) + "x" + std::to_string(options_.preallocate_height) +
         "): " + nvjpeg_status_name(status));  // a hint
  }
  // HYBRID (Huffman on the host thread) as nvImageCodec and DALI create it; DEFAULT where a
  // handle refuses it (what this decoder used before).
  nvjpegStatus_t hybrid = api_->DecoderCreate(handle_, NVJPEG_BACKEND_HYBRID, &decoders_[0]);
  note(std::string("nvjpegDecoderCreate(HYBRID): ") + nvjpeg_status_name(hybrid));
  if (hybrid != NVJPEG_STATUS_SUCCESS)
    check_nvjpeg(api_->DecoderCreate(handle_, NVJPEG_BACKEND_DEFAULT, &decoders_[0]), "nvjpegDecoderCreate(default)");
  if (options_.gpu_hybrid_pixels >= 0) {
    nvjpegStatus_t status = api_->DecoderCreate(handle_, NVJPEG_BACKEND_GPU_HYBRID, &decoders_[1]);
    note(std::string("nvjpegDecoderCreate(GPU_HYBRID): ") + nvjpeg_status_name(status));
    if (status != NVJPEG_STATUS_SUCCESS) decoders_[1] = nullptr;
  }
  check_cuda(cuda_->StreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  for (cudaEvent_t* event : {&consumer_ready_, &done_, &scratch_ready_})  // only streams wait on these
    check_cuda(cuda_->EventCreateWithFlags(event, cudaEventDisableTiming), "cudaEventCreate");
  for (cudaEvent_t* event : {&stream_idle_, &hardware_done_, &staging_[0].free, &staging_[1].free})
    check_cuda(cuda_->EventCreateWithFlags(event, kHostWaitedEvent), "cudaEventCreate");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int count = options_.cuda_workers > 0 ? std::min(options_.cuda_workers, 64) : std::min(kMaxWorkers, int(cores));
  workers_.resize(size_t(count));
  for (CudaWorker& worker : workers_) create_worker(worker);
  note("CUDA path: " + std::to_string(count) + " worker threads" +
       (decoders_[1] ? ", GPU-assisted Huffman above " + std::to_string(options_.gpu_hybrid_pixels) + " pixels" : ""));
  pool_threads_ = std::make_unique<WorkerPool>(count);
  copy_threads_ = std::make_unique<WorkerPool>(std::min(4, count));
}

void NvjpegDecoder::create_worker(CudaWorker& worker) {
  check_nvjpeg(api_->BufferDeviceCreateV2(handle_, &device_allocator_, &worker.device_buffer), "device buffer");
  check_nvjpeg(api_->DecodeParamsCreate(handle_, &worker.params), "nvjpegDecodeParamsCreate");
  check_nvjpeg(api_->DecodeParamsSetOutputFormat(worker.params, NVJPEG_OUTPUT_RGBI), "set output format");
  for (Page& page : worker.pages) {
    for (int d = 0; d < 2; ++d) {
      if (!decoders_[d]) continue;
      check_nvjpeg(api_->DecoderStateCreate(handle_, decoders_[d], &page.state[d]), "nvjpegDecoderStateCreate");
      check_nvjpeg(api_->StateAttachDeviceBuffer(page.state[d], worker.device_buffer), "attach device buffer");
    }
    check_nvjpeg(api_->BufferPinnedCreateV2(handle_, &pinned_allocator_, &page.pinned), "pinned buffer");
    check_nvjpeg(api_->JpegStreamCreate(handle_, &page.stream), "nvjpegJpegStreamCreate");
  }
  check_cuda(cuda_->StreamCreateWithFlags(&worker.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cuda_->EventCreateWithFlags(&worker.device_done, kHostWaitedEvent), "cudaEventCreate");
  for (Page& page : worker.pages)
    check_cuda(cuda_->EventCreateWithFlags(&page.pinned_free, kHostWaitedEvent), "cudaEventCreate");
}

NvjpegDecoder::~NvjpegDecoder() { release(); }

void NvjpegDecoder::release() {
  pool_threads_.reset();  // joins the threads (no call is running: the decoder is going away)
  copy_threads_.reset();
  int current = 0;
  // At interpreter exit the CUDA runtime may already be gone: then there is nothing to free.
  if (cuda_->GetDevice(&current) == cudaErrorCudartUnloading) return;
  cuda_->SetDevice(device_);  // no throwing guard: release() runs in the destructor
  if (stream_) cuda_->StreamSynchronize(stream_);
  for (CudaWorker& worker : workers_) {
    if (worker.stream) cuda_->StreamSynchronize(worker.stream);
    for (Page& page : worker.pages) {
      for (nvjpegJpegState_t state : page.state)
        if (state) api_->JpegStateDestroy(state);
      if (page.pinned) api_->BufferPinnedDestroy(page.pinned);
      if (page.stream) api_->JpegStreamDestroy(page.stream);
      if (page.pinned_free) cuda_->EventDestroy(page.pinned_free);
    }
    if (worker.device_buffer) api_->BufferDeviceDestroy(worker.device_buffer);
    if (worker.params) api_->DecodeParamsDestroy(worker.params);
    if (worker.device_done) cuda_->EventDestroy(worker.device_done);
    if (worker.stream) cuda_->StreamDestroy(worker.stream);
  }
  workers_.clear();
  for (nvjpegJpegStream_t s : streams_) api_->JpegStreamDestroy(s);
  streams_.clear();
  for (nvjpegJpegDecoder_t& decoder : decoders_) {
    if (decoder) api_->DecoderDestroy(decoder);
    decoder = nullptr;
  }
  if (batched_state_) api_->JpegStateDestroy(batched_state_);
  if (handle_) api_->Destroy(handle_);
  for (StagingSlot& slot : staging_) {
    if (slot.data) cuda_->FreeHost(slot.data);
    if (slot.free) cuda_->EventDestroy(slot.free);
    slot = StagingSlot{};
  }
  for (cudaEvent_t e : {consumer_ready_, stream_idle_, hardware_done_, done_, scratch_ready_})
    if (e) cuda_->EventDestroy(e);
  if (stream_) cuda_->StreamDestroy(stream_);
  if (pool_) cuda_->MemPoolDestroy(pool_);
  batched_state_ = nullptr, handle_ = nullptr, stream_ = nullptr, pool_ = nullptr;
  consumer_ready_ = stream_idle_ = hardware_done_ = done_ = scratch_ready_ = nullptr;
  cuda_->SetDevice(current);
}

NvjpegStats NvjpegDecoder::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<JpegResult> NvjpegDecoder::decode(const std::vector<JpegRequest>& requests, cudaStream_t consumer) {
  Range range("nvjpeg.decode");
  const double began = clock_ms_();
  const Staged staged = stage(requests);  // before the mutex: it overlaps another call's batch
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceGuard guard(*cuda_, device_);
  stats_ = NvjpegStats{};
  stats_.staged_bytes = staged.bytes;
  stats_.stage_us = staged.us;
  const long long mallocs = mallocs_, frees = frees_, malloc_bytes = malloc_bytes_;
  std::vector<JpegResult> results(requests.size(), JpegResult{JpegOutcome::Decoded, "", JpegPath::None});
  while (streams_.size() < requests.size()) {
    nvjpegJpegStream_t s = nullptr;
    check_nvjpeg(api_->JpegStreamCreate(handle_, &s), "nvjpegJpegStreamCreate");
    streams_.push_back(s);
  }
  // Order our private stream after everything the caller queued (output allocations included).
  check_cuda(cuda_->EventRecord(consumer_ready_, consumer), "cudaEventRecord");
  check_cuda(cuda_->StreamWaitEvent(stream_, consumer_ready_, 0), "cudaStreamWaitEvent");
  try {
    decode_ordered(requests, staged, &results);
    check_cuda(cuda_->EventRecord(done_, stream_), "cudaEventRecord");
    check_cuda(cuda_->StreamWaitEvent(consumer, done_, 0), "cudaStreamWaitEvent");
  } catch (...) {
    // Writes already queued into the caller's tensors finish before the error reaches Python,
    // which frees those tensors (their memory may be handed out again at once).
    for (CudaWorker& worker : workers_) cuda_->StreamSynchronize(worker.stream);
    cuda_->StreamSynchronize(stream_);
    throw;
  }
  stats_.device_mallocs = mallocs_ - mallocs;
  stats_.device_frees = frees_ - frees;
  stats_.device_malloc_bytes = malloc_bytes_ - malloc_bytes;
  stats_.total_us = (clock_ms_() - began) * 1e3;
  return results;
}

bool NvjpegDecoder::hardware_candidate(const JpegRequest& r, size_t i, std::vector<JpegResult>* results) {
  int unsupported = 1;  // 0 means supported
  if (!hardware_ || api_->DecodeBatchedSupported(handle_, streams_[i], &unsupported) != NVJPEG_STATUS_SUCCESS ||
      unsupported != 0)
    return false;
  // The engines get only streams that are whole: one cut inside its scan would fail the batch,
  // or decode to pixels where the CPU answers 422 (DALI #3113). By default a structural check
  // (no host pass over the scan data); full_parse runs nvjpegJpegStreamParse, as DALI does.
  if (options_.full_parse) {
    nvjpegStatus_t status = api_->JpegStreamParse(handle_, r.data, r.size, 0, 0, streams_[i]);
    if (status != NVJPEG_STATUS_SUCCESS) {
      (*results)[i] = {JpegOutcome::Fallback, std::string("parse: ") + nvjpeg_status_name(status), JpegPath::None};
      return false;
    }
  } else if (!structurally_whole(r.data, r.size)) {
    (*results)[i] = {JpegOutcome::Fallback, "parse: no scan or no EOI marker (cut short)", JpegPath::None};
    return false;
  }
  return true;
}

void NvjpegDecoder::decode_ordered(const std::vector<JpegRequest>& requests, const Staged& staged,
                                   std::vector<JpegResult>* results_out) {
  std::vector<JpegResult>& results = *results_out;
  std::vector<size_t> hardware_items, cuda_items;
  const int unit = int(std::max(1u, engines_ * cores_));
  int candidates = 0;
  {
    Range range("nvjpeg.prepare");
    const double began = clock_ms_();
    for (size_t i = 0; i < requests.size(); ++i) {
      const JpegRequest& r = requests[i];
      if (r.orientation < 1 || r.orientation > 8 || r.width <= 0 || r.height <= 0 || !r.out || !r.data) {
        results[i] = {JpegOutcome::Fallback, "invalid request", JpegPath::None};
        continue;
      }
      nvjpegStatus_t status = api_->JpegStreamParseHeader(handle_, r.data, r.size, streams_[i]);
      unsigned w = 0, h = 0, components = 0;
      if (status == NVJPEG_STATUS_SUCCESS) status = api_->JpegStreamGetFrameDimensions(streams_[i], &w, &h);
      if (status == NVJPEG_STATUS_SUCCESS) status = api_->JpegStreamGetComponentsNum(streams_[i], &components);
      if (status != NVJPEG_STATUS_SUCCESS) {
        results[i] = {JpegOutcome::Fallback, std::string("header: ") + nvjpeg_status_name(status), JpegPath::None};
        continue;
      }
      if (int(w) != r.width || int(h) != r.height || components != 3) {
        results[i] = {JpegOutcome::Fallback, "header disagrees with the probe", JpegPath::None};
        continue;
      }
      if (hardware_candidate(r, i, &results)) {
        hardware_items.push_back(i);
      } else if (results[i].outcome == JpegOutcome::Decoded) {
        cuda_items.push_back(i);
      }
    }
    // The split: the largest candidates stay on the engines, the smallest move to the CUDA path.
    auto larger = [&](size_t a, size_t b) { return pixels(requests[a]) > pixels(requests[b]); };
    std::stable_sort(hardware_items.begin(), hardware_items.end(), larger);
    double area = 0;
    for (size_t i : hardware_items) area += pixels(requests[i]);
    candidates = int(hardware_items.size());
    stats_.size_class = SplitScheduler::size_class(candidates ? area / candidates : 0);
    stats_.load = scheduler_.load(stats_.size_class);
    const int k = scheduler_.hardware_count(candidates, stats_.size_class, unit);
    cuda_items.insert(cuda_items.end(), hardware_items.begin() + k, hardware_items.end());
    hardware_items.resize(size_t(k));
    std::stable_sort(cuda_items.begin(), cuda_items.end(), larger);  // large first: the threads finish together
    stats_.prepare_us = (clock_ms_() - began) * 1e3;
  }
  // Images that need orienting (or interleaving) decode into stream-ordered scratch, the rest
  // straight into the caller's tensor.
  std::vector<uint8_t*> targets(requests.size(), nullptr);
  Scratch scratch(*cuda_, pool_, stream_);
  for (size_t i : hardware_items) {
    const JpegRequest& r = requests[i];
    targets[i] = r.orientation == 1 && !options_.planar ? r.out : scratch.allocate(size_t(pixels(r)) * 3);
  }
  for (size_t i : cuda_items) {
    const JpegRequest& r = requests[i];
    targets[i] = r.orientation == 1 ? r.out : scratch.allocate(size_t(pixels(r)) * 3);
  }
  // The workers' streams order after the caller's work and these stream-ordered allocations
  // (the pool may hand out memory that earlier work on our stream still reads), not after the
  // engines' batch queued next.
  check_cuda(cuda_->EventRecord(scratch_ready_, stream_), "cudaEventRecord");
  // The split is timed (the host waits for the engines' event) only where it can move: batches
  // larger than one round of the engines, under an adaptive or an actual split.
  const bool timed = candidates > unit && (scheduler_.adaptive() || int(hardware_items.size()) < candidates);
  std::string failure;
  bool submitted = true;
  const double t0 = clock_ms_();
  if (!hardware_items.empty()) submitted = submit_hardware(requests, hardware_items, staged, targets, &failure);
  // Should anything below throw, the workers finish (and their streams drain) before `targets`
  // and the scratch they write go away.
  struct JoinOnExit {
    NvjpegDecoder* self;
    bool armed;
    ~JoinOnExit() {
      if (!armed) return;
      try {
        self->pool_threads_->wait();
      } catch (...) {  // already failing: the first error is the one that propagates
      }
      for (CudaWorker& worker : self->workers_) self->cuda_->StreamSynchronize(worker.stream);
    }
  };
  JoinOnExit join_on_exit{this, true};
  start_cuda(requests, cuda_items, targets, &results, timed);
  if (submitted && !hardware_items.empty() && timed) {
    Range range("nvjpeg.hardware_wait");
    check_cuda(cuda_->EventSynchronize(hardware_done_), "cudaEventSynchronize");
    stats_.hardware_ms = clock_ms_() - t0;
  }
  stats_.cuda_ms = finish_cuda();
  if (!submitted) {  // the whole engines' batch failed: the CUDA path retries each image
    start_cuda(requests, hardware_items, targets, &results, false);
    finish_cuda();
    for (size_t i : hardware_items)
      if (results[i].outcome == JpegOutcome::Fallback) results[i].reason = failure + "; " + results[i].reason;
  } else {
    for (size_t i : hardware_items) results[i].path = JpegPath::Hardware;
    if (timed) scheduler_.observe(stats_.size_class, stats_.hardware_ms, stats_.cuda_ms);
  }
  join_on_exit.armed = false;
  stats_.hardware_items = submitted ? int(hardware_items.size()) : 0;
  Range range("nvjpeg.join");
  for (const std::vector<size_t>* items : {&hardware_items, &cuda_items}) {
    for (size_t i : *items) {
      const JpegRequest& r = requests[i];
      if (targets[i] == r.out || results[i].outcome != JpegOutcome::Decoded) continue;
      if (options_.planar && results[i].path == JpegPath::Hardware) {
        check_cuda(cuda_->PlanarToInterleaved(targets[i], r.out, r.height, r.width, r.orientation, stream_),
                   "interleave kernel");
      } else {
        check_cuda(cuda_->Orient(targets[i], r.out, r.height, r.width, 3, r.orientation, stream_), "orient kernel");
      }
    }
  }
}

NvjpegDecoder::Staged NvjpegDecoder::stage(const std::vector<JpegRequest>& requests) {
  Staged staged;
  staged.data.assign(requests.size(), nullptr);
  if (!options_.pinned_staging || !hardware_) return staged;
  Range range("nvjpeg.stage");
  const double began = clock_ms_();
  std::vector<size_t> offsets(requests.size() + 1, 0);
  for (size_t i = 0; i < requests.size(); ++i) offsets[i + 1] = offsets[i] + (requests[i].data ? requests[i].size : 0);
  {  // a slot no other call holds; two calls may stage at once, into different slots
    std::unique_lock<std::mutex> lock(staging_mutex_);
    staging_free_.wait(lock, [this] { return !staging_[0].held || !staging_[1].held; });
    staged.slot = staging_[staging_next_].held ? staging_next_ ^ 1 : staging_next_;
    staging_[staged.slot].held = true;
    staging_next_ = staged.slot ^ 1;
  }
  staged.owner = this;
  StagingSlot& slot = staging_[staged.slot];
  // The slot's previous batch has read it: then it may be rewritten or regrown. This and the
  // copy run outside the decoder's mutex, while another call's batch may be on the engines.
  DeviceGuard guard(*cuda_, device_);
  check_cuda(cuda_->EventSynchronize(slot.free), "cudaEventSynchronize");
  if (slot.capacity < offsets.back()) {
    const size_t capacity = std::max(offsets.back(), slot.capacity * 2);
    if (slot.data) check_cuda(cuda_->FreeHost(slot.data), "cudaFreeHost");
    slot.data = nullptr;
    slot.capacity = 0;
    void* p = nullptr;
    check_cuda(cuda_->HostAlloc(&p, capacity, cudaHostAllocDefault), "cudaHostAlloc (staging)");
    slot.data = static_cast<uint8_t*>(p);
    slot.capacity = capacity;
  }
  auto copy = [&](int, size_t i) {
    if (requests[i].data) std::memcpy(slot.data + offsets[i], requests[i].data, requests[i].size);
  };
  if (offsets.back() >= (8u << 20) && copy_threads_->size() > 1) {
    std::lock_guard<std::mutex> lock(copy_mutex_);  // large batches: several threads copy
    copy_threads_->run(requests.size(), copy);
  } else {
    for (size_t i = 0; i < requests.size(); ++i) copy(0, i);
  }
  for (size_t i = 0; i < requests.size(); ++i)
    if (requests[i].data) staged.data[i] = slot.data + offsets[i];
  staged.bytes = (long long)offsets.back();
  staged.us = (clock_ms_() - began) * 1e3;
  return staged;
}

NvjpegDecoder::Staged::~Staged() {
  if (!owner) return;
  std::lock_guard<std::mutex> lock(owner->staging_mutex_);
  owner->staging_[slot].held = false;
  owner->staging_free_.notify_one();
}

bool NvjpegDecoder::submit_hardware(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items,
                                    const Staged& staged, const std::vector<uint8_t*>& targets, std::string* failure) {
  Range range("nvjpeg.hardware");
  const double began = clock_ms_();
  const int n = int(items.size());
  const int staged_slot = staged.slot;
  std::vector<const unsigned char*> data(items.size());
  std::vector<size_t> lengths(items.size());
  std::vector<nvjpegImage_t> destinations(items.size());
  for (int k = 0; k < n; ++k) {
    const JpegRequest& r = requests[items[size_t(k)]];
    uint8_t* target = targets[items[size_t(k)]];
    const uint8_t* pinned = staged.data[items[size_t(k)]];
    data[size_t(k)] = pinned ? pinned : r.data;
    lengths[size_t(k)] = r.size;
    nvjpegImage_t& d = destinations[size_t(k)];
    d = nvjpegImage_t{};
    if (options_.planar) {
      const size_t plane = size_t(r.width) * size_t(r.height);
      for (int c = 0; c < 3; ++c) {
        d.channel[c] = target + size_t(c) * plane;
        d.pitch[c] = size_t(r.width);
      }
    } else {
      d.channel[0] = target;
      d.pitch[0] = size_t(r.width) * 3;
    }
  }
  // The engines neither order themselves after earlier work on the stream nor let the batched
  // state be reinitialised while a batch runs: the host waits for everything queued so far (the
  // previous batch, the caller's allocations, our scratch) before touching the state.
  check_cuda(cuda_->EventRecord(stream_idle_, stream_), "cudaEventRecord");
  check_cuda(cuda_->EventSynchronize(stream_idle_), "cudaEventSynchronize");
  nvjpegStatus_t status = NVJPEG_STATUS_SUCCESS;
  if (n != batched_size_) {  // 0 after a failed batch: nvJPEG then wants a fresh initialisation
    status = api_->DecodeBatchedInitialize(handle_, batched_state_, n, 1,
                                           options_.planar ? NVJPEG_OUTPUT_RGB : NVJPEG_OUTPUT_RGBI);
    batched_size_ = status == NVJPEG_STATUS_SUCCESS ? n : 0;
  }
  if (status == NVJPEG_STATUS_SUCCESS)
    status = api_->DecodeBatched(handle_, batched_state_, data.data(), lengths.data(), destinations.data(), stream_);
  if (staged_slot >= 0)  // the slot is free again once what was queued so far has run
    check_cuda(cuda_->EventRecord(staging_[staged_slot].free, stream_), "cudaEventRecord");
  check_cuda(cuda_->EventRecord(hardware_done_, stream_), "cudaEventRecord");
  stats_.hardware_submit_us = (clock_ms_() - began) * 1e3;
  if (status == NVJPEG_STATUS_SUCCESS) return true;
  batched_size_ = 0;
  // Whatever the engines had started writing into the same outputs finishes before the retry.
  check_cuda(cuda_->StreamSynchronize(stream_), "cudaStreamSynchronize");
  *failure = std::string("hardware batch: ") + nvjpeg_status_name(status);
  return false;
}

void NvjpegDecoder::start_cuda(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items,
                               const std::vector<uint8_t*>& targets, std::vector<JpegResult>* results, bool timed) {
  for (CudaWorker& worker : workers_) {
    worker.used = false;
    worker.started_ms = worker.busy_ms = 0;
    worker.gpu_hybrid = 0;
  }
  stats_.cuda_items += int(items.size());
  if (items.empty()) return;
  for (CudaWorker& worker : workers_)  // each worker's writes order after the caller's work and our scratch
    check_cuda(cuda_->StreamWaitEvent(worker.stream, scratch_ready_, 0), "cudaStreamWaitEvent");
  const int device = device_;
  auto task = [this, device, &requests, &items, &targets, results](int w, size_t k) {
    Range range("nvjpeg.cuda");
    DeviceGuard guard(*cuda_, device);
    CudaWorker& worker = workers_[size_t(w)];
    if (!worker.used) worker.started_ms = clock_ms_();
    worker.used = true;
    const size_t i = items[k];
    decode_on_worker(worker, requests[i], targets[i], &(*results)[i]);
  };
  // Timed: each worker measures from its first item until its last device phase is done (a
  // worker's own clock: the split compares durations, which all start at the submission).
  auto finished = [this, device, timed](int w) {
    CudaWorker& worker = workers_[size_t(w)];
    if (!worker.used || !timed) return;
    DeviceGuard guard(*cuda_, device);
    check_cuda(cuda_->EventSynchronize(worker.device_done), "cudaEventSynchronize");
    worker.busy_ms = clock_ms_() - worker.started_ms;
  };
  pool_threads_->start(items.size(), task, finished);
}

void NvjpegDecoder::decode_on_worker(CudaWorker& worker, const JpegRequest& r, uint8_t* target, JpegResult* result) {
  Page& page = worker.pages[worker.next_page];
  worker.next_page ^= 1;
  nvjpegStatus_t status = api_->JpegStreamParse(handle_, r.data, r.size, 0, 0, page.stream);
  int d = 0;  // HYBRID: Huffman on this thread; GPU_HYBRID: GPU-assisted, for large baseline images
  if (status == NVJPEG_STATUS_SUCCESS && decoders_[1] && pixels(r) > double(options_.gpu_hybrid_pixels)) {
    nvjpegJpegEncoding_t encoding = NVJPEG_ENCODING_UNKNOWN;
    int unsupported = 1;
    if (api_->JpegStreamGetJpegEncoding(page.stream, &encoding) == NVJPEG_STATUS_SUCCESS &&
        encoding == NVJPEG_ENCODING_BASELINE_DCT &&
        api_->DecoderJpegSupported(decoders_[1], page.stream, worker.params, &unsupported) == NVJPEG_STATUS_SUCCESS &&
        unsupported == 0)
      d = 1;
  }
  // The page's pinned buffer is refilled once the device phase that last read it is done.
  check_cuda(cuda_->EventSynchronize(page.pinned_free), "cudaEventSynchronize");
  if (status == NVJPEG_STATUS_SUCCESS) status = api_->StateAttachPinnedBuffer(page.state[d], page.pinned);
  if (status == NVJPEG_STATUS_SUCCESS)
    status = api_->DecodeJpegHost(handle_, decoders_[d], page.state[d], worker.params, page.stream);
  // The transfer and device phase share the worker's device buffer with its previous image.
  check_cuda(cuda_->EventSynchronize(worker.device_done), "cudaEventSynchronize");
  if (status == NVJPEG_STATUS_SUCCESS)
    status = api_->DecodeJpegTransferToDevice(handle_, decoders_[d], page.state[d], page.stream, worker.stream);
  if (status == NVJPEG_STATUS_SUCCESS) {
    nvjpegImage_t destination{};
    destination.channel[0] = target;
    destination.pitch[0] = size_t(r.width) * 3;
    status = api_->DecodeJpegDevice(handle_, decoders_[d], page.state[d], &destination, worker.stream);
  }
  check_cuda(cuda_->EventRecord(worker.device_done, worker.stream), "cudaEventRecord");
  check_cuda(cuda_->EventRecord(page.pinned_free, worker.stream), "cudaEventRecord");
  if (status != NVJPEG_STATUS_SUCCESS) {
    *result = {JpegOutcome::Fallback, std::string("CUDA path decode: ") + nvjpeg_status_name(status), JpegPath::None};
  } else {
    *result = {JpegOutcome::Decoded, "", JpegPath::Cuda};
    worker.gpu_hybrid += d;
  }
}

double NvjpegDecoder::finish_cuda() {
  pool_threads_->wait();
  double slowest = 0;
  for (CudaWorker& worker : workers_) {
    if (!worker.used) continue;
    slowest = std::max(slowest, worker.busy_ms);
    stats_.gpu_hybrid_items += worker.gpu_hybrid;
    check_cuda(cuda_->StreamWaitEvent(stream_, worker.device_done, 0), "cudaStreamWaitEvent");
  }
  return slowest;
}

}  // namespace cuda
}  // namespace lazymedia
