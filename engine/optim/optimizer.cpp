// AdamW state lives in two flat buffers (m, v) carved like the slots; updates are ops, one
// multi-tensor call per step (and per norm).
#include "engine/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/ops.h"

namespace llmt {

double lr_at(const OptimizerConfig& cfg, int64_t step) {
  const double lr = cfg.lr, min_lr = cfg.min_lr;
  if (cfg.warmup_steps > 0 && step <= cfg.warmup_steps)
    return lr * static_cast<double>(step) / static_cast<double>(cfg.warmup_steps);
  const double span = static_cast<double>(std::max<int64_t>(1, cfg.decay_steps - cfg.warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - cfg.warmup_steps) / span, 0.0, 1.0);
  switch (cfg.decay) {
    case LrDecay::cosine:
      return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
    case LrDecay::linear:
      return lr - (lr - min_lr) * progress;
    case LrDecay::constant:
      return lr;
  }
  return lr;
}

double global_norm(const std::vector<Tensor>& tensors) {
  return std::sqrt(ops::sum_squares(tensors));
}

double clip_coefficient(const OptimizerConfig& cfg, double norm) {
  if (cfg.grad_clip <= 0.0f) return 1.0;
  return std::min(1.0, static_cast<double>(cfg.grad_clip) / (norm + 1e-6));
}

AdamW::AdamW(const OptimizerConfig& cfg, Allocator& alloc, std::vector<OptimizerSlot> slots)
    : cfg_(cfg), slots_(std::move(slots)) {
  size_t bytes = 0;
  for (const OptimizerSlot& s : slots_) bytes += s.value.nbytes();
  m_buf_ = alloc.allocate(bytes, MemCategory::optimizer);
  v_buf_ = alloc.allocate(bytes, MemCategory::optimizer);
  size_t off = 0;
  for (const OptimizerSlot& s : slots_) {
    m_.push_back(m_buf_.tensor(s.value.shape, DType::f32, off));
    v_.push_back(v_buf_.tensor(s.value.shape, DType::f32, off));
    off += s.value.nbytes();
  }
}

void AdamW::step(double lr, int64_t t, float grad_scale) {
  std::vector<ops::AdamWTensor> ts;
  ts.reserve(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i)
    ts.push_back({slots_[i].value, slots_[i].grad, m_[i], v_[i], slots_[i].decay});
  const ops::AdamWParams hp{.lr = static_cast<float>(lr),
                            .beta1 = cfg_.beta1,
                            .beta2 = cfg_.beta2,
                            .eps = cfg_.eps,
                            .weight_decay = cfg_.weight_decay,
                            .step = t,
                            .grad_scale = grad_scale};
  ops::adamw_update(ts, hp);
}

std::vector<SlotState> AdamW::state() const {
  std::vector<SlotState> out;
  for (size_t i = 0; i < slots_.size(); ++i) out.push_back({kStateNames[0], i, m_[i]});
  for (size_t i = 0; i < slots_.size(); ++i) out.push_back({kStateNames[1], i, v_[i]});
  return out;
}

LossScaler::LossScaler(const OptimizerConfig& cfg, bool enabled)
    : enabled_(enabled), scale_(cfg.initial_loss_scale), window_(cfg.loss_scale_window) {}

bool LossScaler::update(bool overflow) {
  if (!enabled_) return false;
  if (overflow) {
    scale_ = std::max(scale_ * 0.5f, 1.0f);
    clean_steps_ = 0;
    return true;
  }
  if (++clean_steps_ >= window_) {
    scale_ *= 2.0f;
    clean_steps_ = 0;
  }
  return false;
}

}  // namespace llmt
