// The dispatcher's argument checks: wrong shapes and dtypes are refused with the op and the
// tensors named, optional arguments may be absent, and CUDA tensors are refused until
// kernels/cuda exists.
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

// Runs f, expecting an llmt::Error whose message contains every one of `parts`.
template <typename F>
::testing::AssertionResult throws_with(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << p << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no llmt::Error thrown";
}

TEST(OpChecks, ShapeMismatchNamesOpAndShapes) {
  HostTensor inp({4, 8}), out({4, 8}), mean({4}), rstd({4}), weight({7});
  EXPECT_TRUE(throws_with(
      [&] {
        ops::layernorm_forward(out.t(), mean.t(), rstd.t(), inp.t(), weight.t(), Tensor(), 1e-5f);
      },
      {"op layernorm_forward", "weight", "(7,)", "(8,)"}));
  HostTensor w({5, 9}), o({4, 5});
  EXPECT_TRUE(throws_with([&] { ops::linear_forward(o.t(), inp.t(), w.t(), Tensor()); },
                          {"op linear_forward", "inp", "(4, 8)"}));
}

TEST(OpChecks, DtypeMismatchNamesOp) {
  HostTensor a({6}), b({6}, DType::i32), out({6});
  EXPECT_TRUE(throws_with([&] { ops::add(out.t(), a.t(), b.t()); }, {"op add", "i32", "f32"}));
  HostTensor logits({2, 5}), losses({2}), targets_f32({2});
  EXPECT_TRUE(throws_with(
      [&] { ops::softmax_cross_entropy(losses.t(), Tensor(), logits.t(), targets_f32.t(), 1); },
      {"op softmax_cross_entropy", "targets", "expected i32"}));
}

TEST(OpChecks, GemmOperandsMustBeAFloatType) {
  HostTensor inp({4, 8}), weight({3, 8}), out({4, 3});
  EXPECT_TRUE(
      throws_with([&] { ops::linear_forward(out.t(), inp.t(), weight.t(), Tensor(), DType::i32); },
                  {"op linear_forward", "operands must be f32, bf16 or f16, not i32"}));
  EXPECT_TRUE(throws_with(
      [&] {
        ops::linear_backward(Tensor(), weight.t(), Tensor(), out.t(), inp.t(), weight.t(),
                             DType::i32);
      },
      {"op linear_backward", "operands must be f32, bf16 or f16, not i32"}));
}

// The list ops name the entry at fault.
TEST(OpChecks, ListEntryMismatchNamesTheEntry) {
  HostTensor p0({6}), p1({5}), g1({4}), x({3}, DType::i32);
  const ops::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  const std::vector<ops::AdamWTensor> ts{{p0.t(), p0.t(), p0.t(), p0.t()},
                                         {p1.t(), g1.t(), p1.t(), p1.t()}};
  EXPECT_TRUE(throws_with([&] { ops::adamw_update(ts, hp); },
                          {"op adamw_update", "grad[1]", "(4,)", "param[1]", "(5,)"}));
  const std::vector<Tensor> xs{p0.t(), x.t()};
  EXPECT_TRUE(throws_with([&] { ops::sum_squares(xs); }, {"op sum_squares", "x[1]", "i32"}));
  EXPECT_TRUE(throws_with([&] { ops::has_nonfinite(xs); }, {"op has_nonfinite", "x[1]", "i32"}));
}

TEST(OpChecks, RequiredTensorMissing) {
  HostTensor inp({2, 3});
  EXPECT_TRUE(throws_with([&] { ops::gelu_forward(Tensor(), inp.t()); }, {"op gelu_forward"}));
}

// A rank's empty shard may have no memory: ops on it do nothing, without complaint.
TEST(OpChecks, EmptyTensorsWithoutMemory) {
  Tensor empty(nullptr, {0}, DType::f32), empty16(nullptr, {0}, DType::bf16);
  ops::adamw_update(empty, empty, empty, empty, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1});
  EXPECT_EQ(ops::sum_squares(empty), 0.0);
  EXPECT_FALSE(ops::has_nonfinite(empty));
  ops::copy(empty, empty);
  ops::fill_zero(empty16);
  ops::convert(empty16, empty);
  ops::init_normal(empty, 0.02f, 1, 2);
  HostTensor w({4, 8});
  ops::linear_forward(Tensor(nullptr, {0, 4}, DType::f32), Tensor(nullptr, {0, 8}, DType::f32),
                      w.t(), Tensor());
}

#ifndef LLMTRAIN_HAVE_CUDA
TEST(OpChecks, CudaTensorsAreRefusedWithoutCudaKernels) {
  HostTensor x({4});
  Tensor on_gpu = x.t();
  on_gpu.device = Device{DeviceKind::cuda, 0};
  EXPECT_TRUE(throws_with([&] { ops::gelu_forward(on_gpu, on_gpu); },
                          {"op gelu_forward: a CUDA tensor, but this build has no CUDA kernels"}));
  EXPECT_TRUE(throws_with([&] { ops::copy(on_gpu, x.t()); },
                          {"op copy: a CUDA tensor, but this build has no CUDA kernels"}));
}
#endif

TEST(OpChecks, TensorsOnDifferentDevicesAreRefused) {
  HostTensor x({4}), y({4});
  Tensor elsewhere = y.t();
  elsewhere.device = Device{DeviceKind::cuda, 1};
  EXPECT_TRUE(throws_with([&] { ops::add_inplace(x.t(), elsewhere); },
                          {"op add_inplace: tensors on different devices", "cuda:1", "cpu:0"}));
}

TEST(OpChecks, OutOfRangeOptions) {
  HostTensor x({2, 3, 4, 6}), y({2, 3, 4, 6});
  EXPECT_TRUE(throws_with([&] { ops::rope_forward(x.t(), 5, 0, 10000.0f); },
                          {"op rope_forward", "n_rot_heads=5"}));
  EXPECT_TRUE(throws_with([&] { ops::dropout_forward(y.t(), x.t(), 1.0f, 1, 2, 0); },
                          {"op dropout_forward", "p=1"}));
  HostTensor qkv({1, 4, 5, 8}), out({1, 4, 3, 8}), lse({1, 3, 4});
  EXPECT_TRUE(throws_with([&] { ops::attention_forward(out.t(), lse.t(), qkv.t(), 3, 2); },
                          {"op attention_forward", "n_head=3"}));
  HostTensor qkv1({1, 4, 3, 8}), out1({1, 4, 1, 8}), lse1({1, 1, 4});
  EXPECT_TRUE(
      throws_with([&] { ops::attention_forward(out1.t(), lse1.t(), qkv1.t(), 1, 1, DType::i32); },
                  {"op attention_forward", "operands=i32"}));
}

}  // namespace
}  // namespace llmt::test
