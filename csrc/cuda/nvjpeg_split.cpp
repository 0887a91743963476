#include "nvjpeg_split.h"

#include <algorithm>
#include <cmath>

namespace lazymedia {
namespace cuda {

SplitScheduler::SplitScheduler(double load) : adaptive_(load < 0) {
  for (int c = 0; c < kClasses; ++c) {
    load_[c] = adaptive_ ? 1.0 : std::min(load, 1.0);
    step_[c] = kFirstStep;
  }
}

int SplitScheduler::size_class(double mean_pixels) {
  if (mean_pixels < 0.5e6) return 0;
  return mean_pixels < 2.5e6 ? 1 : 2;
}

int SplitScheduler::hardware_count(int n, int size_class, int unit) const {
  if (n <= 0) return 0;
  const double load = this->load(size_class);
  if (load <= 0) return 0;
  int k = int(std::ceil(load * n - 1e-9));
  if (unit > 1) k = (k + unit - 1) / unit * unit;
  return std::max(1, std::min(k, n));
}

void SplitScheduler::observe(int size_class, double hardware_ms, double cuda_ms) {
  if (!adaptive_ || size_class < 0 || size_class >= kClasses) return;
  std::lock_guard<std::mutex> lock(mutex_);
  double& load = load_[size_class];
  double& step = step_[size_class];
  if (cuda_ms + kDeadBandMs < hardware_ms) {
    load = std::max(0.0, load - step);  // the CUDA path idled first: give it more
  } else if (hardware_ms + kDeadBandMs < cuda_ms) {
    load = std::min(1.0, load + step);  // the engines idled first
  } else {
    return;
  }
  step += 0.1 * (kFloorStep - step);
}

double SplitScheduler::load(int size_class) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return load_[size_class];
}

double SplitScheduler::step(int size_class) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return step_[size_class];
}

}  // namespace cuda
}  // namespace lazymedia
