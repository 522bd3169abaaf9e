// FileStore: unlinked, fallocated, shared-mapped files and their streaming (file_memory.h).
#include "core/file_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace llmt {

namespace {
size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

std::string errno_text(int e) {
  return std::strerror(e);
}
}  // namespace

FileStore::FileStore(std::string dir, size_t chunk_bytes)
    : dir_(std::move(dir)), chunk_(std::max(chunk_bytes, page_size())) {
  if (access(dir_.c_str(), W_OK | X_OK) != 0)
    throw Error(detail::concat("offload.nvme_dir \"", dir_, "\": ", errno_text(errno),
                               " (the directory must exist and be writable)"));
  thread_ = std::thread([this] { writer(); });
}

FileStore::~FileStore() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (const auto& [p, r] : regions_) {
    munmap(p, r.bytes);
    close(r.fd);
  }
}

void* FileStore::map(size_t bytes, const std::string& what) {
  const size_t n = std::max(bytes, page_size());
  // O_TMPFILE: a file with no name from the start; where the file system lacks it, a named one
  // unlinked at once.
  int fd = open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string path = dir_ + "/llmtrain-offload-XXXXXX";
    fd = mkostemp(path.data(), O_CLOEXEC);
    if (fd < 0)
      throw Error(detail::concat("offload: cannot create a file in ", dir_, " for ", what, ": ",
                                 errno_text(errno)));
    unlink(path.c_str());
  }
  const int e = posix_fallocate(fd, 0, static_cast<off_t>(n));
  if (e != 0) {
    close(fd);
    throw Error(detail::concat("offload: ", dir_, " cannot hold ", bytes, " bytes of ", what,
                               " (offload.nvme_dir): ", errno_text(e)));
  }
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    throw Error(detail::concat("offload: cannot map ", bytes, " bytes of ", what, " from ", dir_,
                               ": ", errno_text(err)));
  }
  const std::lock_guard<std::mutex> lock(mu_);
  regions_[static_cast<char*>(p)] = {n, fd};
  return p;
}

void FileStore::unmap(void* p) {
  wait_dropped();  // (no drop of it may be in flight)
  const std::lock_guard<std::mutex> lock(mu_);
  const auto it = regions_.find(static_cast<char*>(p));
  if (it == regions_.end()) return;
  munmap(it->first, it->second.bytes);
  close(it->second.fd);
  regions_.erase(it);
}

bool FileStore::holds(const void* p) const {
  return pages(p, 1, false).first != nullptr;
}

int64_t FileStore::mapped_bytes() const {
  const std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [p, r] : regions_) n += static_cast<int64_t>(r.bytes);
  return n;
}

std::pair<char*, size_t> FileStore::pages(const void* p, size_t n, bool inward) const {
  const std::lock_guard<std::mutex> lock(mu_);
  const char* c = static_cast<const char*>(p);
  auto it = regions_.upper_bound(const_cast<char*>(c));
  if (it == regions_.begin()) return {nullptr, 0};
  --it;
  char* begin = it->first;
  char* end = begin + it->second.bytes;
  if (c < begin || c >= end) return {nullptr, 0};
  const size_t ps = page_size();
  const auto lo = reinterpret_cast<uintptr_t>(c);
  const auto hi = std::min(reinterpret_cast<uintptr_t>(c) + n, reinterpret_cast<uintptr_t>(end));
  const uintptr_t a = inward ? (lo + ps - 1) / ps * ps : lo / ps * ps;
  const uintptr_t b = inward ? hi / ps * ps : (hi + ps - 1) / ps * ps;
  if (b <= a) return {nullptr, 0};
  return {reinterpret_cast<char*>(a), b - a};
}

void FileStore::read_ahead(const void* p, size_t n) {
  const auto [a, len] = pages(p, n, false);
  if (a) madvise(a, len, MADV_WILLNEED);
}

void FileStore::drop(const void* p, size_t n) {
  const auto [a, len] = pages(p, n, true);
  if (!a) return;
  std::unique_lock<std::mutex> lock(mu_);
  queue_.emplace_back(a, len);
  queued_ += len;
  cv_.notify_all();
  // Bounded: at most kQueued chunks written back behind the caller at once.
  idle_.wait(lock, [this] { return queued_ <= kQueued * chunk_; });
}

void FileStore::wait_dropped() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

// The writer thread: each dropped range written back, then taken out of the process's pages
// and out of the page cache.
void FileStore::writer() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    const auto [a, len] = queue_.front();
    queue_.pop_front();
    busy_ = true;
    queued_ -= len;
    int fd = -1;
    off_t off = 0;
    auto it = regions_.upper_bound(a);
    if (it != regions_.begin()) {
      --it;
      fd = it->second.fd;
      off = static_cast<off_t>(a - it->first);
    }
    lock.unlock();
    msync(a, len, MS_SYNC);
    madvise(a, len, MADV_DONTNEED);
    if (fd >= 0) posix_fadvise(fd, off, static_cast<off_t>(len), POSIX_FADV_DONTNEED);
    lock.lock();
    busy_ = false;
    idle_.notify_all();
  }
}

namespace {
int64_t proc_field(const char* path, const std::string& key, int64_t scale) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream v(line.substr(key.size()));
    int64_t x = 0;
    v >> x;
    return x * scale;
  }
  return 0;
}
}  // namespace

int64_t FileStore::process_io_bytes() {
  return proc_field("/proc/self/io", "read_bytes:", 1) +
         proc_field("/proc/self/io", "write_bytes:", 1);
}

int64_t FileStore::peak_resident_bytes() {
  return proc_field("/proc/self/status", "VmHWM:", 1024);
}

}  // namespace llmt
