// Row-parallel loops shared by the CPU kernel drivers (host_ops.cpp) and the level coder
// (levels.cpp): plain std::threads started per call, the calling thread working too.
#pragma once

#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

namespace lazymedia {

// Runs fn(row) for rows [0, rows) on up to `threads` threads, in contiguous blocks; the calling
// thread runs the last block. A thread that cannot start (EAGAIN: no address space for its stack,
// a process thread limit; or no memory for the handle) is not an error: the calling thread runs
// the blocks no thread took, so the result is the same and nothing unwinds past a joinable thread.
// A thread takes at least `min_rows_per_thread` rows.
template <typename Fn>
void parallel_blocks(int rows, int threads, int min_rows_per_thread, Fn fn) noexcept {
  if (rows <= 0) return;
  threads = std::max(1, std::min(threads, rows / min_rows_per_thread));
  const int block = (rows + threads - 1) / threads;
  const int blocks = (rows + block - 1) / block;
  auto run_block = [&](int t) {
    const int end = std::min(rows, (t + 1) * block);
    for (int r = t * block; r < end; ++r) fn(r);
  };
  std::vector<std::thread> pool;
  int started = 0;
  try {
    pool.reserve(size_t(blocks - 1));
    for (; started < blocks - 1; ++started) pool.emplace_back(run_block, started);
  } catch (const std::exception&) {
    // std::system_error or std::bad_alloc: the vector is unchanged, the started threads run on
  }
  for (int t = started; t < blocks; ++t) run_block(t);
  for (auto& th : pool) th.join();
}

// Blocks smaller than this many pixel rows are not worth a thread start (~20 us).
inline constexpr int kMinRowsPerThread = 32;

template <typename Fn>
void parallel_rows(int rows, int threads, Fn fn) noexcept {
  parallel_blocks(rows, threads, kMinRowsPerThread, fn);
}

}  // namespace lazymedia
