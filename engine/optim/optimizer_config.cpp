// [optimizer]'s rules, reported through the config's Rules.
#include "engine/optim/optimizer_config.h"

#include "config/rules.h"

namespace llmt {

using detail::concat;

void check_optimizer_config(const OptimizerConfig& o, const OptimizerConfig& raw, bool fp16,
                            Rules& r) {
  r.positive("optimizer.lr", o.lr);
  r.at_least("optimizer.min_lr", o.min_lr, 0.0f);
  if (o.lr > 0 && o.min_lr >= 0) {
    r.require(o.min_lr <= o.lr, {"optimizer.min_lr", "optimizer.lr"},
              concat("optimizer.min_lr=", toml_text(o.min_lr),
                     " is above optimizer.lr=", toml_text(o.lr)));
  }
  r.at_least<int64_t>("optimizer.warmup_steps", o.warmup_steps, 0);
  const bool decay_derived = raw.decay_steps == 0;
  if (!decay_derived) {
    r.at_least<int64_t>("optimizer.decay_steps", o.decay_steps, 1, ", or 0 for train.steps");
  }
  if (o.warmup_steps >= 0 && o.decay_steps >= 1) {
    r.require(o.warmup_steps <= o.decay_steps,
              {"optimizer.warmup_steps", decay_derived ? "train.steps" : "optimizer.decay_steps"},
              concat("optimizer.warmup_steps=", o.warmup_steps, " exceeds optimizer.decay_steps=",
                     o.decay_steps, decay_derived ? " = train.steps" : ""));
  }
  r.unit_interval("optimizer.beta1", o.beta1);
  r.unit_interval("optimizer.beta2", o.beta2);
  r.positive("optimizer.eps", o.eps);
  r.at_least("optimizer.weight_decay", o.weight_decay, 0.0f);
  r.at_least("optimizer.grad_clip", o.grad_clip, 0.0f);
  if (o.type == OptimizerType::muon) {
    r.unit_interval("optimizer.muon.momentum", o.muon.momentum);
    r.at_least<int64_t>("optimizer.muon.ns_steps", o.muon.ns_steps, 1);
  } else {
    // [optimizer.muon] set for AdamW, which would ignore it: most likely optimizer.type was
    // forgotten.
    const MuonConfig d;
    auto unused = [&](const char* key, bool differs) {
      r.require(!differs, {key, "optimizer.type"},
                concat(key,
                       " is set but optimizer.type = \"adamw\" does not use it: set "
                       "optimizer.type = \"muon\", or remove it"));
    };
    unused("optimizer.muon.momentum", raw.muon.momentum != d.momentum);
    unused("optimizer.muon.nesterov", raw.muon.nesterov != d.nesterov);
    unused("optimizer.muon.ns_steps", raw.muon.ns_steps != d.ns_steps);
  }
  if (fp16) {
    r.require(o.initial_loss_scale > 0, {"optimizer.initial_loss_scale", "train.precision"},
              concat("optimizer.initial_loss_scale=", toml_text(o.initial_loss_scale),
                     " must be > 0 with train.precision=\"fp16\""));
    r.require(o.loss_scale_window >= 1, {"optimizer.loss_scale_window", "train.precision"},
              concat("optimizer.loss_scale_window=", o.loss_scale_window,
                     " must be >= 1 with train.precision=\"fp16\""));
  }
}

}  // namespace llmt
