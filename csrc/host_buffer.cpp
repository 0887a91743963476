#include "host_buffer.h"

#include <dlfcn.h>

#include <cstdlib>

namespace lazymedia {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kGranule = 64 * 1024;

// The three CUDA runtime entry points we need, resolved once from libcudart if it loads.
struct CudaRuntime {
  using GetDeviceCount = int (*)(int*);
  using HostAlloc = int (*)(void**, size_t, unsigned int);
  using FreeHost = int (*)(void*);
  GetDeviceCount get_device_count = nullptr;
  HostAlloc host_alloc = nullptr;
  FreeHost free_host = nullptr;
  bool usable = false;
  std::string reason;

  CudaRuntime() {
    void* lib = nullptr;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
    }
    if (!lib) {
      reason = "libcudart not found";
      return;
    }
    get_device_count = reinterpret_cast<GetDeviceCount>(dlsym(lib, "cudaGetDeviceCount"));
    host_alloc = reinterpret_cast<HostAlloc>(dlsym(lib, "cudaHostAlloc"));
    free_host = reinterpret_cast<FreeHost>(dlsym(lib, "cudaFreeHost"));
    if (!get_device_count || !host_alloc || !free_host) {
      reason = "libcudart lacks cudaHostAlloc";
      return;
    }
    int count = 0;
    if (get_device_count(&count) != 0 || count == 0) {
      reason = "no CUDA device";
      return;
    }
    usable = true;
  }
};

CudaRuntime& cuda_runtime() {
  static CudaRuntime runtime;
  return runtime;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

bool pinned_memory_available(std::string* reason) {
  CudaRuntime& rt = cuda_runtime();
  if (reason) *reason = rt.reason;
  return rt.usable;
}

HostBuffer::HostBuffer(std::shared_ptr<HostBufferPool> pool, void* ptr, size_t size, size_t capacity, bool pinned)
    : pool_(std::move(pool)), ptr_(ptr), size_(size), capacity_(capacity), pinned_(pinned) {}

HostBuffer::~HostBuffer() { pool_->give_back(ptr_, capacity_); }

HostBufferPool::HostBufferPool(size_t max_cached_bytes, bool pinned)
    : max_cached_bytes_(max_cached_bytes), pinned_(pinned && pinned_memory_available(nullptr)) {}

HostBufferPool::~HostBufferPool() {
  for (const Free& f : free_) deallocate(f.ptr);
}

void* HostBufferPool::allocate(size_t capacity) {
  if (pinned_) {
    void* p = nullptr;
    return cuda_runtime().host_alloc(&p, capacity, 0) == 0 ? p : nullptr;
  }
  return std::aligned_alloc(kPage, capacity);
}

void HostBufferPool::deallocate(void* ptr) {
  if (pinned_) {
    cuda_runtime().free_host(ptr);
  } else {
    std::free(ptr);
  }
}

std::shared_ptr<HostBuffer> HostBufferPool::acquire(size_t nbytes) {
  const size_t capacity = round_up(nbytes == 0 ? 1 : nbytes, kGranule);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Smallest cached buffer that fits without wasting more than half of it.
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity >= capacity && free_[i].capacity / 2 <= capacity &&
          (best == free_.size() || free_[i].capacity < free_[best].capacity))
        best = i;
    }
    if (best != free_.size()) {
      Free f = free_[best];
      free_.erase(free_.begin() + long(best));
      cached_bytes_ -= f.capacity;
      ++stats_.reuses;
      stats_.leased_bytes += f.capacity;
      ++stats_.leased_buffers;
      return std::make_shared<HostBuffer>(shared_from_this(), f.ptr, nbytes, f.capacity, pinned_);
    }
    ++stats_.allocations;
  }
  void* p = allocate(capacity);
  if (!p) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.leased_bytes += capacity;
    ++stats_.leased_buffers;
  }
  return std::make_shared<HostBuffer>(shared_from_this(), p, nbytes, capacity, pinned_);
}

void HostBufferPool::give_back(void* ptr, size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.leased_bytes -= capacity;
    --stats_.leased_buffers;
    if (cached_bytes_ + capacity <= max_cached_bytes_) {
      free_.push_back({ptr, capacity, Clock::now()});
      cached_bytes_ += capacity;
      return;
    }
  }
  deallocate(ptr);
}

size_t HostBufferPool::release_idle(double idle_seconds) {
  // Clamped so that the conversion to clock ticks is defined (NaN, negative, centuries).
  const double seconds = idle_seconds > 0 ? (idle_seconds < 1e9 ? idle_seconds : 1e9) : 0;
  std::vector<Free> idle;
  size_t released = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Clock::time_point cutoff =
        Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    size_t kept = 0;
    for (const Free& f : free_) {
      if (f.returned <= cutoff) {
        idle.push_back(f);
        released += f.capacity;
      } else {
        free_[kept++] = f;
      }
    }
    free_.resize(kept);
    cached_bytes_ -= released;
    stats_.released_bytes += released;
  }
  for (const Free& f : idle) deallocate(f.ptr);  // outside the lock: cudaFreeHost can take milliseconds
  return released;
}

HostBufferStats HostBufferPool::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  HostBufferStats s = stats_;
  s.cached_bytes = cached_bytes_;
  s.cached_buffers = free_.size();
  return s;
}

}  // namespace lazymedia
