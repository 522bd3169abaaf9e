// AdamW over a model's parameters, the learning-rate schedule, global-norm clipping and the fp16
// dynamic loss scaler (docs/model.md, "Training step"). Each takes only [optimizer].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "engine/optim/optimizer_config.h"

namespace llmt {

// LR at 1-based step s: linear warmup to `lr`, then cosine/linear/constant towards `min_lr`
// over decay_steps (resolved: never 0).
double lr_at(const OptimizerConfig& cfg, int64_t step);

// L2 norm over all tensors (sum of squares in double).
double global_norm(const std::vector<Tensor>& tensors);

// The factor that brings `norm` down to grad_clip: min(1, clip / (norm + 1e-6)); 1 when off.
double clip_coefficient(const OptimizerConfig& cfg, double norm);

class AdamW {
 public:
  // params/grads: one view per parameter (same order); decay[i]: weight decay applies to i.
  AdamW(const OptimizerConfig& cfg, Allocator& alloc, const std::vector<Tensor>& params,
        std::vector<bool> decay);
  // One update with learning rate `lr` on gradients multiplied by `grad_scale` as they are read
  // (clipping and loss unscaling, fused into the update). `step` is the 1-based count of applied
  // updates (bias correction).
  void step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, double lr,
            int64_t step, float grad_scale = 1.0f);
  // The state, named, one view per parameter in the constructor's order: "exp_avg" (m) and
  // "exp_avg_sq" (v). Checkpoints store and restore what this lists, in place.
  struct NamedState {
    std::string name;
    std::vector<Tensor> tensors;
  };
  static constexpr const char* kStateNames[] = {"exp_avg", "exp_avg_sq"};
  std::vector<NamedState> state() const { return {{kStateNames[0], m_}, {kStateNames[1], v_}}; }

 private:
  OptimizerConfig cfg_;
  std::vector<bool> decay_;
  Buffer m_buf_, v_buf_;
  std::vector<Tensor> m_, v_;
};

// Dynamic loss scaling for fp16: on overflow the step is skipped and the scale halved; after
// `loss_scale_window` clean steps it doubles.
class LossScaler {
 public:
  LossScaler(const OptimizerConfig& cfg, bool enabled);
  float scale() const { return enabled_ ? scale_ : 1.0f; }
  // Records whether this step's gradients overflowed; returns true if the step must be skipped.
  bool update(bool overflow);

  // The whole state, for checkpoints: the current scale and the clean steps since it changed.
  struct State {
    float scale;
    int64_t clean_steps;
  };
  State state() const { return {scale_, clean_steps_}; }
  void restore(const State& s) {
    scale_ = s.scale;
    clean_steps_ = s.clean_steps;
  }

 private:
  bool enabled_;
  float scale_;
  int64_t window_;
  int64_t clean_steps_ = 0;
};

}  // namespace llmt
