#include "train/rank_model.h"

#include "engine/data_parallel/data_parallel.h"
#include "engine/schedule/schedule.h"
#include "train/trainer.h"

namespace llmt {

std::unique_ptr<Transformer> make_rank_model(const Config& cfg, const ModelSpec& rank_spec,
                                             Allocator& alloc, Communicator* tp, Communicator* cp,
                                             Communicator* ep) {
  const DType compute = compute_dtype(cfg.train.precision);
  return std::make_unique<Transformer>(
      rank_spec, alloc, cfg.train.micro_batch_size, compute,
      model_storage(cfg.parallel.zero_stage, compute, grad_dtype(cfg.train)),
      TensorParallel{tp, cfg.parallel.sequence_parallel},
      RecomputeOptions{cfg.train.recompute, cfg.train.recompute_layers, cfg.train.recompute_modules,
                       cfg.train.distribute_saved_activations},
      ContextParallel{cp, cfg.parallel.cp_impl, static_cast<int>(cfg.parallel.cp_ulysses),
                      cp_kv_payload(cfg)},
      ep,
      /*decode_len=*/0, Fp8Recipe{cfg.train.fp8, cfg.train.fp8_block});
}

int64_t cp_kv_payload(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const bool split = cfg.parallel.pp > 1 && splits_backward(cfg.parallel.pp_schedule);
  if (!m.mla_attention() || !cfg.parallel.cp_latent || split) return 0;
  return m.mla.kv_lora_rank + m.mla.qk_rope_head_dim;
}

}  // namespace llmt
