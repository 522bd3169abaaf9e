// LayerNorm (with and without bias) and RMSNorm against double-precision references of forward
// and backward, finite differences of every gradient, and accumulation of the weight gradients.
#include <cmath>
#include <ostream>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

enum class Kind { layernorm, layernorm_nobias, rmsnorm };

struct NormCase {
  int64_t N, C;
  Kind kind;
};

std::ostream& operator<<(std::ostream& os, const NormCase& c) {
  const char* names[] = {"layernorm", "layernorm_nobias", "rmsnorm"};
  return os << names[static_cast<int>(c.kind)] << "_N" << c.N << "_C" << c.C;
}

constexpr float kEps = 1e-5f;

// Double-precision reference: out, and the gradients for dout.
struct NormRef {
  std::vector<double> out, dinp, dweight, dbias;
};

NormRef reference(const NormCase& c, const HostTensor& inp, const HostTensor& weight,
                  const HostTensor& bias, const HostTensor& dout) {
  const bool center = c.kind != Kind::rmsnorm;
  NormRef r{std::vector<double>(c.N * c.C), std::vector<double>(c.N * c.C),
            std::vector<double>(c.C, 0.0), std::vector<double>(c.C, 0.0)};
  for (int64_t n = 0; n < c.N; ++n) {
    const float* x = inp.f32() + n * c.C;
    const float* d = dout.f32() + n * c.C;
    double mean = 0, var = 0;
    if (center) {
      for (int64_t i = 0; i < c.C; ++i) mean += x[i];
      mean /= c.C;
    }
    for (int64_t i = 0; i < c.C; ++i) var += (x[i] - mean) * (x[i] - mean);
    const double rstd = 1.0 / std::sqrt(var / c.C + kEps);
    // d norm_i / d x_j = rstd (delta_ij - [center]/C - norm_i norm_j / C)
    double g_sum = 0, gn_sum = 0;
    for (int64_t i = 0; i < c.C; ++i) {
      const double norm = (x[i] - mean) * rstd, g = d[i] * static_cast<double>(weight[i]);
      r.out[n * c.C + i] = norm * weight[i] + (bias.defined() ? bias[i] : 0.0);
      g_sum += g;
      gn_sum += g * norm;
      r.dweight[i] += d[i] * norm;
      r.dbias[i] += d[i];
    }
    for (int64_t j = 0; j < c.C; ++j) {
      const double norm = (x[j] - mean) * rstd;
      r.dinp[n * c.C + j] = rstd * (d[j] * static_cast<double>(weight[j]) -
                                    (center ? g_sum / c.C : 0.0) - norm * gn_sum / c.C);
    }
  }
  return r;
}

class Norm : public ::testing::TestWithParam<NormCase> {
 protected:
  void SetUp() override {
    const auto& c = GetParam();
    inp = uniform({c.N, c.C}, 1, -2.0f, 3.0f);
    weight = uniform({c.C}, 2, 0.5f, 1.5f);
    if (c.kind == Kind::layernorm) bias = uniform({c.C}, 3);
    out = HostTensor({c.N, c.C});
    mean = HostTensor({c.N});
    rstd = HostTensor({c.N});
  }
  bool rms() const { return GetParam().kind == Kind::rmsnorm; }
  void forward() {
    if (rms())
      ops::rmsnorm_forward(out.t(), rstd.t(), inp.t(), weight.t(), kEps);
    else
      ops::layernorm_forward(out.t(), mean.t(), rstd.t(), inp.t(), weight.t(), bias.t(), kEps);
  }
  void backward(HostTensor& dinp, HostTensor& dweight, HostTensor& dbias, HostTensor& dout) {
    if (rms())
      ops::rmsnorm_backward(dinp.t(), dweight.t(), dout.t(), inp.t(), weight.t(), rstd.t());
    else
      ops::layernorm_backward(dinp.t(), dweight.t(), dbias.t(), dout.t(), inp.t(), weight.t(),
                              mean.t(), rstd.t());
  }

  HostTensor inp, weight, bias, out, mean, rstd;
};

TEST_P(Norm, ForwardAndBackwardMatchReference) {
  const auto& c = GetParam();
  HostTensor dout = uniform({c.N, c.C}, 4);
  NormRef ref = reference(c, inp, weight, bias, dout);
  forward();
  EXPECT_TRUE(all_close(out, ref.out, {1e-5, 1e-5}));

  HostTensor dinp = uniform({c.N, c.C}, 5);       // assigned
  HostTensor dweight = uniform({c.C}, 6), dbias;  // added to
  if (bias.defined()) dbias = uniform({c.C}, 7);
  for (int64_t i = 0; i < c.C; ++i) {
    ref.dweight[i] += dweight[i];
    if (bias.defined()) ref.dbias[i] += dbias[i];
  }
  backward(dinp, dweight, dbias, dout);
  EXPECT_TRUE(all_close(dinp, ref.dinp, {1e-4, 1e-5}));
  EXPECT_TRUE(all_close(dweight, ref.dweight, {1e-5, 1e-5}));
  if (bias.defined()) {
    EXPECT_TRUE(all_close(dbias, ref.dbias, {1e-5, 1e-5}));
  }
}

TEST_P(Norm, GradientsMatchFiniteDifferences) {
  const auto& c = GetParam();
  HostTensor w = uniform({c.N, c.C}, 8);
  forward();
  HostTensor dinp({c.N, c.C}), dweight({c.C}), dbias;
  if (bias.defined()) dbias = HostTensor({c.C});
  backward(dinp, dweight, dbias, w);
  auto loss = [&] {
    forward();
    return weighted_sum(out, w);
  };
  EXPECT_TRUE(check_gradient(loss, inp, dinp));
  EXPECT_TRUE(check_gradient(loss, weight, dweight));
  if (bias.defined()) {
    EXPECT_TRUE(check_gradient(loss, bias, dbias));
  }
}

TEST_P(Norm, WeightGradientsAccumulate) {
  const auto& c = GetParam();
  HostTensor dout = uniform({c.N, c.C}, 9), dinp({c.N, c.C});
  HostTensor dw1({c.C}), dw2({c.C}), db1, db2;
  if (bias.defined()) db1 = HostTensor({c.C}), db2 = HostTensor({c.C});
  forward();
  backward(dinp, dw1, db1, dout);
  backward(dinp, dw2, db2, dout);
  backward(dinp, dw2, db2, dout);
  std::vector<double> ref_w = to_double(dw1);
  for (double& x : ref_w) x *= 2;
  EXPECT_TRUE(all_close(dw2, ref_w, {1e-6, 1e-7}));
  if (bias.defined()) {
    std::vector<double> ref_b = to_double(db1);
    for (double& x : ref_b) x *= 2;
    EXPECT_TRUE(all_close(db2, ref_b, {1e-6, 1e-7}));
  }
}

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> cases;
  for (Kind k : {Kind::layernorm, Kind::layernorm_nobias, Kind::rmsnorm})
    for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 3}, {7, 67}, {3, 1000}, {300, 128}})
      cases.push_back({N, C, k});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Norm, ::testing::ValuesIn(norm_cases()), ParamName());

}  // namespace
}  // namespace llmt::test
