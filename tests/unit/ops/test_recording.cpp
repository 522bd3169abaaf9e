// ops::Recording (what `llmtrain plan` counts a model's step with): under it the ops check their
// arguments but run no kernel, so tensors on the meta device (address space without access) do
// not fault, and the bytes each op's tensors move are counted by the rules of ops.h; after it the
// kernels run again.
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/check.h"
#include "kernels/ops.h"

namespace llmt {
namespace {

TEST(Recording, CountsBytesAndRunsNoKernel) {
  const std::unique_ptr<DeviceBackend> meta = make_meta_backend();
  Allocator alloc(*meta);
  const int64_t N = 6, C = 8, V = 100;
  Buffer a = alloc.allocate_tensor({N, C}, DType::f32, MemCategory::other),
         b = alloc.allocate_tensor({N, C}, DType::bf16, MemCategory::other),
         w = alloc.allocate_tensor({V, C}, DType::f32, MemCategory::other),
         tok = alloc.allocate_tensor({2, 3}, DType::i32, MemCategory::other);
  const Tensor x = a.tensor({N, C}, DType::f32), y = b.tensor({N, C}, DType::bf16),
               wte = w.tensor({V, C}, DType::f32), tokens = tok.tensor({2, 3}, DType::i32);
  ops::OpTally t;
  {
    EXPECT_FALSE(ops::Recording::active());
    const ops::Recording rec(t);
    EXPECT_TRUE(ops::Recording::active());
    ops::gelu_forward(y, x);  // reads N C f32, writes N C bf16 (not widened: no kernel runs)
    EXPECT_DOUBLE_EQ(t.other_bytes, N * C * (4 + 2));
    ops::add_inplace(x, y);  // x read and written, y read
    EXPECT_DOUBLE_EQ(t.bytes["add_inplace"], N * C * (4 + 4 + 2));
    ops::linear_forward(x, y, wte.rows(0, C), Tensor());  // a matmul: counted apart
    EXPECT_DOUBLE_EQ(t.matmul_bytes, N * C * (4 + 2) + C * C * 4);
    ops::round_to(x, DType::bf16);  // rounding fp32-stored values: counted apart, read + written
    EXPECT_DOUBLE_EQ(t.rounding_bytes, 2 * N * C * 4);
    // An embedding table moves the rows of its tokens (6 of 100), not the table.
    const double before = t.other_bytes;
    ops::embedding_forward(x.view({2, 3, C}), tokens, wte, Tensor());
    EXPECT_DOUBLE_EQ(t.other_bytes - before, N * C * 4 + 6 * 4 + 6 * C * 4);
    EXPECT_EQ(t.ops, 5);
    // The checks still run: a wrong shape is refused as without the recording.
    EXPECT_THROW(ops::gelu_forward(y.rows(0, 2), x), Error);
  }
  EXPECT_FALSE(ops::Recording::active());
  // Recordings nest; the outer one sees nothing of the inner one's ops.
  ops::OpTally outer, inner;
  {
    const ops::Recording r1(outer);
    {
      const ops::Recording r2(inner);
      ops::gelu_forward(y, x);
    }
    EXPECT_TRUE(ops::Recording::active());
    EXPECT_EQ(outer.ops, 0);
    EXPECT_EQ(inner.ops, 1);
  }
}

TEST(Recording, KernelsRunAgainAfterIt) {
  const std::unique_ptr<DeviceBackend> cpu = make_cpu_backend();
  Allocator alloc(*cpu);
  Buffer a = alloc.allocate_tensor({4}, DType::f32, MemCategory::other);
  const Tensor x = a.tensor({4}, DType::f32);
  ops::OpTally t;
  {
    const ops::Recording rec(t);
    ops::fill(x, 3.0f);  // not run: the buffer keeps whatever it held
  }
  ops::fill(x, 2.0f);
  float host[4];
  cpu->copy_to_host(host, x.data, sizeof host);
  for (float v : host) EXPECT_EQ(v, 2.0f);
  EXPECT_EQ(t.ops, 1);
}

}  // namespace
}  // namespace llmt
