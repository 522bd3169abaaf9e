// Causal grouped-query attention (flash-attention tiles, online softmax) against a double-precision
// full-softmax reference: out, lse and the analytic dqkv, finite differences of dqkv, and dqkv
// being assigned. Shapes cover one token, partial tiles (T=65, 130), MHA, GQA, MQA and padded D;
// and a scale of the scores other than 1/sqrt(D) (YaRN's softmax factor).
#include <cmath>
#include <limits>
#include <ostream>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

struct AttnCase {
  int64_t B, T, H, KV, D;
};

std::ostream& operator<<(std::ostream& os, const AttnCase& c) {
  return os << "B" << c.B << "_T" << c.T << "_H" << c.H << "_KV" << c.KV << "_D" << c.D;
}

// Double-precision reference: out (B,T,H,D), lse (B,H,T), and dqkv (B,T,H+2KV,D) for dout.
struct AttnRef {
  std::vector<double> out, lse, dqkv;
};

// scale_of: the scores' scale (0: 1/sqrt(D)).
AttnRef reference(const AttnCase& c, const HostTensor& qkv, const HostTensor& dout,
                  double scale_of = 0) {
  const int64_t B = c.B, T = c.T, H = c.H, KV = c.KV, D = c.D, ld = (H + 2 * KV) * D;
  const double scale = scale_of > 0 ? scale_of : 1.0 / std::sqrt(static_cast<double>(D));
  AttnRef r{std::vector<double>(B * T * H * D), std::vector<double>(B * H * T),
            std::vector<double>(B * T * ld, 0.0)};
  std::vector<double> p(T), dp(T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      auto at = [&](int64_t t, int64_t head) { return (b * T + t) * ld + head * D; };
      const float* x = qkv.f32();
      for (int64_t i = 0; i < T; ++i) {
        const int64_t qi = at(i, h), oi = ((b * T + i) * H + h) * D;
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += static_cast<double>(x[qi + d]) * x[at(j, H + g) + d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += p[j] = std::exp(p[j] - mx);
        for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
        r.lse[(b * H + h) * T + i] = mx + std::log(sum);
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += p[j] * x[at(j, H + KV + g) + d];
          r.out[oi + d] = o;
        }
        // dP_ij = dout_i . v_j, dS_ij = P_ij (dP_ij - delta_i), delta_i = sum_j P_ij dP_ij;
        // dq_i += scale dS_ij k_j, dk_j += scale dS_ij q_i, dv_j += P_ij dout_i.
        const float* dy = dout.f32() + oi;
        double delta = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += static_cast<double>(dy[d]) * x[at(j, H + KV + g) + d];
          dp[j] = s;
          delta += p[j] * s;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - delta) * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dqkv[qi + d] += ds * x[at(j, H + g) + d];
            r.dqkv[at(j, H + g) + d] += ds * x[qi + d];
            r.dqkv[at(j, H + KV + g) + d] += p[j] * dy[d];
          }
        }
      }
    }
  }
  return r;
}

class Attention : public ::testing::TestWithParam<AttnCase> {
 protected:
  void SetUp() override {
    const auto& c = GetParam();
    // std 1.5: scores of spread ~2, so rows range from peaked to flat softmaxes.
    qkv = normal({c.B, c.T, c.H + 2 * c.KV, c.D}, 1, 1.5f);
    out = HostTensor({c.B, c.T, c.H, c.D});
    lse = HostTensor({c.B, c.H, c.T});
  }
  void forward() { ops::attention_forward(out.t(), lse.t(), qkv.t(), GetParam().H, GetParam().KV); }
  void backward(HostTensor& dqkv, HostTensor& dout) {
    ops::attention_backward(dqkv.t(), dout.t(), qkv.t(), out.t(), lse.t(), GetParam().H,
                            GetParam().KV);
  }

  HostTensor qkv, out, lse;
};

// Float sums of up to T*D products of size ~1 through a softmax: errors of a few ulp * sqrt(T*D).
constexpr Tol kOutTol{1e-4, 1e-5};
constexpr Tol kLseTol{1e-5, 1e-5};
constexpr Tol kGradTol{1e-4, 5e-5};

TEST_P(Attention, ForwardMatchesReference) {
  const auto& c = GetParam();
  HostTensor dout = uniform({c.B, c.T, c.H, c.D}, 2);
  AttnRef ref = reference(c, qkv, dout);
  forward();
  EXPECT_TRUE(all_close(out, ref.out, kOutTol));
  EXPECT_TRUE(all_close(lse, ref.lse, kLseTol));
}

TEST_P(Attention, BackwardMatchesReference) {
  const auto& c = GetParam();
  HostTensor dout = uniform({c.B, c.T, c.H, c.D}, 3);
  AttnRef ref = reference(c, qkv, dout);
  forward();
  HostTensor dqkv(qkv.shape());
  backward(dqkv, dout);
  EXPECT_TRUE(all_close(dqkv, ref.dqkv, kGradTol));
}

