#include "plan/search.h"

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <utility>

#include "config/toml_text.h"
#include "engine/parallel/context_parallel.h"
#include "engine/schedule/schedule.h"
#include "train/config.h"

namespace llmt {

namespace {

using detail::concat;

constexpr const char* kRecompute[] = {"none", "selective", "full"};

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

// Layers of each of S >= 3 pipeline stages: `ends` on the first and the last, the rest spread
// over the middle stages as evenly as possible (the earlier middle stages take the extra layers).
std::vector<int64_t> lighter_ends(int64_t L, int64_t S, int64_t ends) {
  std::vector<int64_t> n(static_cast<size_t>(S), ends);
  const int64_t middle = S - 2, rest = L - 2 * ends;
  for (int64_t s = 1; s <= middle; ++s)
    n[static_cast<size_t>(s)] = rest / middle + (s <= rest % middle ? 1 : 0);
  return n;
}

// The splits of L layers over S <= L global pipeline stages that the search tries, at most two
// (parallel.pp_layers; empty: the even split). The first stage also runs the embedding and the
// last the head and the loss, so they are the ones given fewer layers. When S divides L: the even
// split and, when every stage keeps a layer, the first and last stage one layer lighter (70 over
// 10: [], [6, 8, 8, 7x6, 6]). Otherwise the split as even as possible with the extra layers on the
// middle stages (70 over 12: [5, 6x10, 5]); what the middle cannot take goes to the first stage
// (61 over 2: [31, 30]).
std::vector<std::vector<int64_t>> stage_splits(int64_t L, int64_t S) {
  const int64_t q = L / S, r = L % S;
  if (r == 0) {
    if (S >= 3 && q >= 2) return {{}, lighter_ends(L, S, q - 1)};
    return {{}};
  }
  if (r <= S - 2) return {lighter_ends(L, S, q)};
  std::vector<int64_t> n(static_cast<size_t>(S), q + 1);
  n.back() = q;
  return {n};
}

// "[7, 8x14, 7]": a split with its runs of equal stages counted.
std::string split_text(const std::vector<int64_t>& n) {
  std::string s = "[";
  for (size_t i = 0; i < n.size();) {
    size_t j = i;
    while (j < n.size() && n[j] == n[i]) ++j;
    s += concat(i ? ", " : "", n[i], j - i > 1 ? concat("x", j - i) : std::string());
    i = j;
  }
  return s + "]";
}

// A structural layout: what the parse-time rules of [model] and [parallel] judge.
struct LayoutShape {
  int tp, cp, pp, v;
  bool sp;
  PipeSchedule schedule;
  CpImpl cp_impl;
  int cp_ulysses;                  // hybrid's all-to-all group (0 otherwise)
  std::vector<int64_t> pp_layers;  // layers of each global stage; empty: the even split
  bool cp_latent = true;           // latent attention's cp: the latent, or the K/V
  int max_deferred = -1;           // DualPipeV's parallel.pp_max_deferred
};

std::vector<std::string> shape_sets(const LayoutShape& s, int dp) {
  std::vector<std::string> sets{
      concat("parallel.tp=", s.tp),
      concat("parallel.cp=", s.cp),
      concat("parallel.pp=", s.pp),
      concat("parallel.dp=", dp),
      concat("parallel.sequence_parallel=", s.sp ? "true" : "false"),
      concat("parallel.pp_schedule=\"", schedule_name(s.schedule), "\""),
      concat("parallel.virtual_stages=", s.v),
      concat("parallel.cp_impl=\"", std::string(cp_impl_name(s.cp_impl)), "\""),
      concat("parallel.cp_ulysses=", s.cp_ulysses),
      concat("parallel.cp_latent=", s.cp_latent ? "true" : "false"),
      concat("parallel.pp_layers=", toml_text(s.pp_layers)),
      concat("parallel.pp_max_deferred=", s.max_deferred)};
  // parallel.ep is added with the layout's own value
  return sets;
}

}  // namespace

std::string layout_text(const Config& cfg, int world) {
  const ParallelConfig& p = cfg.parallel;
  const MeshShape mesh = mesh_shape(p, world);
  std::string s = concat("tp ", p.tp, p.sequence_parallel && p.tp > 1 ? " sp" : "", ", cp ", p.cp);
  if (p.cp > 1) s += concat(" ", std::string(cp_impl_name(p.cp_impl)));
  if (p.cp_impl == CpImpl::hybrid) s += concat(" u", p.cp_ulysses);
  if (p.cp > 1 && cfg.model.mla_attention()) s += p.cp_latent ? " of the latent" : " of K/V";
  s += concat(", pp ", p.pp);
  if (p.pp > 1) {
    s += concat(" ", schedule_name(p.pp_schedule));
    if (p.virtual_stages > 1) s += concat(" v", p.virtual_stages);
    if (p.pp_max_deferred >= 0) s += concat(" deferring at most ", p.pp_max_deferred);
    if (!p.pp_layers.empty()) s += concat(" layers ", split_text(p.pp_layers));
  }
  s += concat(", dp ", mesh.size(Axis::dp), p.ep > 1 ? concat(" ep ", p.ep) : std::string(),
              ", zero ", p.zero_stage,
              p.zero_shard_group > 0 ? concat(" sharded over ", p.zero_shard_group) : std::string(),
              p.zero_hierarchical_partition > 0
                  ? concat(" secondary over ", p.zero_hierarchical_partition)
                  : std::string(),
              p.zero_quantized_weights ? " int8 weights" : "",
              p.zero_quantized_gradients ? " int4 gradients" : "", ", recompute ",
              kRecompute[static_cast<int>(cfg.train.recompute)],
              cfg.train.recompute_modules == RecomputeModules{}
                  ? std::string()
                  : concat(" ", recompute_modules_text(cfg.train.recompute_modules)),
              ", mbs ", cfg.train.micro_batch_size);
  return s;
}

SearchResult search_layouts(const std::string& path, const std::vector<std::string>& overrides,
                            const Config& base, int world, const HardwareProfile& hw, size_t keep) {
  SearchResult out;
  const int per_node = hw.devices_per_node > 0 ? hw.devices_per_node : world;
  const int64_t L = base.model.n_layers, T = base.model.seq_len, gbs = base.train.global_batch_size;
  // ZeRO++'s quantised weights and gradients, kept from the config on the stage-3 candidates.
  const bool qwz = base.parallel.zero_quantized_weights;
  const bool qgz = base.parallel.zero_quantized_gradients;
  const int64_t qg_group = base.parallel.zero_quantized_gradients_group;
  // [offload]: the optimizer's kept on every candidate, ZeRO-3's shards' on the stage-3 ones.
  const OffloadTarget offload_params = base.offload.params;
  // Without the optimizer's offload, a candidate without ZeRO-3's has no "nvme" left: its folder
  // and chunk size go back to their defaults (a rule refuses them set without "nvme").
  const bool offload_only_params =
      base.offload.optimizer == OffloadTarget::none && offload_params != OffloadTarget::none;
  const std::vector<std::string> no_offload_folder{"offload.nvme_dir=\"\"", "offload.buffer_mb=64"};
  const int64_t qwz_block = base.parallel.zero_quant_block;
  // Context parallelism pays from long sequences on: cp > 1 is tried from 8192 positions.
  std::vector<LayoutShape> shapes;
  for (int tp : divisors(world)) {
    if (tp > per_node) continue;
    for (int cp : divisors(world / tp)) {
      if (cp > 1 && T < 8192) continue;
      for (int pp : divisors(world / (tp * cp))) {
        if (pp > L) continue;
        for (bool sp : {false, true}) {
          if (sp && tp == 1) continue;
          // (schedule, chunks per rank, DualPipeV's pp_max_deferred)
          std::vector<std::tuple<PipeSchedule, int, int>> schedules{
              {PipeSchedule::one_f_one_b, 1, -1}};
          if (pp > 1) {
            schedules.push_back({PipeSchedule::zb_h1, 1, -1});
            if (pp * 2 <= L) {
              schedules.push_back({PipeSchedule::zb_v, 2, -1});
              // DualPipeV with routed experts, as DualPipe splits its backwards and deferring one
              // weight half at a time (each deferred one keeps its MoE layers' row gradients); m
              // >= 2pp-1: the rules. (A dense model's is ZB-V's bubble with one more unit in
              // flight: never better in this model, and 1.4x the search's time.)
              if (base.model.moe.enabled()) {
                schedules.push_back({PipeSchedule::dualpipe_v, 2, -1});
                schedules.push_back({PipeSchedule::dualpipe_v, 2, 1});
              }
            }
            for (int v : {2, 4})
              if (pp * v <= L) schedules.push_back({PipeSchedule::interleaved, v, -1});
          }
          // (implementation, hybrid's all-to-all group): the ring, Ulysses, and hybrid over every
          // group size 1 < u < cp dividing cp (the heads' divisibility is the rules').
          std::vector<std::pair<CpImpl, int>> impls{{CpImpl::ring, 0}};
          if (cp > 1) impls.push_back({CpImpl::ulysses, 0});
          for (int u = 2; u < cp; ++u)
            if (cp % u == 0) impls.push_back({CpImpl::hybrid, u});
          // Latent attention's ring or Ulysses group moves the latent (fewer bytes, more kv_b
          // GEMMs and copies) or the K/V: both are tried where the schedule lets it move the
          // latent.
          for (auto [sched, v, deferred] : schedules) {
            const bool both =
                cp > 1 && base.model.mla_attention() && !(pp > 1 && splits_backward(sched));
            for (const std::vector<int64_t>& split : stage_splits(L, int64_t{pp} * v))
              for (auto [impl, u] : impls)
                for (bool latent : {true, false})
                  if (latent || both)
                    shapes.push_back({tp, cp, pp, v, sp, sched, impl, u, split, latent, deferred});
          }
        }
      }
    }
  }
  // Keep the best `keep` by step time.
  // Faster first; at an equal step time less memory on the fullest rank, then the layout's
  // overrides in text order: the ranking is the same on every run of the same config and profile.
  auto better = [](const Candidate& a, const Candidate& b) {
    if (a.cost.step_s != b.cost.step_s) return a.cost.step_s < b.cost.step_s;
    const double ma = a.cost.stages[static_cast<size_t>(a.cost.most_memory)].peak,
                 mb = b.cost.stages[static_cast<size_t>(b.cost.most_memory)].peak;
    if (ma != mb) return ma < mb;
    return a.sets < b.sets;
  };
  ActivationCache activations;  // one model config: its rank models' layouts, each built once
  for (const LayoutShape& s : shapes) {
    const int dp = world / (s.tp * s.cp * s.pp);
    Config shaped;
    std::vector<std::string> sets = shape_sets(s, dp);
    try {
      std::vector<std::string> all = overrides;
      all.insert(all.end(), sets.begin(), sets.end());
      all.insert(all.end(), ddp_overrides().begin(), ddp_overrides().end());
      if (offload_only_params)
        all.insert(all.end(), no_offload_folder.begin(), no_offload_folder.end());
      all.push_back("train.distribute_saved_activations=false");  // chosen per candidate below
      shaped = parse_config(path, all);
    } catch (const ConfigError&) {
      continue;  // a rule of [model] or [parallel] refuses this shape
    }
    // Expert parallelism: every ep dividing dp x cp and the experts.
    std::vector<int> eps{1};
    if (shaped.model.moe.enabled())
      for (int ep : divisors(dp * s.cp))
        if (ep > 1 && shaped.model.moe.num_experts % ep == 0) eps.push_back(ep);
    for (int64_t mbs = 1; mbs <= gbs / dp && mbs <= 16; mbs *= 2) {
      if ((gbs / dp) % mbs != 0 || gbs % dp != 0) continue;
      for (int ep : eps)
        for (int zero = 0; zero <= (dp * s.cp > 1 ? 3 : 0); ++zero) {
          // ZeRO over all of dp x cp; when dp spans more than a node, hybrid sharding with a
          // node's dp ranks in each shard group (its collectives inside the node, one
          // all-reduce of the shards across nodes), and at stage 3 hpZ's secondary copy over a
          // node's dp ranks instead (each unit's later gathers inside the node): (shard group,
          // hierarchical partition) pairs.
          std::vector<std::pair<int, int>> zero_groups{{0, 0}};
          const int node_dp = per_node / (s.tp * s.cp);
          if (zero >= 1 && node_dp >= 1 && node_dp < dp && dp % node_dp == 0 &&
              (node_dp * s.cp) % ep == 0) {
            zero_groups.push_back({node_dp, 0});
            if (zero == 3) zero_groups.push_back({0, node_dp});
          }
          // Recompute none, selective (the attention core), full, full with its inputs
          // distributed over tp (tp > 1 without SP), selective of the norms and the
          // activations (no matmul replayed), and with latent attention (a query latent)
          // selective of all of it, the core and the up projections too (DeepSeek-V3's choice
          // with the core's).
          for (const auto& [shard_group, hpz] : zero_groups)
            for (int rc = 0; rc < 6; ++rc) {
              const bool distribute = rc == 3, up = rc == 5, cheap = rc == 4 || up;
              if (distribute && (s.tp == 1 || s.sp)) continue;
              if (up && !(base.model.mla_attention() && base.model.mla.q_lora_rank > 0)) continue;
              Candidate c{sets, shaped, {}};
              c.cfg.parallel.ep = ep;
              c.cfg.parallel.zero_stage = zero;
              c.cfg.parallel.zero_shard_group = shard_group;
              c.cfg.parallel.zero_hierarchical_partition = hpz;
              // qwZ and qgZ stay the config's choice (they change the numbers), on stage 3 only.
              c.cfg.parallel.zero_quantized_weights = zero == 3 && qwz;
              c.cfg.parallel.zero_quantized_gradients = zero == 3 && qgz;
              // (qgZ's first hop too, where its groups cut this candidate's dp and shard groups.)
              c.cfg.parallel.zero_quantized_gradients_group =
                  zero == 3 && qgz && qg_group > 0 && dp % qg_group == 0 &&
                          (qg_group * s.cp) % ep == 0 &&
                          (shard_group == 0 || shard_group % qg_group == 0)
                      ? qg_group
                      : 0;
              c.cfg.offload.params = zero == 3 ? offload_params : OffloadTarget::none;
              if (offload_only_params && zero == 3) {
                c.cfg.offload.nvme_dir = base.offload.nvme_dir;
                c.cfg.offload.buffer_mb = base.offload.buffer_mb;
              }
              c.cfg.parallel.zero_quant_block = zero == 3 ? qwz_block : 256;
              c.cfg.train.micro_batch_size = mbs;
              c.cfg.train.recompute = distribute ? Recompute::full
                                      : cheap    ? Recompute::selective
                                                 : static_cast<Recompute>(rc);
              c.cfg.train.recompute_modules = RecomputeModules{};
              if (cheap)  // ("act" where the model has an MLP it reruns, "moe_act" routed experts)
                c.cfg.train.recompute_modules.bits = static_cast<uint8_t>(
                    (1u << static_cast<int>(RecomputeModule::layernorm)) |
                    (c.cfg.model.has_unrouted_mlp() ? 1u << static_cast<int>(RecomputeModule::act)
                                                    : 0u) |
                    (c.cfg.model.moe.num_experts > 0
                         ? 1u << static_cast<int>(RecomputeModule::moe_act)
                         : 0u) |
                    (up ? (1u << static_cast<int>(RecomputeModule::core_attn)) |
                              (1u << static_cast<int>(RecomputeModule::mla_up_proj))
                        : 0u));
              c.cfg.train.recompute_layers = 0;
              c.cfg.train.distribute_saved_activations = distribute;
              try {
                c.cost = predict_step(c.cfg, world, hw, &activations);
              } catch (const ConfigError&) {
                continue;
              }
              ++out.valid;
              if (!c.cost.fits) continue;
              ++out.fitting;
              c.sets.push_back(concat("parallel.ep=", ep));
              c.sets.push_back(concat("parallel.zero_stage=", zero));
              c.sets.push_back(concat("parallel.zero_shard_group=", shard_group));
              c.sets.push_back(concat("parallel.zero_hierarchical_partition=", hpz));
              c.sets.push_back(concat("parallel.zero_quantized_weights=",
                                      c.cfg.parallel.zero_quantized_weights ? "true" : "false"));
              c.sets.push_back(concat("parallel.zero_quantized_gradients=",
                                      c.cfg.parallel.zero_quantized_gradients ? "true" : "false"));
              c.sets.push_back(concat("parallel.zero_quantized_gradients_group=",
                                      c.cfg.parallel.zero_quantized_gradients_group));
              c.sets.push_back(
                  concat("offload.params=\"",
                         kOffloadTargetNames[static_cast<size_t>(c.cfg.offload.params)], "\""));
              if (offload_only_params && zero != 3)
                c.sets.insert(c.sets.end(), no_offload_folder.begin(), no_offload_folder.end());
              c.sets.push_back(
                  concat("parallel.zero_quant_block=", c.cfg.parallel.zero_quant_block));
              c.sets.push_back(concat("train.micro_batch_size=", mbs));
              c.sets.push_back(concat("train.recompute=\"",
                                      kRecompute[static_cast<int>(c.cfg.train.recompute)], "\""));
              c.sets.push_back("train.recompute_layers=0");
              c.sets.push_back(concat("train.recompute_modules=",
                                      recompute_modules_text(c.cfg.train.recompute_modules)));
              c.sets.push_back(
                  concat("train.distribute_saved_activations=", distribute ? "true" : "false"));
              out.ranked.push_back(std::move(c));
              if (out.ranked.size() > 4 * keep + 64) {
                std::sort(out.ranked.begin(), out.ranked.end(), better);
                out.ranked.resize(2 * keep);
              }
            }
        }
    }
  }
  std::sort(out.ranked.begin(), out.ranked.end(), better);
  // The survivors through every rule of a real run (the ZeRO stage, recompute and micro-batch
  // size were set directly above).
  std::vector<Candidate> checked;
  for (Candidate& c : out.ranked) {
    if (checked.size() == keep) break;
    std::vector<std::string> all = overrides;
    all.insert(all.end(), c.sets.begin(), c.sets.end());
    try {
      c.cfg = parse_config(path, all);
    } catch (const ConfigError&) {
      continue;
    }
    checked.push_back(std::move(c));
  }
  out.ranked = std::move(checked);
  return out;
}

std::string layout_fragment(const Candidate& c, int world, const HardwareProfile& hw) {
  const ParallelConfig& p = c.cfg.parallel;
  std::string s = concat("# llmtrain plan --search at world ", world, " on ", hw.name,
                         ": predicted ", c.cost.step_s, " s per step, MFU ", c.cost.mfu, "\n# ",
                         layout_text(c.cfg, world), "\n[parallel]\n");
  s += concat("tp = ", p.tp, "\ncp = ", p.cp, "\n");
  if (p.cp > 1) s += concat("cp_impl = \"", std::string(cp_impl_name(p.cp_impl)), "\"\n");
  if (p.cp_impl == CpImpl::hybrid) s += concat("cp_ulysses = ", p.cp_ulysses, "\n");
  if (p.cp > 1 && c.cfg.model.mla_attention())
    s += concat("cp_latent = ", p.cp_latent ? "true" : "false", "\n");
  s += concat(
      "pp = ", p.pp, "\ndp = ", mesh_shape(p, world).size(Axis::dp), "\npp_schedule = \"",
      schedule_name(p.pp_schedule), "\"\nvirtual_stages = ", p.virtual_stages,
      p.pp_max_deferred >= 0 ? concat("\npp_max_deferred = ", p.pp_max_deferred) : std::string(),
      "\npp_layers = ", toml_text(p.pp_layers), "\nep = ", p.ep, "\nzero_stage = ", p.zero_stage,
      "\nzero_shard_group = ", p.zero_shard_group,
      "\nzero_hierarchical_partition = ", p.zero_hierarchical_partition,
      // (ZeRO++'s keys as the candidate has them: a user's qwZ/qgZ stay on stage 3 only.)
      "\nzero_quantized_weights = ", p.zero_quantized_weights ? "true" : "false",
      "\nzero_quantized_gradients = ", p.zero_quantized_gradients ? "true" : "false",
      "\nzero_quantized_gradients_group = ", p.zero_quantized_gradients_group,
      "\nzero_quant_block = ", p.zero_quant_block,
      "\nsequence_parallel = ", p.sequence_parallel ? "true" : "false", "\n\n[train]\n");
  s += concat("micro_batch_size = ", c.cfg.train.micro_batch_size, "\nrecompute = \"",
              kRecompute[static_cast<int>(c.cfg.train.recompute)], "\"\nrecompute_layers = 0\n");
  if (c.cfg.train.recompute == Recompute::selective)
    s +=
        concat("recompute_modules = ", recompute_modules_text(c.cfg.train.recompute_modules), "\n");
  if (c.cfg.train.distribute_saved_activations) s += "distribute_saved_activations = true\n";
  // [offload] as the candidate has it: ZeRO-3's shards' offload stays on stage 3 only, and a
  // candidate left without "nvme" has no folder (a rule refuses one unused).
  const OffloadConfig& o = c.cfg.offload;
  s += concat("\n[offload]\noptimizer = ",
              toml_string(kOffloadTargetNames[static_cast<size_t>(o.optimizer)]),
              "\nparams = ", toml_string(kOffloadTargetNames[static_cast<size_t>(o.params)]),
              "\nnvme_dir = ", toml_text(o.nvme_dir), "\nbuffer_mb = ", toml_text(o.buffer_mb),
              "\n");
  return s;
}

}  // namespace llmt
