// linear_forward/backward (OpenBLAS GEMMs) against double-precision triple loops, with and without
// bias and input gradient, plus finite differences and gradient accumulation.
#include <cmath>
#include <ostream>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

struct LinearCase {
  int64_t N, IC, OC;
  bool bias;
};

std::ostream& operator<<(std::ostream& os, const LinearCase& c) {
  return os << "N" << c.N << "_IC" << c.IC << "_OC" << c.OC << (c.bias ? "_bias" : "_nobias");
}

// GEMM results of K terms of size ~1: float error grows like sqrt(K) ulp.
constexpr Tol kGemmTol{1e-5, 1e-5};

class Linear : public ::testing::TestWithParam<LinearCase> {
 protected:
  void SetUp() override {
    const auto& c = GetParam();
    inp = uniform({c.N, c.IC}, 1);
    weight = uniform({c.OC, c.IC}, 2);
    if (c.bias) bias = uniform({c.OC}, 3);
    out = HostTensor({c.N, c.OC});
  }
  void forward() { ops::linear_forward(out.t(), inp.t(), weight.t(), bias.t()); }

  HostTensor inp, weight, bias, out;
};

TEST_P(Linear, ForwardMatchesReference) {
  const auto& c = GetParam();
  forward();
  std::vector<double> ref(c.N * c.OC);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.OC; ++o) {
      double s = c.bias ? bias[o] : 0.0;
      for (int64_t i = 0; i < c.IC; ++i)
        s += static_cast<double>(inp[n * c.IC + i]) * weight[o * c.IC + i];
      ref[n * c.OC + o] = s;
    }
  EXPECT_TRUE(all_close(out, ref, kGemmTol));
}

TEST_P(Linear, BackwardMatchesReference) {
  const auto& c = GetParam();
  HostTensor dout = uniform({c.N, c.OC}, 4), dinp = uniform({c.N, c.IC}, 5);  // dinp is assigned
  HostTensor dweight = uniform({c.OC, c.IC}, 6), dweight0 = dweight, dbias;   // added to
  if (c.bias) dbias = uniform({c.OC}, 7);
  std::vector<double> ref_inp(c.N * c.IC, 0.0), ref_w = to_double(dweight), ref_b;
  if (c.bias) ref_b = to_double(dbias);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.OC; ++o) {
      const double d = dout[n * c.OC + o];
      for (int64_t i = 0; i < c.IC; ++i) {
        ref_inp[n * c.IC + i] += d * weight[o * c.IC + i];
        ref_w[o * c.IC + i] += d * inp[n * c.IC + i];
      }
      if (c.bias) ref_b[o] += d;
    }
  ops::linear_backward(dinp.t(), dweight.t(), dbias.t(), dout.t(), inp.t(), weight.t());
  EXPECT_TRUE(all_close(dinp, ref_inp, kGemmTol));
  EXPECT_TRUE(all_close(dweight, ref_w, kGemmTol));
  if (c.bias) {
    EXPECT_TRUE(all_close(dbias, ref_b, kGemmTol));
  }

  // Without dinp only the parameter gradients are produced (added once more).
  ops::linear_backward(Tensor(), dweight.t(), dbias.t(), dout.t(), inp.t(), weight.t());
  for (int64_t k = 0; k < c.OC * c.IC; ++k) ref_w[k] += ref_w[k] - dweight0[k];
  EXPECT_TRUE(all_close(dweight, ref_w, kGemmTol));
}

