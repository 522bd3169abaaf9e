#include "train/shrink.h"

#include <algorithm>

#include "core/check.h"

namespace llmt {

using detail::concat;

Shrunk shrink_overrides(const Config& c) {
  const ParallelConfig& p = c.parallel;
  const int64_t tp = std::min<int64_t>(p.tp, 2), cp = std::min<int64_t>(p.cp, 2),
                pp = std::min<int64_t>(p.pp, 2);
  const bool interleaved = p.pp_schedule == PipeSchedule::interleaved;
  const int64_t v = interleaved || v_shaped(p.pp_schedule) ? 2 : 1;
  // dp: 2 when the setup has data parallelism and the world stays within 8 ranks.
  const int64_t rest = tp * cp * pp, dp = p.dp != 1 && rest * 2 <= 8 ? 2 : 1;
  // Micro-batches per dp rank: interleaved needs a multiple of pp, DualPipeV at least 2pp-1.
  const bool dualpipe = p.pp_schedule == PipeSchedule::dualpipe_v;
  const int64_t mbs = 1, micro = interleaved || dualpipe ? 2 * pp : 2;
  // Expert parallelism: over the shrunk dp x cp group when the setup has it (2 of its ranks when
  // the experts do not divide over all of them).
  const int64_t g = dp * cp, E = c.model.moe.num_experts;
  const int64_t ep = p.ep == 1 || g == 1 ? 1 : E % g == 0 ? g : (g % 2 == 0 && E % 2 == 0 ? 2 : 1);
  const bool gqa = c.model.n_kv_heads > 0 && c.model.n_kv_heads != c.model.n_heads;
  // Hybrid context parallelism needs an all-to-all group of 1 < u < cp: at cp 2 it is a ring.
  const CpImpl impl = p.cp_impl == CpImpl::hybrid ? CpImpl::ring : p.cp_impl;
  Shrunk s;
  s.world = static_cast<int>(rest * dp);
  s.overrides = {
      "model.n_layers=4",
      "model.d_model=64",
      "model.n_heads=8",
      concat("model.n_kv_heads=", gqa ? 4 : 0),
      "model.d_ff=0",
      "model.seq_len=64",
      "model.vocab_size=256",
      concat("parallel.tp=", tp),
      concat("parallel.cp=", cp),
      concat("parallel.cp_impl=\"", cp_impl_name(impl), "\""),
      "parallel.cp_ulysses=0",
      concat("parallel.pp=", pp),
      concat("parallel.virtual_stages=", pp > 1 ? v : 1),
      "parallel.pp_layers=[]",
      concat("parallel.dp=", dp),
      concat("parallel.ep=", ep),
      concat("train.micro_batch_size=", mbs),
      concat("train.global_batch_size=", dp * mbs * micro),
      "train.steps=4",
      "train.eval_interval=0",
      "train.recompute_layers=0",
      "optimizer.warmup_steps=1",
      "optimizer.decay_steps=0",
  };
  if (pp == 1) {  // (no pipeline: no schedule)
    s.overrides.push_back("parallel.pp_schedule=\"1f1b\"");
    s.overrides.push_back("parallel.pp_max_deferred=-1");
  }
  if (c.model.mla_attention()) {
    // Latent attention at toy ranks: a low-rank query where the setup has one, values narrower
    // than the query/key heads as DeepSeek's are.
    for (const std::string& o :
         {concat("model.mla.q_lora_rank=", c.model.mla.q_lora_rank > 0 ? 24 : 0),
          std::string("model.mla.kv_lora_rank=16"), std::string("model.mla.qk_nope_head_dim=8"),
          std::string("model.mla.qk_rope_head_dim=4"), std::string("model.mla.v_head_dim=8")})
      s.overrides.push_back(o);
  }
  if (c.model.moe.enabled()) {
    // Experts as narrow as the model (256 experts of 2048 would be 100M parameters a layer).
    s.overrides.push_back("model.moe.d_ff_expert=32");
    s.overrides.push_back("model.moe.d_ff_shared=0");
  }
  return s;
}

Config parse_shrunk(const std::string& path, const std::vector<std::string>& overrides,
                    Shrunk& shrunk) {
  Config full;
  try {
    full = parse_config(path, overrides);
  } catch (const ConfigError&) {
    full = parse_config(path);  // the file alone; the final parse below reports what stays wrong
  }
  shrunk = shrink_overrides(full);
  std::vector<std::string> sets = shrunk.overrides;
  sets.insert(sets.end(), overrides.begin(), overrides.end());
  return parse_config(path, sets);
}

}  // namespace llmt
