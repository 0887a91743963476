// Reusable host buffers that decoders write into and Python sees as torch tensors (buffer
// protocol, no copy). Pinned with cudaHostAlloc when a CUDA runtime and a device are present
// (libcudart is dlopen'ed, never linked), page-aligned otherwise.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lazymedia {

class HostBufferPool;

// One lease from the pool; returns its memory to the pool when destroyed.
class HostBuffer {
 public:
  HostBuffer(std::shared_ptr<HostBufferPool> pool, void* ptr, size_t size, size_t capacity, bool pinned);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  bool pinned() const { return pinned_; }

 private:
  std::shared_ptr<HostBufferPool> pool_;
  void* ptr_;
  size_t size_, capacity_;
  bool pinned_;
};

struct HostBufferStats {
  // cached: returned buffers kept for reuse; leased: buffers tensors still view; released: cached
  // bytes freed by release_idle since the pool was made.
  size_t allocations = 0, reuses = 0, cached_bytes = 0, cached_buffers = 0, leased_bytes = 0, leased_buffers = 0,
         released_bytes = 0;
};

class HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
 public:
  // Keeps at most `max_cached_bytes` of returned buffers for reuse. `pinned` asks for page-locked
  // memory; it silently falls back to pageable memory when no CUDA device is usable.
  HostBufferPool(size_t max_cached_bytes, bool pinned);
  ~HostBufferPool();
  // nullptr only when the allocation itself fails.
  std::shared_ptr<HostBuffer> acquire(size_t nbytes);
  bool pinned() const { return pinned_; }
  HostBufferStats stats();
  // Frees the cached buffers returned more than `idle_seconds` ago; returns the bytes freed.
  size_t release_idle(double idle_seconds);

 private:
  friend class HostBuffer;
  void give_back(void* ptr, size_t capacity);
  void* allocate(size_t capacity);
  void deallocate(void* ptr);

  using Clock = std::chrono::steady_clock;
  struct Free {
    void* ptr;
    size_t capacity;
    Clock::time_point returned;
  };
  std::mutex mutex_;
  std::vector<Free> free_;
  size_t max_cached_bytes_, cached_bytes_ = 0;
  bool pinned_;
  HostBufferStats stats_;
};

// Whether pinned allocation works in this process, and why not when it does not.
bool pinned_memory_available(std::string* reason);

}  // namespace lazymedia
