// LR schedule values, clipping coefficient, AdamW over several tensors with and without decay,
// Muon against a float64 reference written here from its formulas, and the fp16 loss scaler's
// skip/halve/grow rules.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/rng.h"
#include "engine/optim/muon.h"
#include "engine/optim/optimizer.h"

namespace llmt {
namespace {

OptimizerConfig schedule(LrDecay decay) {
  OptimizerConfig c;
  c.lr = 1.0f;
  c.min_lr = 0.1f;
  c.warmup_steps = 10;
  c.decay_steps = 110;
  c.decay = decay;
  return c;
}

TEST(LrSchedule, WarmupThenCosineLinearConstant) {
  OptimizerConfig cos = schedule(LrDecay::cosine);
  EXPECT_DOUBLE_EQ(lr_at(cos, 1), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(cos, 5), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(cos, 10), 1.0);
  EXPECT_NEAR(lr_at(cos, 60), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.5)), 1e-7);
  EXPECT_NEAR(lr_at(cos, 110), 0.1, 1e-7);
  EXPECT_NEAR(lr_at(cos, 500), 0.1, 1e-7);
  OptimizerConfig lin = schedule(LrDecay::linear);
  EXPECT_NEAR(lr_at(lin, 35), 1.0 - 0.9 * 0.25, 1e-7);
  OptimizerConfig con = schedule(LrDecay::constant);
  EXPECT_DOUBLE_EQ(lr_at(con, 90), 1.0);
}

TEST(Clipping, CoefficientMatchesTorchRule) {
  OptimizerConfig c;
  c.grad_clip = 1.0f;
  EXPECT_DOUBLE_EQ(clip_coefficient(c, 0.5), 1.0);
  EXPECT_NEAR(clip_coefficient(c, 4.0), 1.0 / (4.0 + 1e-6), 1e-12);
  c.grad_clip = 0.0f;
  EXPECT_DOUBLE_EQ(clip_coefficient(c, 100.0), 1.0);
}

TEST(AdamW, TwoStepsMatchTheFormulaAndSkipDecayWhereAsked) {
  auto backend = make_cpu_backend();
  Allocator alloc(*backend);
  Buffer buf = alloc.allocate(4 * 4, MemCategory::params);
  Buffer gbuf = alloc.allocate(4 * 4, MemCategory::grads);
  std::vector<Tensor> p = {buf.tensor({2}, DType::f32), buf.tensor({2}, DType::f32, 8)};
  std::vector<Tensor> g = {gbuf.tensor({2}, DType::f32), gbuf.tensor({2}, DType::f32, 8)};
  const float p0[4] = {1.0f, -2.0f, 0.5f, 3.0f}, g0[4] = {0.1f, -0.3f, 0.2f, 0.0f};
  for (int i = 0; i < 4; ++i) {
    static_cast<float*>(buf.data())[i] = p0[i];
    static_cast<float*>(gbuf.data())[i] = g0[i];
  }
  OptimizerConfig c;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.eps = 1e-8f;
  c.weight_decay = 0.1f;
  AdamW opt(c, alloc, {{0, 0, p[0], g[0], true}, {1, 0, p[1], g[1], false}});
  EXPECT_EQ(alloc.stats().live[static_cast<int>(MemCategory::optimizer)], 2 * 16);
  const double lr = 0.01;
  opt.step(lr, 1, 1.0f);
  opt.step(lr, 2, 1.0f);
  for (int i = 0; i < 4; ++i) {
    double x = p0[i], m = 0, v = 0;
    const double wd = i < 2 ? 0.1 : 0.0;
    for (int t = 1; t <= 2; ++t) {
      m = 0.9 * m + 0.1 * g0[i];
      v = 0.95 * v + 0.05 * g0[i] * g0[i];
      double mhat = m / (1 - std::pow(0.9, t)), vhat = v / (1 - std::pow(0.95, t));
      x -= lr * (wd * x + mhat / (std::sqrt(vhat) + 1e-8));
    }
    EXPECT_NEAR(static_cast<float*>(buf.data())[i], x, 1e-6) << i;
  }
}

// ---- Muon ----------------------------------------------------------------------------------
// The reference: the formulas of engine/optim/muon.h in double, on plain row-major vectors.
using Mat = std::vector<double>;

Mat matmul(const Mat& a, const Mat& b, int64_t n, int64_t k, int64_t m) {  // (n,k) @ (k,m)
  Mat c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < m; ++j) c[i * m + j] += a[i * k + l] * b[l * m + j];
  return c;
}

