// The CUDA device backend: allocation accounting and host <-> device copies round-trip exactly.
// Skips (with the reason) where no GPU is visible.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/cuda/cuda_backend.h"

namespace llmt {
namespace {

class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipping GPU test";
  }
};

TEST_F(CudaDevice, CopiesRoundTripAndAreAccounted) {
  auto backend = make_device_backend({DeviceKind::cuda, 0});
  Allocator alloc(*backend);
  std::vector<float> host(1 << 20), back(host.size(), -1.0f);
  std::iota(host.begin(), host.end(), 0.5f);
  {
    Buffer a = alloc.allocate(host.size() * 4, MemCategory::params);
    Buffer b = alloc.allocate(host.size() * 4, MemCategory::activations);
    EXPECT_EQ(alloc.stats().live[static_cast<int>(MemCategory::params)], 4 << 20);
    backend->copy_from_host(a.data(), host.data(), host.size() * 4);
    backend->copy(b.data(), a.data(), host.size() * 4);
    backend->copy_to_host(back.data(), b.data(), host.size() * 4);
    backend->synchronize();
  }
  EXPECT_EQ(host, back);
  EXPECT_EQ(alloc.stats().live_total, 0);
  EXPECT_EQ(alloc.stats().peak_total, 8 << 20);
}

TEST_F(CudaDevice, AllocationIsZeroed) {
  auto backend = make_device_backend({DeviceKind::cuda, 0});
  Allocator alloc(*backend);
  Buffer a = alloc.allocate(4096, MemCategory::other);
  std::vector<unsigned char> back(4096, 0xff);
  backend->copy_to_host(back.data(), a.data(), back.size());
  EXPECT_EQ(std::count(back.begin(), back.end(), 0), 4096);
}

}  // namespace
}  // namespace llmt