TEST_P(Linear, GradientsMatchFiniteDifferences) {
  const auto& c = GetParam();
  HostTensor w = uniform({c.N, c.OC}, 8);
  HostTensor dinp({c.N, c.IC}), dweight({c.OC, c.IC}), dbias;
  if (c.bias) dbias = HostTensor({c.OC});
  ops::linear_backward(dinp.t(), dweight.t(), dbias.t(), w.t(), inp.t(), weight.t());
  auto loss = [&] {
    forward();
    return weighted_sum(out, w);
  };
  EXPECT_TRUE(check_gradient(loss, inp, dinp));
  EXPECT_TRUE(check_gradient(loss, weight, dweight));
  if (c.bias) {
    EXPECT_TRUE(check_gradient(loss, bias, dbias));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Linear,
                         ::testing::Values(LinearCase{1, 3, 5, true}, LinearCase{2, 1, 1, false},
                                           LinearCase{7, 67, 33, true},
                                           LinearCase{7, 67, 33, false},
                                           LinearCase{64, 128, 256, true},
                                           LinearCase{300, 64, 160, true}),
                         ParamName());

TEST(LinearOps, WeightGradientsAccumulate) {
  HostTensor inp = uniform({5, 12}, 1), weight = uniform({9, 12}, 2), dout = uniform({5, 9}, 3);
  HostTensor dw1({9, 12}), db1({9}), dw2({9, 12}), db2({9}), dinp({5, 12});
  ops::linear_backward(dinp.t(), dw1.t(), db1.t(), dout.t(), inp.t(), weight.t());
  for (int i = 0; i < 2; ++i)
    ops::linear_backward(dinp.t(), dw2.t(), db2.t(), dout.t(), inp.t(), weight.t());
  std::vector<double> ref_w = to_double(dw1), ref_b = to_double(db1);
  for (double& x : ref_w) x *= 2;
  for (double& x : ref_b) x *= 2;
  EXPECT_TRUE(all_close(dw2, ref_w, {1e-6, 1e-7}));
  EXPECT_TRUE(all_close(db2, ref_b, {1e-6, 1e-7}));
}

// The operand type is a promise about the inputs (their values are 16-bit values). f16: the CPU's
// fp32 GEMM computes the same products exactly, so its results must be those of operands = f32,
// bit for bit. bf16: on a CPU with AVX512-BF16 and oneDNN the GEMMs run as bf16 matmuls with fp32
// accumulation (kernels/cpu/linear.cpp): the same exact products summed in another order, so
// each result is within fp32 rounding of the double-precision one, as sgemm's is.
TEST(LinearOps, SixteenBitOperandsComputeTheSameProducts) {
  const int64_t N = 37, IC = 24, OC = 18;
  for (const DType t : {DType::bf16, DType::f16}) {
    HostTensor inp = uniform({N, IC}, 1), weight = uniform({OC, IC}, 2), dout = uniform({N, OC}, 3);
    for (HostTensor* x : {&inp, &weight, &dout}) ops::round_to(x->t(), t);
    HostTensor bias = uniform({OC}, 4);
    const HostTensor dw0 = uniform({OC, IC}, 5), db0 = uniform({OC}, 6);
    HostTensor out32({N, OC}), out16({N, OC});
    ops::linear_forward(out32.t(), inp.t(), weight.t(), bias.t());
    ops::linear_forward(out16.t(), inp.t(), weight.t(), bias.t(), t);
    HostTensor dinp32({N, IC}), dw32 = dw0, db32 = db0;
    HostTensor dinp16({N, IC}), dw16 = dw0, db16 = db0;
    ops::linear_backward(dinp32.t(), dw32.t(), db32.t(), dout.t(), inp.t(), weight.t());
    ops::linear_backward(dinp16.t(), dw16.t(), db16.t(), dout.t(), inp.t(), weight.t(), t);
    EXPECT_TRUE(bits_equal(db16, db32)) << dtype_name(t);  // no GEMM
    if (t == DType::f16) {
      EXPECT_TRUE(bits_equal(out16, out32));
      EXPECT_TRUE(bits_equal(dinp16, dinp32));
      EXPECT_TRUE(bits_equal(dw16, dw32));
      continue;
    }
    // Each against the double-precision sums of the same products: |error| <= K * 2^-24 * sum of
    // |terms| (the fp32 summation bound), for the 16-bit and the fp32 path alike.
    auto check = [](const HostTensor& got, int64_t rows, int64_t cols, int64_t K, auto term,
                    auto base, const char* what) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          double sum = base(i, j), mag = std::abs(base(i, j));
          for (int64_t k = 0; k < K; ++k) {
            sum += term(i, j, k);
            mag += std::abs(term(i, j, k));
          }
          ASSERT_LE(std::abs(got[i * cols + j] - sum), (K + 1) * 0x1p-24 * mag)
              << what << " [" << i << "," << j << "]";
        }
    };
    for (const HostTensor* o : {&out16, &out32})
      check(
          *o, N, OC, IC,
          [&](int64_t n, int64_t c, int64_t k) {
            return double(inp[n * IC + k]) * weight[c * IC + k];
          },
          [&](int64_t, int64_t c) { return double(bias[c]); }, "out");
    for (const HostTensor* d : {&dinp16, &dinp32})
      check(
          *d, N, IC, OC,
          [&](int64_t n, int64_t i, int64_t c) {
            return double(dout[n * OC + c]) * weight[c * IC + i];
          },
          [](int64_t, int64_t) { return 0.0; }, "dinp");
    for (const HostTensor* d : {&dw16, &dw32})
      check(
          *d, OC, IC, N,
          [&](int64_t c, int64_t i, int64_t n) {
            return double(dout[n * OC + c]) * inp[n * IC + i];
          },
          [&](int64_t c, int64_t i) { return double(dw0[c * IC + i]); }, "dweight");
  }
}

