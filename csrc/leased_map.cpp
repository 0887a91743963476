#include "leased_map.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

namespace lazymedia {

namespace {

// Each lease holds a descriptor: at most a quarter of the process's descriptor limit, and 1024;
// past that, hits read their files instead.
size_t max_leases() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1024;
  return std::min<size_t>(1024, size_t(limit.rlim_cur) / 4);
}

// The signal a lease break is sent as (F_SETSIG), to the watcher thread alone (F_SETOWN_EX with
// F_OWNER_TID), which blocks it and takes it with sigtimedwait: no handler is installed, so no
// other thread sees it. Where real-time signals overflow their queue, the kernel sends SIGIO
// instead, which the watcher blocks and leaves; its poll then finds the pending break.
int break_signal() { return SIGRTMIN + 4; }
// How often the watcher asks every lease whether a break is pending (F_GETLEASE) with no signal.
constexpr time_t kPollSeconds = 1;

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

struct LeaseRegistry {
  std::mutex mutex;
  std::condition_variable watcher_ready;
  std::unordered_map<int, LeasedMap*> leased;  // by descriptor: maps still backed by their file
  pid_t watcher_process = 0;                   // the process whose watcher runs (a fork has none)
  pid_t watcher_thread = 0;
  size_t copied = 0, failed = 0;

  static LeaseRegistry& get() {
    // Never destroyed: maps may outlive static destruction at exit.
    static LeaseRegistry* registry = [] {
      auto* made = new LeaseRegistry();
      pthread_atfork([] { get().mutex.lock(); }, [] { get().mutex.unlock(); }, [] { get().after_fork_in_child(); });
      return made;
    }();
    return *registry;
  }

  // Swaps the map's file pages for an anonymous copy at the same address. Called with the mutex
  // held; false (the file's pages stay) where no memory can be had.
  static bool swap_in_copy(LeasedMap& map) {
    void* copy = mmap(nullptr, map.length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) return false;
    std::memcpy(copy, map.data_, map.size_);  // the lease still holds: every page is there
    if (mremap(copy, map.length_, map.length_, MREMAP_MAYMOVE | MREMAP_FIXED, map.data_) == MAP_FAILED) {
      munmap(copy, map.length_);
      return false;
    }
    return true;
  }

  // A break for `fd`: copy, then let the writer go. A stale signal (the map died and its
  // descriptor now leases another file, with no break pending) changes nothing.
  void on_break(int fd) {
    auto found = leased.find(fd);
    if (found == leased.end() || fcntl(fd, F_GETLEASE) == F_RDLCK) return;
    LeasedMap& map = *found->second;
    if (swap_in_copy(map))
      ++copied;
    else
      ++failed;  // the writer would wait out lease-break-time and then go on anyway
    leased.erase(found);
    fcntl(fd, F_SETLEASE, F_UNLCK);
    close(fd);
    map.fd_ = -1;
  }

  void watch() {
    sigset_t waited, blocked;
    sigemptyset(&waited);
    sigaddset(&waited, break_signal());
    // Every signal but the faults blocked: the process's signals go to its other threads (Python
    // handles them on the main thread), and an overflow's SIGIO, never taken, cannot end it.
    sigfillset(&blocked);
    for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT}) sigdelset(&blocked, fault);
    pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
    {
      std::lock_guard<std::mutex> lock(mutex);
      watcher_thread = pid_t(syscall(SYS_gettid));
    }
    watcher_ready.notify_all();
    const struct timespec poll = {kPollSeconds, 0};
    for (;;) {
      siginfo_t info;
      const int signal = sigtimedwait(&waited, &info, &poll);
      if (signal < 0 && errno == EINTR) continue;
      std::lock_guard<std::mutex> lock(mutex);
      if (signal == break_signal()) {
        on_break(info.si_fd);
      } else {  // a quiet interval: a break whose signal was lost to a full queue is still pending
        std::vector<int> fds;
        for (const auto& entry : leased) fds.push_back(entry.first);
        for (int fd : fds) on_break(fd);
      }
    }
  }

  bool ensure_watcher(std::unique_lock<std::mutex>& lock, std::string* reason) {
    if (watcher_process == getpid()) return true;
    watcher_thread = 0;
    try {
      std::thread([this] { watch(); }).detach();
    } catch (const std::system_error&) {
      *reason = "no thread for the lease watcher";
      return false;
    }
    watcher_ready.wait(lock, [this] { return watcher_thread != 0; });
    watcher_process = getpid();
    return true;
  }

  // In a forked child (one thread, the mutex held since the prepare handler): the leases belong to
  // the parent, whose watcher lets go after copying its own pages, so the child copies its own now
  // and drops its references to the descriptors (the parent's leases stay).
  void after_fork_in_child() {
    for (auto& entry : leased) {
      LeasedMap& map = *entry.second;
      if (swap_in_copy(map))
        ++copied;
      else
        ++failed;
      close(map.fd_);
      map.fd_ = -1;
    }
    leased.clear();
    watcher_process = 0;
    mutex.unlock();
  }
};

std::shared_ptr<LeasedMap> LeasedMap::lease(int fd, std::string* reason) {
  LeaseRegistry& registry = LeaseRegistry::get();
  std::unique_lock<std::mutex> lock(registry.mutex);
  if (registry.leased.size() >= max_leases()) {
    *reason = "the process holds " + std::to_string(registry.leased.size()) + " leases, its most";
    return nullptr;
  }
  if (!registry.ensure_watcher(lock, reason)) return nullptr;
  // A descriptor of our own on the caller's open file description, which the lease then belongs
  // to: the caller may close its descriptor at once.
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) {
    *reason = errno_text("dup");
    return nullptr;
  }
  struct f_owner_ex owner = {F_OWNER_TID, registry.watcher_thread};
  struct stat status;
  if (fcntl(own, F_SETOWN_EX, &owner) != 0 || fcntl(own, F_SETSIG, break_signal()) != 0) {
    *reason = errno_text("lease signal");
  } else if (fcntl(own, F_SETLEASE, F_RDLCK) != 0) {
    *reason = errno_text("lease");        // EAGAIN: open for writing; EACCES: not ours; EINVAL: no leases here
  } else if (fstat(own, &status) != 0) {  // after the lease: no cut can come between it and the map
    *reason = errno_text("fstat");
  } else if (!S_ISREG(status.st_mode) || status.st_size <= 0) {
    *reason = "not a regular file with bytes";
  } else {
    const size_t size = size_t(status.st_size);
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t length = (size + page - 1) / page * page;
    void* data = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, own, 0);
    if (data != MAP_FAILED) {
      std::shared_ptr<LeasedMap> map(new LeasedMap(own, data, size, length));
      registry.leased[own] = map.get();
      return map;
    }
    *reason = errno_text("mmap");
  }
  fcntl(own, F_SETLEASE, F_UNLCK);  // if taken: the caller's descriptor shares the description
  close(own);
  return nullptr;
}

LeasedMap::~LeasedMap() {
  LeaseRegistry& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (fd_ >= 0) {
    registry.leased.erase(fd_);
    fcntl(fd_, F_SETLEASE, F_UNLCK);
    close(fd_);
  }
  munmap(data_, length_);
}

LeasedMapStats leased_map_stats() {
  LeaseRegistry& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  LeasedMapStats stats;
  stats.live = registry.leased.size();
  stats.copied = registry.copied;
  stats.failed = registry.failed;
  return stats;
}

}  // namespace lazymedia
