// The threads of nvJPEG's CUDA path (and of the parallel staging copies): a small pool owned by
// the decoder, never the engine's pool (an engine thread waiting on its own pool could deadlock).
// run() hands out item indices to whichever thread is free, so a few large images do not leave
// the other threads idle, and returns once every item is done; the first exception a task threw
// is rethrown on the caller's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace lazymedia {
namespace cuda {

class WorkerPool {
 public:
  using Task = std::function<void(int worker, size_t item)>;
  using Finished = std::function<void(int worker)>;

  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return int(threads_.size()); }
  // Starts task(worker, k) for k in [0, count) and returns at once; each thread then calls
  // finished(worker) once no item is left for it. wait() joins.
  void start(size_t count, Task task, Finished finished = nullptr);
  void wait();
  void run(size_t count, Task task) {
    start(count, std::move(task));
    wait();
  }

 private:
  void loop(int worker);

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  Task task_;
  Finished finished_;
  size_t count_ = 0;
  std::atomic<size_t> next_{0};
  unsigned generation_ = 0;
  int busy_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

}  // namespace cuda
}  // namespace lazymedia
