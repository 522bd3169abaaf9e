// [optimizer] section: the optimizer (AdamW or Muon), the LR schedule, gradient clipping and fp16
// loss scaling. Lives with the optimizer so it depends only on its own section; train parses it.
#pragma once

#include <cstdint>

namespace llmt {

class Rules;

enum class LrDecay : uint8_t { cosine, linear, constant };

// adamw: AdamW on every parameter. muon: Muon on every 2-D hidden weight matrix (attention, MLP,
// each expert's matrices), AdamW on the rest (engine/optim/muon.h).
enum class OptimizerType : uint8_t { adamw, muon };

// [optimizer.muon] (Jordan et al. 2024; the update scale of Moonlight, Liu et al. 2025).
struct MuonConfig {
  float momentum = 0.95f;
  bool nesterov = true;
  int64_t ns_steps = 5;  // quintic Newton-Schulz iterations
};

// [optimizer]: the optimizer + LR schedule + clipping + fp16 loss scaling. lr, weight_decay and
// the schedule apply to both optimizers; beta1, beta2 and eps to AdamW (under Muon: on the
// parameters that are not hidden matrices).
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  float lr = 6e-4f;
  float min_lr = 6e-5f;
  int64_t warmup_steps = 0;
  LrDecay decay = LrDecay::cosine;
  int64_t decay_steps = 0;  // 0 = train.steps
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;               // 0 disables clipping
  float initial_loss_scale = 65536.0f;  // fp16 only
  int64_t loss_scale_window = 1000;     // fp16: steps without overflow before doubling the scale
  MuonConfig muon;
};

// [optimizer]'s rules on the resolved section (raw: as written; decay_steps = 0 there means
// train.steps); fp16: train.precision is "fp16" (the loss scaler's keys then matter).
void check_optimizer_config(const OptimizerConfig& o, const OptimizerConfig& raw, bool fp16,
                            Rules& r);

}  // namespace llmt
