// Batched JPEG decoding with nvJPEG into caller-owned device buffers (HWC RGB uint8).
//
// One decoder per device, guarded by a mutex (calls come with the GIL released). A call runs in
// phases, each an NVTX range (nvjpeg.stage, .prepare, .hardware, .cuda, .join):
// - stage (before the decoder's mutex, so it overlaps another call's batch): on a device with
//   engines the bitstreams are copied (by a few threads for large batches) into one of two
//   reused pinned slots, so nvJPEG's copies to the device are asynchronous; a slot is rewritten
//   only after the batch that read it finished (its event), and two calls never hold one slot.
//   Staging is all that overlaps: under the mutex the host waits for everything queued on the
//   private stream (the previous call's join kernels and scratch frees) before the engines'
//   batch (see the ordering rules), as torchvision's decode waits for its stream at its start;
// - prepare: each image's header is parsed on the calling thread; images the engines support
//   (nvjpegDecodeBatchedSupported) are hardware candidates, the rest (progressive, or no
//   engines: L4, L40S, A10, RTX) go to the CUDA path;
// - split: the candidates are sorted by area and the smallest move to the CUDA path, so that
//   both run at once; SplitScheduler sizes the engines' share in multiples of engines x cores
//   and tunes it per size class from the measured completion times;
// - hardware: one nvjpegDecodeBatched over the engines' share, on the private stream, on one
//   cached handle and batched state;
// - cuda: the decoupled API on a pool of worker threads, each with its own states (HYBRID, and
//   GPU_HYBRID for baseline images above a pixel threshold), two pages of pinned buffer and
//   JpegStream, one device buffer, its own stream and events; Huffman decoding runs on every
//   worker at once;
// - join: the private stream waits on each worker's last event, orientation (and the planar
//   interleave) kernels run, the caller's stream waits on one event (no device-wide sync).
//
// Ordering rules (held by tests/test_engine_nvjpeg.py against recording fakes of both APIs):
// - a hardware candidate joins the batch only if it is whole (a scan, and an EOI at the end; with
//   full_parse, nvjpegJpegStreamParse over the whole stream): a stream cut inside its scan data
//   falls back to the CPU (which answers 422) instead of failing the batch; what else the engines
//   refuse fails the batch, which the CUDA path then retries image by image (STRICT handles);
// - the hardware batch is (re)initialised only after the host has waited for everything queued
//   before it, and again after any failed batch, not only when its size changes;
// - after a failed hardware batch the private stream is synchronised before the CUDA path
//   retries the same outputs (the engines do not order themselves by stream);
// - per worker: a page's pinned buffer is refilled only after that page's last device phase, and
//   a transfer waits for the worker's previous device phase (they share its device buffer); no
//   two workers share a state, buffer, stream or event;
// - a pinned staging slot is rewritten only after the event recorded behind its last batch;
// - handles are created with NVJPEG_FLAGS_BITSTREAM_STRICT, so a damaged stream is refused
//   (and falls back to the CPU decoder, which answers 422) instead of decoding to pixels.
// nvJPEG's device buffers come from a private stream-ordered pool that keeps what it freed
// (a release threshold), not from the device's default pool, which trims at every sync; a
// device without stream-ordered pools gets cudaMalloc/cudaFree instead. The host waits on
// blocking-sync events (it sleeps instead of spinning a core under the decoder's mutex).
// creation_log() says what each creation attempt returned (`lazymedia info` prints it).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "nvjpeg_api.h"
#include "nvjpeg_split.h"
#include "nvjpeg_workers.h"
#include "runtime_api.h"