Mat transpose(const Mat& a, int64_t n, int64_t m) {
  Mat t(a.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) t[j * n + i] = a[i * m + j];
  return t;
}

// Keller Jordan's form: transpose a tall matrix, iterate on X X^T, transpose back.
Mat reference_ns(Mat g, int64_t rows, int64_t cols, int64_t steps) {
  double norm = 0;
  for (double v : g) norm += v * v;
  norm = std::sqrt(norm);
  for (double& v : g) v /= norm + 1e-7;
  const bool tall = rows > cols;
  Mat x = tall ? transpose(g, rows, cols) : g;
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols;
  for (int64_t s = 0; s < steps; ++s) {
    const Mat a = matmul(x, transpose(x, r, c), r, c, r);
    const Mat aa = matmul(a, a, r, r, r);
    Mat b(a.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = -4.7750 * a[i] + 2.0315 * aa[i];
    const Mat bx = matmul(b, x, r, r, c);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 3.4445 * x[i] + bx[i];
  }
  return tall ? transpose(x, r, c) : x;
}

// The whole tensor is the slot on one rank: gather and take_rows copy.
class LocalGather final : public MatrixGather {
 public:
  void gather(size_t, Tensor rows, Tensor whole) override {
    std::copy_n(rows.f32(), rows.numel(), whole.f32());
  }
  void take_rows(size_t, Tensor whole, Tensor rows) override {
    std::copy_n(whole.f32(), whole.numel(), rows.f32());
  }
};

// A wide matrix, a tall one, an expert stack of two, and a vector (AdamW), three steps with
// changing gradients and grad_scale; with and without Nesterov momentum.
TEST(Muon, MatchesAFloat64ReferenceOnWideTallAndExpertMatrices) {
  for (bool nesterov : {true, false}) {
    auto backend = make_cpu_backend();
    Allocator alloc(*backend);
    const std::vector<Shape> shapes = {{6, 10}, {12, 5}, {2, 4, 7}, {9}};
    std::vector<Buffer> pbuf, gbuf;
    std::vector<OptimizerSlot> slots;
    std::vector<MuonMatrix> matrices;
    std::vector<Mat> ref_p, ref_m;
    for (size_t i = 0; i < shapes.size(); ++i) {
      pbuf.push_back(alloc.allocate_tensor(shapes[i], DType::f32, MemCategory::params));
      gbuf.push_back(alloc.allocate_tensor(shapes[i], DType::f32, MemCategory::grads));
      Tensor p = pbuf.back().tensor(shapes[i], DType::f32);
      for (int64_t k = 0; k < p.numel(); ++k) p.f32()[k] = 0.1f * std::sin(1.0f + k + 7.0f * i);
      ref_p.emplace_back(p.f32(), p.f32() + p.numel());
      ref_m.emplace_back(static_cast<size_t>(p.numel()), 0.0);
      slots.push_back({i, 0, p, gbuf.back().tensor(shapes[i], DType::f32), i != 1});
      if (shapes[i].ndim() >= 2) matrices.push_back({i, shapes[i], static_cast<int>(i)});
    }
    OptimizerConfig c;
    c.type = OptimizerType::muon;
    c.muon.nesterov = nesterov;
    c.weight_decay = 0.1f;
    LocalGather gather;
    Muon opt(c, alloc, slots, matrices, gather);
    // The AdamW slot's reference state.
    std::vector<double> am(9, 0.0), av(9, 0.0);
    const double lr = 0.02;
    for (int t = 1; t <= 3; ++t) {
      const float scale = t == 2 ? 0.5f : 1.0f;
      for (size_t i = 0; i < shapes.size(); ++i)
        for (int64_t k = 0; k < shapes[i].numel(); ++k)
          slots[i].grad.f32()[k] = std::cos(0.3f * k * t + i) + 0.05f * t;
      opt.step(lr, t, scale);
      for (size_t i = 0; i < 3; ++i) {
        const int64_t n_mat = shapes[i].ndim() == 3 ? shapes[i][0] : 1;
        const int64_t rows = shapes[i][-2], cols = shapes[i][-1];
        for (int64_t e = 0; e < n_mat; ++e) {
          Mat u(static_cast<size_t>(rows * cols));
          for (int64_t k = 0; k < rows * cols; ++k) {
            const size_t at = static_cast<size_t>(e * rows * cols + k);
            const double g = static_cast<double>(slots[i].grad.f32()[at]) * scale;
            ref_m[i][at] = 0.95 * ref_m[i][at] + g;
            u[static_cast<size_t>(k)] = nesterov ? g + 0.95 * ref_m[i][at] : ref_m[i][at];
          }
          const Mat o = reference_ns(u, rows, cols, 5);
          const double alpha = lr * 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
          const double decay = slots[i].decay ? 1.0 - lr * 0.1 : 1.0;
          for (int64_t k = 0; k < rows * cols; ++k) {
            double& w = ref_p[i][static_cast<size_t>(e * rows * cols + k)];
            w = w * decay - alpha * o[static_cast<size_t>(k)];
          }
        }
      }
      for (int64_t k = 0; k < 9; ++k) {
        const double g = static_cast<double>(slots[3].grad.f32()[k]) * scale;
        am[k] = 0.9 * am[k] + 0.1 * g;
        av[k] = 0.95 * av[k] + 0.05 * g * g;
        const double mhat = am[k] / (1 - std::pow(0.9, t)), vhat = av[k] / (1 - std::pow(0.95, t));
        ref_p[3][k] -= lr * (0.1 * ref_p[3][k] + mhat / (std::sqrt(vhat) + 1e-8));
      }
      for (size_t i = 0; i < shapes.size(); ++i)
        for (int64_t k = 0; k < shapes[i].numel(); ++k)
          ASSERT_NEAR(slots[i].value.f32()[k], ref_p[i][static_cast<size_t>(k)], 1e-6)
              << "nesterov " << nesterov << " step " << t << " param " << i << " element " << k;
    }
    // The state: momentum_buffer for the three matrices (equal to the reference's), AdamW's two
    // for the vector.
    std::vector<SlotState> st = opt.state();
    ASSERT_EQ(st.size(), 5u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(st[k].name, kMuonState);
      EXPECT_EQ(st[k].slot, k);
      for (int64_t j = 0; j < st[k].tensor.numel(); ++j)
        ASSERT_NEAR(st[k].tensor.f32()[j], ref_m[k][static_cast<size_t>(j)], 1e-5);
    }
    EXPECT_EQ(st[3].name, "exp_avg");
    EXPECT_EQ(st[3].slot, 3u);
    EXPECT_EQ(st[4].name, "exp_avg_sq");
  }
}

// The orthogonalisation itself: 5 steps bring every singular value of a well-conditioned matrix
// (here between about 1.2 and 1.9 before normalising) into the band the coefficients aim at
// (about [0.68, 1.13], Jordan et al.): O^T O has its diagonal in the band squared and small
// off-diagonals. (Singular values far below the largest converge more slowly.)
TEST(Muon, NewtonSchulzFlattensTheSingularValues) {
  auto backend = make_cpu_backend();
  Allocator alloc(*backend);
  const int64_t m = 16, n = 8;
  Buffer xb = alloc.allocate(m * n * 4, MemCategory::other);
  Buffer ab = alloc.allocate(n * n * 4, MemCategory::other),
         bb = alloc.allocate(n * n * 4, MemCategory::other);
  Buffer pb = alloc.allocate(m * n * 4, MemCategory::other);
  Tensor x = xb.tensor({m, n}, DType::f32);
  for (int64_t k = 0; k < m * n; ++k)
    x.f32()[k] = (k / n) % n == k % n ? 1.0f : 0.25f * std::sin(2.3f * k);  // [I; I] + noise
  newton_schulz(x, 5, ab.tensor({n * n}, DType::f32), bb.tensor({n * n}, DType::f32),
                pb.tensor({m * n}, DType::f32));
  // O^T O's diagonal (squared singular values in the right basis) lies in the band; its trace
  // is the sum of the squared singular values.
  Mat o(x.f32(), x.f32() + m * n);
  const Mat oto = matmul(transpose(o, m, n), o, n, m, n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      if (i == j) {
        EXPECT_GT(oto[i * n + i], 0.68 * 0.68) << i;
        EXPECT_LT(oto[i * n + i], 1.13 * 1.13) << i;
      } else {
        EXPECT_LT(std::abs(oto[i * n + j]), 0.2) << i << "," << j;
      }
    }
}

TEST(LossScaler, SkipsHalvesAndGrows) {
  OptimizerConfig c;
  c.initial_loss_scale = 1024.0f;
  c.loss_scale_window = 2;
  LossScaler s(c, true);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1024.0f);
  LossScaler off(c, false);
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_FALSE(off.update(true));
}

}  // namespace
}  // namespace llmt
