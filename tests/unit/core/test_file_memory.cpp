// FileStore ([offload] "nvme"): regions read as zeros, keep what is written through a drop, leave
// no file behind, refuse what the disk cannot hold naming the directory; a drop takes the pages
// out of the resident set; the allocator puts only the buffers a setting offloads in the files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/allocator.h"
#include "core/check.h"
#include "core/file_memory.h"

namespace llmt {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() {
    std::string t = (fs::temp_directory_path() / "llmt-filestore-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

int64_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

TEST(FileStore, RegionsKeepWhatIsWrittenAndLeaveNoFile) {
  TempDir dir;
  {
    FileStore store(dir.path, 1 << 20);
    const size_t n = 3 * (1 << 20) + 123;  // no whole number of pages
    auto* p = static_cast<unsigned char*>(store.map(n, "test"));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 0) << i;
    EXPECT_TRUE(fs::is_empty(dir.path));  // unlinked from the start
    EXPECT_TRUE(store.holds(p) && store.holds(p + n - 1));
    EXPECT_FALSE(store.holds(&n));
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(i * 7 + 1);
    store.drop(p, n);
    store.drop(&n, sizeof n);  // outside every region: ignored
    store.wait_dropped();
    store.read_ahead(p, n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], static_cast<unsigned char>(i * 7 + 1)) << i;
    EXPECT_GE(store.mapped_bytes(), static_cast<int64_t>(n));
    store.unmap(p);
    EXPECT_EQ(store.mapped_bytes(), 0);
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(FileStore, DropTakesThePagesOutOfTheResidentSet) {
  TempDir dir;
  FileStore store(dir.path, 1 << 20);
  const size_t n = 64 << 20;
  auto* p = static_cast<char*>(store.map(n, "test"));
  const int64_t before = resident_bytes();
  std::memset(p, 1, n);
  const int64_t written = resident_bytes();
  EXPECT_GE(written - before, static_cast<int64_t>(n) * 9 / 10);
  store.drop(p, n);
  store.wait_dropped();
  EXPECT_LE(resident_bytes() - before, static_cast<int64_t>(n) / 10);
  EXPECT_EQ(p[n - 1], 1);
}

TEST(FileStore, RefusesWhatTheDiskCannotHoldNamingIt) {
  TempDir dir;
  FileStore store(dir.path, 1 << 20);
  try {
    store.map(size_t{1} << 52, "the optimizer state");
    FAIL() << "a 4 PiB file was reserved";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dir.path), std::string::npos) << what;
    EXPECT_NE(what.find("the optimizer state"), std::string::npos) << what;
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
  EXPECT_THROW(FileStore(dir.path + "/missing", 1 << 20), Error);
}

TEST(FileStore, AllocatorOffloadsOnlyTheSettingsTurnedOn) {
  TempDir dir;
  FileStore store(dir.path, 1 << 20);
  const std::unique_ptr<DeviceBackend> cpu = make_cpu_backend();
  Allocator alloc(*cpu);
  alloc.set_offload(&store, true, false);
  {
    Buffer opt = alloc.allocate(1000, MemCategory::optimizer, Offload::with_optimizer);
    Buffer par = alloc.allocate(2000, MemCategory::params, Offload::with_params);
    Buffer act = alloc.allocate(3000, MemCategory::activations);
    EXPECT_TRUE(store.holds(opt.data()));
    EXPECT_FALSE(store.holds(par.data()));
    EXPECT_FALSE(store.holds(act.data()));
    const MemStats& s = alloc.stats();
    EXPECT_EQ(s.live[static_cast<int>(MemCategory::optimizer)], 0);
    EXPECT_EQ(s.offloaded[static_cast<int>(MemCategory::optimizer)], 1000);
    EXPECT_EQ(s.live[static_cast<int>(MemCategory::params)], 2000);
    EXPECT_EQ(s.live_total, 5000);
  }
  EXPECT_EQ(store.mapped_bytes(), 0);
}

}  // namespace
}  // namespace llmt