namespace lazymedia {
namespace cuda {

struct JpegRequest {
  const uint8_t* data;
  size_t size;
  int width, height;  // as coded (before orientation), from the header probe
  int orientation;    // EXIF 1-8, applied on the GPU with the shared kernel
  uint8_t* out;       // device memory, (oriented height) x (oriented width) x 3, contiguous
};

enum class JpegOutcome : int {
  Decoded = 0,
  Fallback = 1,  // nvJPEG refused or failed on this image: decode it on the CPU instead
};

enum class JpegPath : int { None = 0, Hardware = 1, Cuda = 2 };

struct JpegResult {
  JpegOutcome outcome;
  std::string reason;  // why the fallback, for logs and tests
  JpegPath path = JpegPath::None;
};

// Knobs of the decoder. The defaults are the production choice; bench_gpu.py --grid varies them.
struct NvjpegOptions {
  bool interpolation = true;   // try NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION first
  bool planar = false;         // engines write planar RGB to scratch, one kernel interleaves (+orients)
  int preallocate_batch = 64;  // PreAllocate hint (rounded up to engines x cores); 0: none
  int preallocate_height = 1024, preallocate_width = 1024;
  uint64_t pool_threshold = 256ull << 20;     // the private pool's release threshold (bytes)
  bool full_parse = false;                    // parse hardware candidates whole on the host, else a structural check
  bool pinned_staging = true;                 // stage the engines' bitstreams in the pinned ring
  double hardware_load = -1;                  // engines' share of the candidates in [0, 1]; negative: adaptive
  int cuda_workers = 0;                       // CUDA path threads; 0: the cores, at most 16
  long long gpu_hybrid_pixels = 1000 * 1000;  // GPU-assisted Huffman above this many pixels; <0: never
};

// What the latest decode() did (microseconds of host time per phase, items per path, allocator calls).
struct NvjpegStats {
  double prepare_us = 0, stage_us = 0, hardware_submit_us = 0, hardware_ms = 0, cuda_ms = 0, total_us = 0;
  int hardware_items = 0, cuda_items = 0, gpu_hybrid_items = 0, size_class = 0;
  double load = 1;
  long long device_mallocs = 0, device_frees = 0, device_malloc_bytes = 0, staged_bytes = 0;
};

class NvjpegDecoder {
 public:
  // Throws std::runtime_error (no device, no libnvjpeg, creation failure).
  NvjpegDecoder(int device, bool allow_hardware, const std::string& library_path, const NvjpegOptions& options);
  // The same over given API tables (the tests' recording fakes), with an injected clock (ms).
  NvjpegDecoder(const NvjpegApi* api, const CudaApi* cuda, int device, bool allow_hardware,
                const NvjpegOptions& options, std::function<double()> clock_ms = nullptr);
  ~NvjpegDecoder();
  NvjpegDecoder(const NvjpegDecoder&) = delete;
  NvjpegDecoder& operator=(const NvjpegDecoder&) = delete;

  // Decodes every request; per-image problems come back as Fallback, batch-level CUDA failures
  // throw. `consumer` is the stream that will read the outputs.
  std::vector<JpegResult> decode(const std::vector<JpegRequest>& requests, cudaStream_t consumer);

  bool hardware() const { return hardware_; }
  unsigned engines() const { return engines_; }
  unsigned cores_per_engine() const { return cores_; }
  int device() const { return device_; }
  bool upsampling_interpolated() const { return interpolated_; }
  bool stream_ordered_pool() const { return pool_ != nullptr; }
  int cuda_workers() const { return int(workers_.size()); }
  const NvjpegOptions& options() const { return options_; }
  NvjpegStats stats();
  double load(int size_class) const { return scheduler_.load(size_class); }
  // One line per creation attempt: the backend, flags and allocators tried, and the status.
  const std::string& creation_log() const { return creation_log_; }

 private:
  struct Page {
    nvjpegJpegState_t state[2] = {nullptr, nullptr};  // HYBRID, GPU_HYBRID
    nvjpegBufferPinned_t pinned = nullptr;
    nvjpegJpegStream_t stream = nullptr;
    cudaEvent_t pinned_free = nullptr;  // the page's last device phase finished
  };
  struct CudaWorker {
    Page pages[2];
    int next_page = 0;
    nvjpegBufferDevice_t device_buffer = nullptr;
    nvjpegDecodeParams_t params = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t device_done = nullptr;   // the worker's latest device phase
    bool used = false;                   // in this call
    double started_ms = 0, busy_ms = 0;  // this call: its first item, and until its last device phase
    int gpu_hybrid = 0;
  };
  struct StagingSlot {
    uint8_t* data = nullptr;
    size_t capacity = 0;
    cudaEvent_t free = nullptr;  // the last batch that read the slot finished
    bool held = false;           // a call is filling it or has not yet queued its batch
  };
  // One call's pinned copies of its bitstreams (nullptr where not staged); releases its slot.
  struct Staged {
    NvjpegDecoder* owner = nullptr;
    int slot = -1;
    std::vector<const unsigned char*> data;
    long long bytes = 0;
    double us = 0;
    Staged() = default;
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;
    Staged(Staged&& other) noexcept
        : owner(std::exchange(other.owner, nullptr)),
          slot(other.slot),
          data(std::move(other.data)),
          bytes(other.bytes),
          us(other.us) {}
    ~Staged();
  };

