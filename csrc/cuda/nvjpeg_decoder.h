// Batched JPEG decoding with nvJPEG into caller-owned device buffers (HWC RGB uint8).
//
// One decoder per device, guarded by a mutex (calls come with the GIL released). Each batch is
// split by nvjpegDecodeBatchedSupported: baseline single-scan images go to the hardware engines
// (A100/H100/H200/B200 NVJPG) through nvjpegDecodeBatched, the rest through the decoupled API
// (host Huffman phase on ping-pong pinned buffers, transfer, device phase). All work runs on a
// private stream; the caller's stream waits on an event at the end (no device-wide sync).
//
// Ordering rules (held by tests/test_engine_nvjpeg.py against recording fakes of both APIs):
// - a hardware candidate is parsed whole (nvjpegJpegStreamParse, not only its header) before it
//   joins the batch: a stream cut inside its scan data falls back to the CPU (which answers 422)
//   instead of failing the batch, or decoding to pixels on the engines;
// - the hardware batch is (re)initialised only after the host has waited for everything queued
//   before it, and again after any failed batch, not only when its size changes;
// - after a failed hardware batch the private stream is synchronised before the decoupled retry
//   writes the same outputs (the engines do not order themselves by stream);
// - the decoupled transfer of image k+1 waits for the device phase of image k (they share the
//   decoder state and device buffer); a pinned buffer is refilled only after the device phase
//   of the image that last used it; host phases may overlap earlier device phases;
// - handles are created with NVJPEG_FLAGS_BITSTREAM_STRICT, so a damaged stream is refused
//   (and falls back to the CPU decoder, which answers 422) instead of decoding to pixels, and
//   with NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION (libjpeg's chroma upsampling) where the
//   library accepts it.
// nvJPEG's device buffers come from a private stream-ordered pool that keeps what it freed
// (a release threshold), not from the device's default pool, which trims at every sync; a
// device without stream-ordered pools gets cudaMalloc/cudaFree instead. The host waits on
// blocking-sync events (it sleeps instead of spinning a core under the decoder's mutex).
// creation_log() says what each creation attempt returned (`lazymedia info` prints it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "nvjpeg_api.h"
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

struct JpegResult {
  JpegOutcome outcome;
  std::string reason;  // why the fallback, for logs and tests
};

class NvjpegDecoder {
 public:
  // Throws std::runtime_error (no device, no libnvjpeg, creation failure).
  NvjpegDecoder(int device, bool allow_hardware, const std::string& library_path);
  // The same over given API tables (the tests' recording fakes).
  NvjpegDecoder(const NvjpegApi* api, const CudaApi* cuda, int device, bool allow_hardware);
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
  // One line per creation attempt: the backend, flags and allocators tried, and the status.
  const std::string& creation_log() const { return creation_log_; }

 private:
  // Parses, routes and decodes every request on the private stream (decode() wraps it).
  void decode_ordered(const std::vector<JpegRequest>& requests, std::vector<JpegResult>* results);
  void decode_hardware(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items,
                       const std::vector<uint8_t*>& targets, std::vector<JpegResult>* results);
  void decode_decoupled(const std::vector<JpegRequest>& requests, const std::vector<size_t>& items,
                        const std::vector<uint8_t*>& targets, std::vector<JpegResult>* results);

  void create(bool allow_hardware);
  // nvjpegCreateExV2 with `backend`, first with the interpolating upsampling flag, then without.
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
  nvjpegJpegDecoder_t decoder_ = nullptr;
  nvjpegJpegState_t decoupled_state_ = nullptr;
  nvjpegBufferPinned_t pinned_[2] = {nullptr, nullptr};
  nvjpegBufferDevice_t device_buffer_ = nullptr;
  nvjpegDecodeParams_t params_ = nullptr;
  std::vector<nvjpegJpegStream_t> streams_;
  cudaStream_t stream_ = nullptr;
  // consumer_ready_: the caller's queued work (our stream waits on it); stream_idle_: everything on
  // our stream finished (the host waits on it before re-initialising the batched state); done_: the
  // batch's outputs written (the caller's stream waits on it); device_done_: the decoupled device
  // phase of the latest image; pinned_free_: each pinned staging buffer's last reader finished.
  cudaEvent_t consumer_ready_ = nullptr, stream_idle_ = nullptr, done_ = nullptr, device_done_ = nullptr;
  cudaEvent_t pinned_free_[2] = {nullptr, nullptr};
};

}  // namespace cuda
}  // namespace lazymedia
