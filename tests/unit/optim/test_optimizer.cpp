// LR schedule values, clipping coefficient, AdamW over several tensors with and without decay,
// and the fp16 loss scaler's skip/halve/grow rules.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

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
  AdamW opt(c, alloc, p, {true, false});
  EXPECT_EQ(alloc.stats().live[static_cast<int>(MemCategory::optimizer)], 2 * 16);
  const double lr = 0.01;
  opt.step(p, g, lr, 1);
  opt.step(p, g, lr, 2);
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
