// bench_offload_io: [offload] "nvme"'s streaming (docs/offload.md) the way AdamW walks its
// offloaded state: a pass reads every chunk of a file-backed region, changes it (x += 1 over its
// floats, a memory-bound update) and writes it back, the next chunk read ahead and the written
// ones written behind. On the same folder, region and chunk size:
//   direct seq   O_DIRECT writes of the whole region, then O_DIRECT reads, no compute: the
//                disk's sequential ceiling (as bench_offload.sh's dd);
//   mmap         core/file_memory.h's FileStore as the runtime uses it (MADV_WILLNEED ahead;
//                msync, MADV_DONTNEED and POSIX_FADV_DONTNEED behind, on the store's thread);
//   O_DIRECT     pread/pwrite with O_DIRECT into a ring of 4 aligned chunk buffers, a reader
//                thread ahead and a writer thread behind (what a bounded-buffer pipeline, as
//                DeepSpeed's ZeRO-Infinity aio, does).
// Each of mmap and O_DIRECT fills the region once, then runs PASSES passes; printed: the median
// pass's GB/s of bytes read plus written, and O_DIRECT / mmap.
//
//   bench_offload_io DIR [GIB=4] [CHUNK_MIB=64] [PASSES=3]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/file_memory.h"
#include "scripts/bench/bench_timing.h"

namespace {

using llmt::bench::median_ms;
using llmt::bench::time_ms;

void update(char* p, size_t bytes) {
  float* x = reinterpret_cast<float*>(p);
  const size_t n = bytes / sizeof(float);
  for (size_t i = 0; i < n; ++i) x[i] += 1.0f;
}

// An unlinked file of `bytes` in dir, opened for O_DIRECT, its blocks reserved.
int open_direct(const std::string& dir, size_t bytes) {
  const std::string path = dir + "/llmtrain-bench-io-" + std::to_string(getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
  LLMT_CHECK(fd >= 0, "cannot open ", path, " with O_DIRECT");
  unlink(path.c_str());
  LLMT_CHECK(posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0, dir, " cannot hold ", bytes,
             " bytes");
  return fd;
}

void full_io(bool write, int fd, char* buf, size_t n, size_t at) {
  for (size_t done = 0; done < n;) {
    const ssize_t r = write ? pwrite(fd, buf + done, n - done, static_cast<off_t>(at + done))
                            : pread(fd, buf + done, n - done, static_cast<off_t>(at + done));
    LLMT_CHECK(r > 0, write ? "pwrite" : "pread", " failed at byte ", at + done);
    done += static_cast<size_t>(r);
  }
}

// One pass over the region through a ring of `slots` buffers: the reader fills slot i % slots
// with chunk i once the writer has emptied it, the caller updates it, the writer writes it back.
void direct_pass(int fd, size_t bytes, size_t chunk, std::vector<char*>& ring) {
  const size_t n = bytes / chunk, slots = ring.size();
  std::mutex mu;
  std::condition_variable cv;
  size_t read = 0, updated = 0, written = 0;  // chunks done by each
  std::thread reader([&] {
    for (size_t i = 0; i < n; ++i) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return i < written + slots; });
      }
      full_io(false, fd, ring[i % slots], chunk, i * chunk);
      std::lock_guard<std::mutex> lock(mu);
      read = i + 1;
      cv.notify_all();
    }
  });
  std::thread writer([&] {
    for (size_t i = 0; i < n; ++i) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return i < updated; });
      }
      full_io(true, fd, ring[i % slots], chunk, i * chunk);
      std::lock_guard<std::mutex> lock(mu);
      written = i + 1;
      cv.notify_all();
    }
  });
  for (size_t i = 0; i < n; ++i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return i < read; });
    }
    update(ring[i % slots], chunk);
    std::lock_guard<std::mutex> lock(mu);
    updated = i + 1;
    cv.notify_all();
  }
  reader.join();
  writer.join();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [GIB=4] [CHUNK_MIB=64] [PASSES=3]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const size_t gib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4;
  const size_t chunk = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64) << 20;
  const int passes = argc > 4 ? std::atoi(argv[4]) : 3;
  const size_t bytes = (gib << 30) / chunk * chunk;
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("region %.2f GB in %s, chunks of %zu MiB, %d passes after a fill\n", gb, dir.c_str(),
              chunk >> 20, passes);

  // O_DIRECT: the sequential ceiling, then the pipeline.
  const int fd = open_direct(dir, bytes);
  std::vector<char*> ring(4);
  for (char*& b : ring) {
    void* p = nullptr;
    LLMT_CHECK(posix_memalign(&p, 4096, chunk) == 0, "posix_memalign");
    b = static_cast<char*>(p);
    std::fill(b, b + chunk, 0);
  }
  const double w_ms = time_ms([&] {
    for (size_t at = 0; at < bytes; at += chunk) full_io(true, fd, ring[0], chunk, at);
  });
  const double r_ms = time_ms([&] {
    for (size_t at = 0; at < bytes; at += chunk) full_io(false, fd, ring[0], chunk, at);
  });
  std::printf("direct seq: write %.3f GB/s, read %.3f GB/s\n", gb / w_ms * 1e3, gb / r_ms * 1e3);
  std::vector<double> direct;
  for (int p = 0; p < passes; ++p)
    direct.push_back(time_ms([&] { direct_pass(fd, bytes, chunk, ring); }));
  close(fd);
  for (char* b : ring) std::free(b);

  // mmap through FileStore, as the runtime streams AdamW's state.
  std::vector<double> mapped;
  {
    llmt::FileStore store(dir, chunk);
    char* base = static_cast<char*>(store.map(bytes, "bench region"));
    const auto pass = [&] {
      for (size_t at = 0; at < bytes; at += chunk) {
        if (at + chunk < bytes) store.read_ahead(base + at + chunk, chunk);
        update(base + at, chunk);
        store.drop(base + at, chunk);
      }
      store.wait_dropped();
    };
    pass();  // the fill: written once, so later passes read data back from the disk
    for (int p = 0; p < passes; ++p) mapped.push_back(time_ms(pass));
    store.unmap(base);
  }
  const double d = 2 * gb / median_ms(direct) * 1e3, m = 2 * gb / median_ms(mapped) * 1e3;
  std::printf(
      "read + update + write, median pass: mmap %.3f GB/s, O_DIRECT %.3f GB/s "
      "(O_DIRECT / mmap %.2fx)\n",
      m, d, d / m);
  return 0;
}