  void decode_ordered(const std::vector<JpegRequest>& requests, const Staged& staged, std::vector<JpegResult>* results);
  bool hardware_candidate(const JpegRequest& r, size_t i, std::vector<JpegResult>* results);
  // Copies the bitstreams into a free pinned slot (with the engines; before the decoder's mutex).
  Staged stage(const std::vector<JpegRequest>& requests);
  // Submits the engines' batch; false when nvJPEG refused it (the stream is then synchronised).
  bool submit_hardware(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items, const Staged& staged,
                       const std::vector<uint8_t*>& targets, std::string* failure);
  void start_cuda(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items,
                  const std::vector<uint8_t*>& targets, std::vector<JpegResult>* results, bool timed);
  void decode_on_worker(CudaWorker& worker, const JpegRequest& r, uint8_t* target, JpegResult* result);
  double finish_cuda();

  void create(bool allow_hardware);
  void create_worker(CudaWorker& worker);
  bool create_handle(nvjpegBackend_t backend, bool v2_allocators);
  void note(const std::string& line);
  void release();
  void check_cuda(cudaError_t status, const char* what) const;
  static int device_malloc(void* self, void** ptr, size_t size, cudaStream_t stream);
  static int device_free(void* self, void* ptr, size_t size, cudaStream_t stream);
  static int pinned_malloc(void* self, void** ptr, size_t size, cudaStream_t stream);
  static int pinned_free(void* self, void* ptr, size_t size, cudaStream_t stream);

  std::mutex mutex_;
  int device_;
  const NvjpegApi* api_ = nullptr;
  const CudaApi* cuda_ = nullptr;
  NvjpegOptions options_;
  std::function<double()> clock_ms_;
  SplitScheduler scheduler_;
  cudaMemPool_t pool_ = nullptr;
  nvjpegDevAllocatorV2_t device_allocator_{};
  nvjpegPinnedAllocatorV2_t pinned_allocator_{};
  nvjpegHandle_t handle_ = nullptr;
  bool hardware_ = false;
  bool interpolated_ = false;
  std::string creation_log_;
  unsigned engines_ = 0, cores_ = 0;
  nvjpegJpegState_t batched_state_ = nullptr;
  int batched_size_ = 0;
  nvjpegJpegDecoder_t decoders_[2] = {nullptr, nullptr};  // HYBRID, GPU_HYBRID (may be absent)
  std::vector<CudaWorker> workers_;
  std::unique_ptr<WorkerPool> pool_threads_;
  std::unique_ptr<WorkerPool> copy_threads_;  // the staging copies (their own: stage() runs unlocked)
  std::mutex copy_mutex_;
  std::mutex staging_mutex_;
  std::condition_variable staging_free_;
  StagingSlot staging_[2];
  int staging_next_ = 0;
  std::vector<nvjpegJpegStream_t> streams_;
  cudaStream_t stream_ = nullptr;
  // consumer_ready_: the caller's queued work (our streams wait on it); stream_idle_: everything
  // on our stream finished (the host waits on it before re-initialising the batched state);
  // hardware_done_: the engines' batch finished (timed for the split); done_: the outputs
  // written (the caller's stream waits on it); scratch_ready_: the caller's work and this call's
  // scratch allocations (the workers' streams wait on it).
  cudaEvent_t consumer_ready_ = nullptr, stream_idle_ = nullptr, hardware_done_ = nullptr, done_ = nullptr;
  cudaEvent_t scratch_ready_ = nullptr;
  std::atomic<long long> mallocs_{0}, frees_{0}, malloc_bytes_{0};
  NvjpegStats stats_;
};

}  // namespace cuda
}  // namespace lazymedia
