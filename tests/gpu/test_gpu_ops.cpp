// Every op of kernels/ops.h on CUDA against the CPU kernel on the same inputs: each case of the
// shared op-case table (tests/unit/ops/op_cases.h) runs on the CPU and on GPU 0, and every tensor
// and scalar it leaves must agree within the case's tolerance (fp32, or derived from the rounding
// of 16-bit attention operands; plus one bf16 ulp, kBf16Tol, in its bf16-storage variant). Then
// what the table cannot express: copies between host and device, the data-dependent errors (token
// ids, targets) the CPU kernels raise, and which attention implementation runs. Skips (with the
// reason) where no GPU is visible.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "tests/unit/ops/op_cases.h"

namespace llmt::test {
namespace {

// The table's cases, then their bf16-storage variants.
const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> all = [] {
    std::vector<OpCase> v = op_cases();
    const size_t n = v.size();
    for (size_t i = 0; i < n; ++i) v.push_back(bf16_storage(v[i]));
    return v;
  }();
  return all;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const OpCase& c : cases()) names.push_back(c.name);
  return names;
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipping GPU test";
    backend_ = make_device_backend({DeviceKind::cuda, 0});
    alloc_ = std::make_unique<Allocator>(*backend_);
  }
  std::unique_ptr<DeviceBackend> backend_;
  std::unique_ptr<Allocator> alloc_;
};

class GpuOp : public Gpu, public ::testing::WithParamInterface<std::string> {};

TEST_P(GpuOp, MatchesCpuKernel) {
  for (const OpCase& c : cases()) {
    if (c.name != GetParam()) continue;
    const OpResult want = run_case(c);
    const OpResult got = run_case(c, alloc_.get());
    EXPECT_TRUE(results_close(got, want, c.tol)) << c.op;
    EXPECT_EQ(alloc_->stats().live_total, 0);
    return;
  }
  FAIL() << "no case " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuOp, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

// ops::copy across devices (host -> device -> device -> host) is exact.
TEST_F(Gpu, CopyBetweenHostAndDevice) {
  HostTensor src = uniform({1000, 3}, 1), back({1000, 3});
  Buffer a = alloc_->allocate_tensor(src.shape(), DType::f32, MemCategory::other);
  Buffer b = alloc_->allocate_tensor(src.shape(), DType::f32, MemCategory::other);
  const Tensor da = a.tensor(src.shape(), DType::f32), db = b.tensor(src.shape(), DType::f32);
  ops::copy(da, src.t());
  ops::copy(db, da);
  ops::copy(back.t(), db);
  EXPECT_TRUE(bits_equal(back, src));
}

// The range errors the CPU kernels throw, raised from device data.
TEST_F(Gpu, BadTokenAndTargetIdsThrow) {
  HostTensor ids = tokens({2, 5}, 10, 1);
  ids.i32()[7] = 10;  // outside [0, 10)
  Buffer tok = alloc_->allocate_tensor(ids.shape(), DType::i32, MemCategory::other);
  Buffer wte = alloc_->allocate_tensor({10, 4}, DType::f32, MemCategory::other);
  Buffer out = alloc_->allocate_tensor({2, 5, 10}, DType::f32, MemCategory::other);
  Buffer losses = alloc_->allocate_tensor({10}, DType::f32, MemCategory::other);
  const Tensor t = tok.tensor(ids.shape(), DType::i32);
  ops::copy(t, ids.t());
  try {
    ops::embedding_forward(out.tensor({2, 5, 4}, DType::f32), t, wte.tensor({10, 4}, DType::f32),
                           Tensor());
    ADD_FAILURE() << "embedding_forward accepted token id 10 of a vocabulary of 10";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 10 at index 7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::softmax_cross_entropy(losses.tensor({10}, DType::f32), Tensor(),
                                          out.tensor({10, 10}, DType::f32), t.view({10}), 1.0f),
               Error);
}

// Which attention the op-case table's attention cases run (so their comparisons test cuDNN where
// they mean to): fp32 operands the flash kernel; bf16 GQA and f16 MQA cuDNN's fused attention;
// a head dim cuDNN refuses (12, not a multiple of 8) the flash kernel. A build without cuDNN runs
// the flash kernel everywhere and says so (cmake/cudnn.cmake).
TEST_F(Gpu, AttentionPathFollowsOperandsAndShape) {
  EXPECT_EQ(cuda::attention_path(2, 70, 4, 2, 16, DType::f32), "flash: operands f32");
  const std::string gqa = cuda::attention_path(2, 70, 4, 2, 16, DType::bf16);
  if (gqa.find("no cuDNN") != std::string::npos) GTEST_SKIP() << gqa;
  EXPECT_EQ(gqa, "cudnn");
  EXPECT_EQ(cuda::attention_path(1, 130, 2, 1, 64, DType::f16), "cudnn");
  const std::string refused = cuda::attention_path(1, 33, 2, 2, 12, DType::bf16);
  EXPECT_EQ(refused.rfind("flash: head dim 12", 0), 0u) << refused;
}

// A CUDA tensor and a host tensor in one op are refused, not read across devices.
TEST_F(Gpu, MixedDevicesAreRefused) {
  HostTensor host = uniform({16}, 1);
  Buffer dev = alloc_->allocate_tensor({16}, DType::f32, MemCategory::other);
  EXPECT_THROW(ops::add_inplace(dev.tensor({16}, DType::f32), host.t()), Error);
}

}  // namespace
}  // namespace llmt::test
