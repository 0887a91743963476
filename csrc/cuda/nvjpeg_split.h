// How many of a batch's hardware candidates go to the engines; the rest go to the CUDA path
// (nvjpeg_workers.h) and run at the same time. The share ("load") is kept per size class and
// tuned from measured times, as nvImageCodec's adaptive load hint does: after every split batch,
// whichever side finished more than a dead band earlier takes more of the next batch, by a step
// that decays toward a floor. A fixed load is never tuned. Pure host code (tested on the CPU).
#pragma once

#include <cstddef>
#include <mutex>

namespace lazymedia {
namespace cuda {

class SplitScheduler {
 public:
  static constexpr int kClasses = 3;  // < 0.5 MP, < 2.5 MP (1080p), larger (4K)

  // `load` in [0, 1] fixed, or negative for adaptive (starting at 1: all on the engines).
  explicit SplitScheduler(double load);

  static int size_class(double mean_pixels);
  // Engine share of n candidates: ceil(load x n) rounded up to a multiple of `unit` (engines x
  // cores), capped at n. With n > 0 and load > 0 at least one image stays on the engines.
  int hardware_count(int n, int size_class, int unit) const;
  // Feeds one split batch's completion times (ms from submission): the engines' and the CUDA
  // path's. Only adaptive schedulers move.
  void observe(int size_class, double hardware_ms, double cuda_ms);

  double load(int size_class) const;
  double step(int size_class) const;
  bool adaptive() const { return adaptive_; }

  static constexpr double kDeadBandMs = 2.0, kFirstStep = 0.1, kFloorStep = 0.005;

 private:
  mutable std::mutex mutex_;
  bool adaptive_;
  double load_[kClasses];
  double step_[kClasses];
};

}  // namespace cuda
}  // namespace lazymedia
