#include "leased_map.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
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
  std::unordered_map<int, LeasedMap*> leased;  // by descriptor: maps still backed by their file
  pid_t watcher_process = 0;                   // the process whose watcher runs (a fork has none)
  pid_t watcher_thread = 0;
  size_t copied = 0, failed = 0;

  static LeaseRegistry& get() {
    // Never destroyed: maps may outlive static destruction at exit.
    static LeaseRegistry* registry = [] {
      auto* made = new LeaseRegistry();
      pthread_atfork([] { get().before_fork(); }, [] { get().mutex.unlock(); }, [] { get().after_fork_in_child(); });
      return made;
    }();
    return *registry;
  }

  // Swaps the map's file pages for an anonymous copy at the same address (views keep their
  // pointers). Called with the mutex held. False, with the file's pages left in place, where no
  // memory can be had or the file can no longer be read whole (a lease the kernel broke after
  // lease-break-time, the file cut since): process_vm_readv reports a page past the file's end
  // as an error where a memcpy would fault.
  static bool swap_in_copy(LeasedMap& map) {
    void* copy = mmap(nullptr, map.length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) return false;
    struct iovec into = {copy, map.size_}, from = {map.data_, map.size_};
    const ssize_t got = process_vm_readv(getpid(), &into, 1, &from, 1, 0);
    bool whole = got == ssize_t(map.size_);
    if (got < 0 && (errno == ENOSYS || errno == EPERM)) {  // a seccomp profile without it: the lease holds
      std::memcpy(copy, map.data_, map.size_);
      whole = true;
    }
    if (!whole || mremap(copy, map.length_, map.length_, MREMAP_MAYMOVE | MREMAP_FIXED, map.data_) == MAP_FAILED) {
      munmap(copy, map.length_);
      return false;
    }
    return true;
  }

  // Copies the map and lets its lease go. A map that cannot be copied keeps its lease, so the
  // writer keeps waiting; the watcher's poll tries again, until the kernel's lease-break-time.
  bool copy_and_release(LeasedMap& map) {
    if (!swap_in_copy(map)) {
      ++failed;
      return false;
    }
    ++copied;
    leased.erase(map.fd_);
    fcntl(map.fd_, F_SETLEASE, F_UNLCK);
    close(map.fd_);
    map.fd_ = -1;
    return true;
  }

  // A break for `fd`. A stale signal (the map died and its descriptor now leases another file,
  // with no break pending: F_GETLEASE says F_RDLCK) changes nothing.
  void on_break(int fd) {
    auto found = leased.find(fd);
    if (found != leased.end() && fcntl(fd, F_GETLEASE) != F_RDLCK) copy_and_release(*found->second);
  }

  void watch(std::promise<pid_t>* started) {
    sigset_t waited, blocked;
    sigemptyset(&waited);
    sigaddset(&waited, break_signal());
    // Every signal but the faults blocked: the process's signals go to its other threads (Python
    // handles them on the main thread), and an overflow's SIGIO, never taken, cannot end it.
    sigfillset(&blocked);
    for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT}) sigdelset(&blocked, fault);
    pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
    started->set_value(pid_t(syscall(SYS_gettid)));
    const struct timespec poll = {kPollSeconds, 0};
    for (;;) {
      siginfo_t info;
      const int signal = sigtimedwait(&waited, &info, &poll);
      if (signal < 0 && errno == EINTR) continue;
      std::lock_guard<std::mutex> lock(mutex);
      if (signal == break_signal()) {
        on_break(info.si_fd);
      } else {  // a quiet interval: a break whose signal was lost to a full queue, or not yet copied
        std::vector<int> fds;
        for (const auto& entry : leased) fds.push_back(entry.first);
        for (int fd : fds) on_break(fd);
      }
    }
  }

  // Starts this process's watcher; called with the mutex held, which it keeps while it waits, so
  // no fork can come between the start and the wait.
  bool ensure_watcher(std::string* reason) {
    if (watcher_process == getpid()) return true;
    std::promise<pid_t> started;
    std::future<pid_t> tid = started.get_future();
    try {  // the thread owns the promise: it may still be inside set_value when the wait returns
      std::thread([this](std::promise<pid_t> promise) { watch(&promise); }, std::move(started)).detach();
    } catch (const std::system_error&) {
      *reason = "no thread for the lease watcher";
      return false;
    }
    watcher_thread = tid.get();
    watcher_process = getpid();
    return true;
  }

  // Before a fork, in the parent: a child holds neither the leases (they are the parent's) nor a
  // watcher, and would read the maps' file pages after the parent lets a writer cut the file, so
  // every map becomes an anonymous copy first, which the child then shares copy-on-write. One copy
  // per map in all: a map copied stays copied at the next fork.
  void before_fork() {
    mutex.lock();
    std::vector<LeasedMap*> maps;
    for (const auto& entry : leased) maps.push_back(entry.second);
    for (LeasedMap* map : maps) copy_and_release(*map);
  }

  // In a forked child: its watcher is the parent's thread, which it does not have. A map the
  // parent could not copy stays file-backed in the child (counted `failed` in the parent).
  void after_fork_in_child() {
    for (auto& entry : leased) {  // the child's reference only: the parent's lease stays
      close(entry.second->fd_);
      entry.second->fd_ = -1;
    }
    leased.clear();
    watcher_process = 0;
    mutex.unlock();
  }
};

std::shared_ptr<LeasedMap> LeasedMap::lease(int fd, std::string* reason) {
  LeaseRegistry& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (registry.leased.size() >= max_leases()) {
    *reason = "the process holds " + std::to_string(registry.leased.size()) + " leases, its most";
    return nullptr;
  }
  // Only tmpfs (/dev/shm): on a network or FUSE filesystem a lease sees only this machine's opens.
  struct statfs filesystem;
  if (fstatfs(fd, &filesystem) != 0 || filesystem.f_type != TMPFS_MAGIC) {
    *reason = "not on tmpfs";
    return nullptr;
  }
  if (!registry.ensure_watcher(reason)) return nullptr;
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
  munmap(data_, length_);  // first: a writer let go must find nothing of this process's mapped
  if (fd_ >= 0) {
    registry.leased.erase(fd_);
    fcntl(fd_, F_SETLEASE, F_UNLCK);
    close(fd_);
  }
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
