// Allocator accounting (live and peak per category), Buffer views and checks, HostBuffer reuse.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "core/allocator.h"

namespace llmt {
namespace {

int64_t live(const Allocator& a, MemCategory c) {
  return a.stats().live[static_cast<int>(c)];
}
int64_t peak(const Allocator& a, MemCategory c) {
  return a.stats().peak[static_cast<int>(c)];
}

TEST(Allocator, TracksLiveAndPeakPerCategory) {
  auto backend = make_cpu_backend();
  Allocator alloc(*backend);
  Buffer p = alloc.allocate(1000, MemCategory::params);
  {
    Buffer a1 = alloc.allocate(300, MemCategory::activations);
    Buffer a2 = alloc.allocate(500, MemCategory::activations);
    EXPECT_EQ(live(alloc, MemCategory::activations), 800);
  }
  Buffer a3 = alloc.allocate(200, MemCategory::activations);
  EXPECT_EQ(live(alloc, MemCategory::params), 1000);
  EXPECT_EQ(live(alloc, MemCategory::activations), 200);
  EXPECT_EQ(peak(alloc, MemCategory::activations), 800);
  EXPECT_EQ(alloc.stats().peak_total, 1800);
  EXPECT_EQ(alloc.stats().live_total, 1200);
  Buffer moved = std::move(p);
  EXPECT_EQ(live(alloc, MemCategory::params), 1000);
  moved.reset();
  EXPECT_EQ(live(alloc, MemCategory::params), 0);
  alloc.reset_peaks();
  EXPECT_EQ(peak(alloc, MemCategory::activations), 200);
}

TEST(Allocator, BuffersAreZeroedAndViewsChecked) {
  auto backend = make_cpu_backend();
  Allocator alloc(*backend);
  Buffer b = alloc.allocate_tensor({4, 6}, DType::f32, MemCategory::other);
  Tensor t = b.tensor({4, 6}, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.f32()[i], 0.0f);
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape, Shape({2, 6}));
  EXPECT_EQ(r.f32(), t.f32() + 6);
  EXPECT_THROW(b.tensor({5, 6}, DType::f32), Error);
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.i32(), Error);
}

TEST(Check, MessageNamesFileLineAndContext) {
  try {
    int seq = 10;
    LLMT_CHECK(seq % 4 == 0, "seq_len=", seq, " is not divisible by 4");
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("test_allocator.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("seq % 4 == 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("seq_len=10 is not divisible by 4"), std::string::npos) << msg;
  }
}

TEST(Device, CudaRequestWithoutCudaSaysWhy) {
  if (cuda_built_in()) GTEST_SKIP() << "CUDA is built in";
  try {
    make_device_backend({DeviceKind::cuda, 0});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
}

TEST(Device, SelectionFollowsTheSetting) {
  EXPECT_EQ(select_device("cpu", 2), (Device{DeviceKind::cpu, 0}));
  EXPECT_EQ(select_device("cuda", 2), (Device{DeviceKind::cuda, 2}));  // the rank's local GPU
  EXPECT_THROW(select_device("gpu", 0), Error);
  if (!cuda_built_in()) {  // "auto" without CUDA is the CPU (with CUDA: the GPU if one is visible)
    EXPECT_EQ(select_device("auto", 2), (Device{DeviceKind::cpu, 0}));
  }
  EXPECT_NE(built_in_backends().find("cpu"), std::string::npos);
  EXPECT_EQ(built_in_backends().find("cuda") != std::string::npos, cuda_built_in());
}

// HostBuffer asks its backend for host memory once and keeps it while it is large enough, so a
// checkpoint staging buffer reused from save to save is allocated (and, on a GPU, pinned) once.
class CountingBackend final : public DeviceBackend {
 public:
  Device device() const override { return inner->device(); }
  void* allocate(size_t bytes) override { return inner->allocate(bytes); }
  void deallocate(void* p) override { inner->deallocate(p); }
  void memset_zero(void* p, size_t bytes) override { inner->memset_zero(p, bytes); }
  void copy_to_host(void* d, const void* s, size_t n) override { inner->copy_to_host(d, s, n); }
  void copy_from_host(void* d, const void* s, size_t n) override { inner->copy_from_host(d, s, n); }
  void copy(void* d, const void* s, size_t n) override { inner->copy(d, s, n); }
  void synchronize() override {}
  void* allocate_host(size_t bytes) override {
    ++host_allocs;
    return DeviceBackend::allocate_host(bytes);
  }
  void deallocate_host(void* p) override {
    ++host_frees;
    DeviceBackend::deallocate_host(p);
  }
  std::unique_ptr<DeviceBackend> inner = make_cpu_backend();
  int host_allocs = 0, host_frees = 0;
};

TEST(HostBuffer, ReservesOnceAndReturnsItsMemoryToItsBackend) {
  CountingBackend backend;
  HostBuffer a;
  EXPECT_EQ(a.data(), nullptr);
  a.reserve(backend, 1000);
  void* first = a.data();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  EXPECT_EQ(a.bytes(), 1000u);
  a.f32()[249] = 3.0f;      // the whole range is usable
  a.reserve(backend, 400);  // smaller: kept
  EXPECT_EQ(a.data(), first);
  EXPECT_EQ(backend.host_allocs, 1);
  a.reserve(backend, 4000);  // larger: replaced
  EXPECT_EQ(a.bytes(), 4000u);
  EXPECT_EQ(backend.host_allocs, 2);
  EXPECT_EQ(backend.host_frees, 1);
  HostBuffer b = std::move(a);  // moves ownership, allocates nothing
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.bytes(), 4000u);
  EXPECT_EQ(backend.host_allocs, 2);
  b.reset();
  EXPECT_EQ(backend.host_frees, 2);
  {
    HostBuffer c;
    c.reserve(backend, 8);
  }
  EXPECT_EQ(backend.host_allocs, 3);
  EXPECT_EQ(backend.host_frees, 3);  // freed by the destructor
}

}  // namespace
}  // namespace llmt