// The two halves of a backward run apart (tensor-parallel layers, zero-bubble schedules) need
// only their own GEMM's inputs: dinp without inp, the weight gradients without weight. Each half
// is bitwise what the whole call gives; a half missing its own input is refused.
TEST(LinearOps, HalvesNeedOnlyTheirInputs) {
  HostTensor inp = uniform({6, 10}, 1), weight = uniform({7, 10}, 2), dout = uniform({6, 7}, 3);
  HostTensor dinp({6, 10}), dw({7, 10}), db({7});
  ops::linear_backward(dinp.t(), dw.t(), db.t(), dout.t(), inp.t(), weight.t());
  HostTensor dinp_half({6, 10}), dw_half({7, 10}), db_half({7});
  ops::linear_backward(dinp_half.t(), Tensor(), Tensor(), dout.t(), Tensor(), weight.t());
  ops::linear_backward(Tensor(), dw_half.t(), db_half.t(), dout.t(), inp.t(), Tensor());
  EXPECT_TRUE(bits_equal(dinp_half, dinp));
  EXPECT_TRUE(bits_equal(dw_half, dw));
  EXPECT_TRUE(bits_equal(db_half, db));
  EXPECT_THROW(ops::linear_backward(dinp_half.t(), Tensor(), Tensor(), dout.t(), inp.t(), Tensor()),
               Error);
  EXPECT_THROW(
      ops::linear_backward(Tensor(), dw_half.t(), Tensor(), dout.t(), Tensor(), weight.t()), Error);
  HostTensor wrong({5, 10});  // dinp rows must match dout's
  EXPECT_THROW(ops::linear_backward(wrong.t(), Tensor(), Tensor(), dout.t(), Tensor(), weight.t()),
               Error);
}

TEST(LinearOps, AcceptsLeadingDims) {
  HostTensor inp = uniform({2, 3, 8}, 1), weight = uniform({4, 8}, 2), out({2, 3, 4}), flat({6, 4});
  ops::linear_forward(out.t(), inp.t(), weight.t(), Tensor());
  ops::linear_forward(flat.t(), inp.t().view({6, 8}), weight.t(), Tensor());
  EXPECT_TRUE(all_close(out, to_double(flat), {0, 0}));
}

}  // namespace
}  // namespace llmt::test
