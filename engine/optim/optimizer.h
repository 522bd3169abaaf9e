// The optimizer interface and AdamW, the learning-rate schedule, global-norm clipping and the fp16
// dynamic loss scaler (docs/model.md, "Training step"). Each takes only [optimizer]. Muon: muon.h.
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

// One parameter, or the rows of it this rank owns, that the optimizer updates: rows
// [row_begin, row_begin + value.size(0)) of parameter `param`, its fp32 master weights `value`
// and gradient `grad` (same shape), and whether weight decay applies.
struct OptimizerSlot {
  size_t param = 0;
  int64_t row_begin = 0;
  Tensor value, grad;
  bool decay = false;
};

// One tensor of an optimizer's state: state `name` of slot `slot` (the slot's shape).
struct SlotState {
  std::string name;
  size_t slot = 0;
  Tensor tensor;
};

// An update rule over a list of slots. Checkpoints store whatever state() lists, by name.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate `lr` on gradients multiplied by `grad_scale` as they are read
  // (clipping and loss unscaling, fused into the update). `t` is the 1-based count of applied
  // updates (bias correction).
  virtual void step(double lr, int64_t t, float grad_scale) = 0;
  // Every state tensor it keeps, by slot.
  virtual std::vector<SlotState> state() const = 0;
};

// AdamW with decoupled weight decay on every slot (decay where the slot says so): "exp_avg" (m)
// and "exp_avg_sq" (v) per slot, in two flat buffers carved like the slots. Under [offload]
// "nvme" the buffers are files (Allocator::allocate, Offload::with_optimizer), and step streams
// over the slots in chunks of the FileStore's size: the next chunk read ahead while one is
// updated, each updated one written back and dropped from memory (the same elementwise update,
// so the same bits).
class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerConfig& cfg, Allocator& alloc, std::vector<OptimizerSlot> slots);
  void step(double lr, int64_t t, float grad_scale) override;
  std::vector<SlotState> state() const override;
  static constexpr const char* kStateNames[] = {"exp_avg", "exp_avg_sq"};

 private:
  OptimizerConfig cfg_;
  std::vector<OptimizerSlot> slots_;
  FileStore* store_ = nullptr;  // the allocator's, when it offloads
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
