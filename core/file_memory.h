// File-backed memory for training state moved off the device ([offload] "nvme", docs/offload.md):
// the state lives in files under one directory, mapped into the address space, so kernels,
// collectives and checkpoints read and write it as memory while the page cache brings it in and
// writes it back; what stays resident is bounded by streaming over it in chunks.
//
// Each region is a file of its own, unlinked as soon as it is opened (no name is left in the
// directory: nothing remains after any exit, a signal or a crash included; the blocks are freed
// when the mapping goes), its whole size reserved on the disk at once (posix_fallocate, so a full
// disk fails here, naming the directory and the bytes, never later as a fault on a write), and
// mapped shared; it reads as zeros until written.
//
// Streaming: read_ahead asks the kernel to start reading a range (MADV_WILLNEED) while the
// caller works on the one before; drop queues a range to the store's own thread, which writes it
// back and takes it out of memory (msync, MADV_DONTNEED, POSIX_FADV_DONTNEED: neither the
// process's resident set nor the page cache keeps it); drop waits while more than four chunks
// are queued, so what the caller wrote but the disk has not taken stays bounded. Only whole
// pages inside the range are dropped, and ranges outside every region are ignored, so callers
// pass any tensor.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace llmt {

class FileStore {
 public:
  // Regions go to files in `dir` (which must exist and be writable: Error naming it otherwise);
  // `chunk_bytes` is the streaming granule callers use (FileStore::chunk_bytes).
  FileStore(std::string dir, size_t chunk_bytes);
  ~FileStore();
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  // A zero-filled region of `bytes` in a new file; `what` names it in errors. Throws Error when
  // the disk cannot hold it.
  void* map(size_t bytes, const std::string& what);
  void unmap(void* p);

  void read_ahead(const void* p, size_t n);
  void drop(const void* p, size_t n);
  // Blocks until every drop queued so far is done.
  void wait_dropped();

  bool holds(const void* p) const;
  size_t chunk_bytes() const { return chunk_; }
  const std::string& dir() const { return dir_; }
  int64_t mapped_bytes() const;
  // Bytes read back from or written to the files (the kernel's counts for this process,
  // /proc/self/io read_bytes + write_bytes), for the I/O bandwidth a run reached.
  static int64_t process_io_bytes();
  // The process's peak resident set (/proc/self/status VmHWM), bytes; 0 where unknown.
  static int64_t peak_resident_bytes();

 private:
  struct Region {
    size_t bytes;
    int fd;
  };
  // The page-aligned part of [p, p+n) inside a region (inward: whole pages only; outward: every
  // page touched), or {nullptr, 0}.
  std::pair<char*, size_t> pages(const void* p, size_t n, bool inward) const;
  void writer();

  std::string dir_;
  size_t chunk_;
  mutable std::mutex mu_;
  std::map<char*, Region> regions_;  // by start address
  std::condition_variable cv_, idle_;
  std::deque<std::pair<char*, size_t>> queue_;
  static constexpr size_t kQueued = 4;  // drop blocks while more chunks than this wait
  size_t queued_ = 0;                   // bytes in queue_
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace llmt
