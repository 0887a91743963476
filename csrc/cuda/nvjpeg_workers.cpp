#include "nvjpeg_workers.h"

namespace lazymedia {
namespace cuda {

WorkerPool::WorkerPool(int threads) {
  threads_.reserve(size_t(threads));
  for (int w = 0; w < threads; ++w) threads_.emplace_back([this, w] { loop(w); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::start(size_t count, Task task, Finished finished) {
  std::lock_guard<std::mutex> lock(mutex_);
  task_ = std::move(task);
  finished_ = std::move(finished);
  count_ = count;
  next_ = 0;
  error_ = nullptr;
  busy_ = int(threads_.size());
  ++generation_;
  wake_.notify_all();
}

void WorkerPool::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return busy_ == 0; });
  task_ = nullptr;
  finished_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void WorkerPool::loop(int worker) {
  unsigned seen = 0;
  for (;;) {
    Task task;
    Finished finished;
    size_t count = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
      finished = finished_;
      count = count_;
    }
    try {
      for (size_t k = next_++; k < count; k = next_++) task(worker, k);
      if (finished) finished(worker);
    } catch (...) {
      next_ = count;  // the others stop taking items: the call is failing
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_ == 0) idle_.notify_all();
  }
}

}  // namespace cuda
}  // namespace lazymedia
