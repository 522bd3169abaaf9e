// AdamW state lives in two flat buffers (m, v) carved like the slots; updates are ops, one
// multi-tensor call per step (and per norm).
#include "engine/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/file_memory.h"
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
  m_buf_ = alloc.allocate(bytes, MemCategory::optimizer, Offload::with_optimizer);
  v_buf_ = alloc.allocate(bytes, MemCategory::optimizer, Offload::with_optimizer);
  store_ = alloc.file_store();
  size_t off = 0;
  for (const OptimizerSlot& s : slots_) {
    m_.push_back(m_buf_.tensor(s.value.shape, DType::f32, off));
    v_.push_back(v_buf_.tensor(s.value.shape, DType::f32, off));
    off += s.value.nbytes();
  }
}

void AdamW::step(double lr, int64_t t, float grad_scale) {
  const ops::AdamWParams hp{.lr = static_cast<float>(lr),
                            .beta1 = cfg_.beta1,
                            .beta2 = cfg_.beta2,
                            .eps = cfg_.eps,
                            .weight_decay = cfg_.weight_decay,
                            .step = t,
                            .grad_scale = grad_scale};
  const bool streamed = store_ && !slots_.empty() &&
                        (store_->holds(m_buf_.data()) || store_->holds(slots_[0].value.data));
  if (!streamed) {
    std::vector<ops::AdamWTensor> ts;
    ts.reserve(slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i)
      ts.push_back({slots_[i].value, slots_[i].grad, m_[i], v_[i], slots_[i].decay});
    ops::adamw_update(ts, hp);
    return;
  }
  // Offloaded: chunks of at most `per` elements of each tensor, cut across the slots (flat).
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(store_->chunk_bytes() / 4));
  std::vector<std::vector<ops::AdamWTensor>> chunks(1);
  int64_t filled = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const int64_t n = slots_[i].value.numel();
    const auto flat = [n](Tensor t) { return t.view({n}); };
    const Tensor val = flat(slots_[i].value), g = flat(slots_[i].grad), m = flat(m_[i]),
                 v = flat(v_[i]);
    for (int64_t at = 0; at < n;) {
      if (filled == per) {
        chunks.emplace_back();
        filled = 0;
      }
      const int64_t take = std::min(n - at, per - filled);
      chunks.back().push_back({val.rows(at, at + take), g.rows(at, at + take),
                               m.rows(at, at + take), v.rows(at, at + take), slots_[i].decay});
      at += take;
      filled += take;
    }
  }
  const auto each = [](const std::vector<ops::AdamWTensor>& c, auto&& f) {
    for (const ops::AdamWTensor& t : c)
      for (const Tensor& x : {t.param, t.m, t.v}) f(x.data, x.nbytes());
  };
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (c + 1 < chunks.size())
      each(chunks[c + 1], [this](void* p, size_t n) { store_->read_ahead(p, n); });
    ops::adamw_update(chunks[c], hp);
    each(chunks[c], [this](void* p, size_t n) { store_->drop(p, n); });
  }
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