TEST_P(Attention, GradientsMatchFiniteDifferences) {
  const auto& c = GetParam();
  HostTensor w = uniform({c.B, c.T, c.H, c.D}, 4);
  forward();
  HostTensor dqkv(qkv.shape());
  backward(dqkv, w);
  auto loss = [&] {
    forward();
    return weighted_sum(out, w);
  };
  EXPECT_TRUE(check_gradient(loss, qkv, dqkv));
}

// dqkv is assigned: a NaN-filled buffer gives bit for bit the result of a zeroed one.
TEST_P(Attention, DqkvIsAssigned) {
  const auto& c = GetParam();
  HostTensor dout = uniform({c.B, c.T, c.H, c.D}, 5);
  forward();
  HostTensor zeroed(qkv.shape());
  HostTensor garbage = constant(qkv.shape(), std::numeric_limits<float>::quiet_NaN());
  backward(zeroed, dout);
  backward(garbage, dout);
  EXPECT_TRUE(bits_equal(garbage, zeroed));
}

// `operands` allows a backend to compute on the 16-bit type; the CPU does not: the same fp32 bits
// whatever it says, forward and backward.
TEST_P(Attention, OperandsChangeNothingOnTheCpu) {
  const auto& c = GetParam();
  HostTensor dout = uniform({c.B, c.T, c.H, c.D}, 6);
  forward();
  HostTensor dqkv(qkv.shape());
  backward(dqkv, dout);
  for (DType t : {DType::bf16, DType::f16}) {
    HostTensor o(out.shape()), l(lse.shape()), d(qkv.shape());
    ops::attention_forward(o.t(), l.t(), qkv.t(), c.H, c.KV, t);
    ops::attention_backward(d.t(), dout.t(), qkv.t(), out.t(), lse.t(), c.H, c.KV, t);
    EXPECT_TRUE(bits_equal(o, out)) << dtype_name(t);
    EXPECT_TRUE(bits_equal(l, lse)) << dtype_name(t);
    EXPECT_TRUE(bits_equal(d, dqkv)) << dtype_name(t);
  }
}

// A scale of the scores other than 1/sqrt(D) (YaRN's m^2 / sqrt(D), DeepSeek-V3's m = 1.369):
// forward and backward against the reference at that scale, finite differences, and 1/sqrt(D)
// given explicitly is bitwise the default.
TEST_P(Attention, ScaledScoresMatchReference) {
  const auto& c = GetParam();
  const float scale = 1.8738f / std::sqrt(static_cast<float>(c.D));
  HostTensor dout = uniform({c.B, c.T, c.H, c.D}, 7);
  const AttnRef ref = reference(c, qkv, dout, scale);
  ops::attention_forward(out.t(), lse.t(), qkv.t(), c.H, c.KV, DType::f32, scale);
  EXPECT_TRUE(all_close(out, ref.out, kOutTol));
  EXPECT_TRUE(all_close(lse, ref.lse, kLseTol));
  HostTensor dqkv(qkv.shape());
  ops::attention_backward(dqkv.t(), dout.t(), qkv.t(), out.t(), lse.t(), c.H, c.KV, DType::f32,
                          scale);
  EXPECT_TRUE(all_close(dqkv, ref.dqkv, kGradTol));
  auto loss = [&] {
    ops::attention_forward(out.t(), lse.t(), qkv.t(), c.H, c.KV, DType::f32, scale);
    return weighted_sum(out, dout);
  };
  EXPECT_TRUE(check_gradient(loss, qkv, dqkv));
  HostTensor o(out.shape()), l(lse.shape());
  forward();
  ops::attention_forward(o.t(), l.t(), qkv.t(), c.H, c.KV, DType::f32,
                         1.0f / std::sqrt(static_cast<float>(c.D)));
  EXPECT_TRUE(bits_equal(o, out));
  EXPECT_TRUE(bits_equal(l, lse));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(AttnCase{1, 1, 1, 1, 8},      // one token
                                           AttnCase{2, 7, 4, 2, 8},      // GQA, under one tile
                                           AttnCase{1, 64, 2, 2, 64},    // exactly one tile
                                           AttnCase{1, 65, 4, 1, 64},    // MQA, partial tile
                                           AttnCase{2, 130, 4, 4, 64},   // MHA, three tiles
                                           AttnCase{1, 130, 4, 2, 8},    // GQA, three tiles
                                           AttnCase{2, 70, 6, 3, 24},    // D not a whole vector
                                           AttnCase{1, 33, 2, 1, 128}),  // wide heads
                         ParamName());

TEST(AttentionShapes, HeadsNotAMultipleOfKvHeadsThrow) {
  HostTensor qkv({1, 4, 3 + 2 * 2, 8}), out({1, 4, 3, 8}), lse({1, 3, 4});
  EXPECT_THROW(ops::attention_forward(out.t(), lse.t(), qkv.t(), 3, 2), Error);
}

}  // namespace
}  // namespace llmt::test
