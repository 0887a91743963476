// Maps of files that no later change to the file can reach: HostCache's zero-copy hits.
//
// Why: a map copies nothing, but a file cut while mapped kills its reader (SIGBUS, private maps
// included) and a rewrite would change what a caller holds. A LeasedMap holds a read lease on its
// file (fcntl F_SETLEASE): a process that opens the file for writing or truncates it waits until
// the holder lets go. The break is signalled to one watcher thread per process, which first swaps
// the map's pages for an anonymous copy at the same address (mremap: views keep their pointers and
// read the same bytes), then lets go; the writer then changes a file this process no longer maps.
// A forked child would hold neither the lease nor a watcher, so before a fork the parent copies
// every map it holds (once: a copied map stays copied) and the child shares the copies. Only files
// on tmpfs are leased: on a network or FUSE filesystem a lease sees only this machine's opens.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace lazymedia {

class LeasedMap {
 public:
  // Leases and maps (private, copy-on-write) the regular file open read-only at `fd`; the caller
  // keeps and closes its own descriptor. nullptr, with `reason`, where the file cannot be leased:
  // another process has it open for writing, another user owns it, leases are off or the
  // filesystem is not tmpfs, the per-process limit is reached, or it is empty. The caller then reads
  // the file instead.
  static std::shared_ptr<LeasedMap> lease(int fd, std::string* reason);
  ~LeasedMap();
  LeasedMap(const LeasedMap&) = delete;
  LeasedMap& operator=(const LeasedMap&) = delete;

  void* data() const { return data_; }
  // The file's size when leased: what stays readable, whatever happens to the file.
  size_t size() const { return size_; }

 private:
  LeasedMap(int fd, void* data, size_t size, size_t length) : fd_(fd), data_(data), size_(size), length_(length) {}
  friend struct LeaseRegistry;
  int fd_;  // -1 once a copy has replaced the file's pages (the lease is let go)
  void* data_;
  size_t size_, length_;  // length_: size_ rounded up to whole pages, the map's extent
};

struct LeasedMapStats {
  // live: maps still holding their lease; copied: maps a break (or a fork) swapped for a copy;
  // failed: tries to copy that failed (no memory, or the file already cut after the kernel broke
  // the lease at lease-break-time); the lease is kept and the copy tried again each second.
  size_t live = 0, copied = 0, failed = 0;
};
LeasedMapStats leased_map_stats();

}  // namespace lazymedia
