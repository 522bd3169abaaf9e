// The CUDA device backend: allocation accounting and host <-> device copies round-trip exactly.
// Skips (with the reason) where no GPU is visible; where none is, checks the start-up refusal.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/cuda_backend.h"

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

// The other side, which runs wherever CI has no GPU: a CUDA build without a usable GPU says why
// at start, and train.device = "auto" falls back to the CPU.
TEST(CudaBuildWithoutGpu, SaysWhyAndAutoPicksTheCpu) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: nothing to refuse";
  EXPECT_EQ(select_device("auto", 0), (Device{DeviceKind::cpu, 0}));
  try {
    make_device_backend({DeviceKind::cuda, 0});
    ADD_FAILURE() << "a CUDA backend started without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("no NVIDIA driver") != std::string::npos ||
                msg.find("no CUDA GPU is visible") != std::string::npos)
        << msg;
    EXPECT_NE(msg.find("device = \"cpu\""), std::string::npos) << msg;
  }
  EXPECT_NE(built_in_backends().find("cuda (CUDA "), std::string::npos) << built_in_backends();
}

}  // namespace
}  // namespace llmt
