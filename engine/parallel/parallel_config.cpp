// [parallel]'s rules, reported through the config's Rules (the world-size rules are
// validate_layout's, train; the model's tp divisibility is check_model_layout's).
#include "engine/parallel/parallel_config.h"

#include "config/rules.h"

namespace llmt {

using detail::concat;

void check_parallel_config(const ParallelConfig& p, int64_t n_layers, Rules& r) {
  r.at_least<int64_t>("parallel.tp", p.tp, 1);
  r.at_least<int64_t>("parallel.cp", p.cp, 1);
  r.at_least<int64_t>("parallel.pp", p.pp, 1);
  if (p.cp_impl == CpImpl::hybrid) {
    r.require(p.cp_ulysses > 1 && p.cp_ulysses < p.cp && p.cp % p.cp_ulysses == 0,
              {"parallel.cp_ulysses", "parallel.cp", "parallel.cp_impl"},
              concat("parallel.cp_impl=\"hybrid\" needs parallel.cp_ulysses = u with 1 < u < "
                     "parallel.cp=",
                     p.cp, " and u dividing cp (all-to-all over u ranks, ring over cp/u), found ",
                     p.cp_ulysses));
  } else {
    r.require(p.cp_ulysses == 0, {"parallel.cp_ulysses", "parallel.cp_impl"},
              concat("parallel.cp_ulysses=", p.cp_ulysses, " applies to parallel.cp_impl=",
                     "\"hybrid\" only; parallel.cp_impl is \"", cp_impl_name(p.cp_impl), "\""));
  }
  r.require(p.dp == -1 || p.dp >= 1, {"parallel.dp"},
            concat("parallel.dp=", p.dp, " must be >= 1, or -1 for the rest of the world size"));
  if (p.pp > 1) {
    // What the pipeline executor (engine/pipeline/executor.h) does not run yet.
    // (DualPipeV deferring nothing splits no backward.)
    const bool whole = p.pp_schedule == PipeSchedule::dualpipe_v && p.pp_max_deferred == 0;
    r.require(!splits_backward(p.pp_schedule) || whole || p.zero_stage <= 2,
              {"parallel.pp_schedule", "parallel.zero_stage"},
              concat("parallel.pp_schedule=\"", schedule_name(p.pp_schedule),
                     "\" with parallel.zero_stage=", p.zero_stage,
                     ": ZeRO-3 gathers a layer's weights only around its hooks, which the split "
                     "backward runs with the weight part; use zero_stage <= 2 or \"1f1b\"",
                     p.pp_schedule == PipeSchedule::dualpipe_v
                         ? " (or parallel.pp_max_deferred = 0: no backward split)"
                         : ""));
  }
  // One stage runs no pipeline: a schedule set there would be accepted and do nothing.
  r.require(p.pp != 1 || p.pp_schedule == PipeSchedule::one_f_one_b,
            {"parallel.pp_schedule", "parallel.pp"},
            concat("parallel.pp_schedule=\"", schedule_name(p.pp_schedule),
                   "\" orders the micro-batches of pipeline stages, but parallel.pp=1 runs no "
                   "pipeline: remove parallel.pp_schedule, or set parallel.pp > 1"));
  r.at_least<int64_t>("parallel.virtual_stages", p.virtual_stages, 1);
  r.at_least<int64_t>("parallel.pp_max_deferred", p.pp_max_deferred, -1);
  r.require(p.pp_max_deferred == -1 || splits_backward(p.pp_schedule),
            {"parallel.pp_max_deferred", "parallel.pp_schedule"},
            concat("parallel.pp_max_deferred=", p.pp_max_deferred,
                   " bounds the weight halves a zero-bubble schedule defers: it needs "
                   "parallel.pp_schedule=\"zb-h1\", \"zb-v\" or \"dualpipev\", found \"",
                   schedule_name(p.pp_schedule), "\""));
  if (p.virtual_stages >= 1) {
    const bool interleaved = p.pp_schedule == PipeSchedule::interleaved;
    const bool v = v_shaped(p.pp_schedule);
    r.require(
        interleaved || v || p.virtual_stages == 1,
        {"parallel.virtual_stages", "parallel.pp_schedule"},
        concat("parallel.virtual_stages=", p.virtual_stages,
               " needs parallel.pp_schedule=\"interleaved\" (or 2 with \"zb-v\" or \"dualpipev\"); "
               "the other schedules run one model chunk per rank"));
    r.require(!interleaved || p.virtual_stages >= 2,
              {"parallel.virtual_stages", "parallel.pp_schedule"},
              concat("parallel.pp_schedule=\"interleaved\" needs parallel.virtual_stages >= 2, "
                     "found ",
                     p.virtual_stages));
    r.require(!v || p.virtual_stages == 2, {"parallel.virtual_stages", "parallel.pp_schedule"},
              concat("parallel.pp_schedule=\"", schedule_name(p.pp_schedule),
                     "\" runs two model chunks per rank in a V: set parallel.virtual_stages=2, "
                     "found ",
                     p.virtual_stages));
  }
  if (p.pp >= 1 && p.virtual_stages >= 1 && n_layers >= 1) {
    const int64_t stages = p.pp * p.virtual_stages;
    if (p.pp_layers.empty()) {
      r.require(n_layers % stages == 0, {"model.n_layers", "parallel.pp"},
                concat("model.n_layers=", n_layers, " does not split evenly into pp(", p.pp,
                       ")*virtual_stages(", p.virtual_stages, ")=", stages,
                       " stages; set parallel.pp_layers to list the layers of each stage"));
    } else {
      int64_t sum = 0;
      bool negative = false;
      for (int64_t n : p.pp_layers) {
        sum += n;
        negative = negative || n < 0;
      }
      r.require(static_cast<int64_t>(p.pp_layers.size()) == stages && sum == n_layers && !negative,
                {"parallel.pp_layers"},
                concat("parallel.pp_layers=", toml_text(p.pp_layers), " must have pp(", p.pp,
                       ")*virtual_stages(", p.virtual_stages, ")=", stages,
                       " non-negative entries summing to model.n_layers=", n_layers));
    }
  }
  r.at_least<int64_t>("parallel.ep", p.ep, 1);
  r.require(p.zero_stage >= 0 && p.zero_stage <= 3, {"parallel.zero_stage"},
            concat("parallel.zero_stage=", p.zero_stage, " must be 0 (DDP), 1, 2 or 3"));
  r.require(p.zero_shard_group >= 0, {"parallel.zero_shard_group"},
            concat("parallel.zero_shard_group=", p.zero_shard_group,
                   " must be >= 1 (the dp ranks of a ZeRO shard group), or 0 for all of them"));
  r.require(p.zero_shard_group <= 0 || p.zero_stage >= 1,
            {"parallel.zero_shard_group", "parallel.zero_stage"},
            concat("parallel.zero_shard_group=", p.zero_shard_group,
                   " shards ZeRO's state within groups of dp ranks, but parallel.zero_stage=0 "
                   "(DDP) shards nothing; set zero_stage to 1, 2 or 3"));
  r.require(!p.zero_quantized_weights || p.zero_stage == 3,
            {"parallel.zero_quantized_weights", "parallel.zero_stage"},
            concat("parallel.zero_quantized_weights=true quantises ZeRO-3's all-gathers of the "
                   "weights, but parallel.zero_stage=",
                   p.zero_stage, "; set zero_stage to 3"));
  r.require(!p.zero_quantized_gradients || p.zero_stage == 3,
            {"parallel.zero_quantized_gradients", "parallel.zero_stage"},
            concat("parallel.zero_quantized_gradients=true quantises ZeRO-3's reduce-scatters of "
                   "the gradients, but parallel.zero_stage=",
                   p.zero_stage, "; set zero_stage to 3"));
  r.require(p.zero_quantized_gradients_group >= 0, {"parallel.zero_quantized_gradients_group"},
            concat("parallel.zero_quantized_gradients_group=", p.zero_quantized_gradients_group,
                   " must be >= 1 (the dp ranks of qgZ's first hop), or 0 for hpZ's groups"));
  r.require(p.zero_quantized_gradients_group <= 0 || p.zero_quantized_gradients,
            {"parallel.zero_quantized_gradients_group", "parallel.zero_quantized_gradients"},
            concat("parallel.zero_quantized_gradients_group=", p.zero_quantized_gradients_group,
                   " sets the first hop of qgZ's all-to-alls, but "
                   "parallel.zero_quantized_gradients=false; set it to true, or leave the group "
                   "at 0"));
  // Groups of n dp ranks (set by `key`) inside hybrid sharding's shard groups.
  auto inside_shard_groups = [&](const char* key, int64_t n, const char* groups) {
    r.require(n <= 0 || p.zero_shard_group <= 0 || p.zero_shard_group % n == 0,
              {concat("parallel.", key), "parallel.zero_shard_group"},
              concat("parallel.", key, "=", n, " does not divide parallel.zero_shard_group=",
                     p.zero_shard_group, ": the ", groups, " must lie inside the shard groups"));
  };
  inside_shard_groups("zero_quantized_gradients_group", p.zero_quantized_gradients_group,
                      "first hop's groups");
  r.require(p.zero_quant_block >= 1, {"parallel.zero_quant_block"},
            concat("parallel.zero_quant_block=", p.zero_quant_block, " must be >= 1"));
  r.require(p.zero_quant_block == 256 || p.zero_quant_block < 1 || p.zero_quantized_weights ||
                p.zero_quantized_gradients,
            {"parallel.zero_quant_block", "parallel.zero_quantized_weights",
             "parallel.zero_quantized_gradients"},
            concat("parallel.zero_quant_block=", p.zero_quant_block,
                   " sets the blocks of parallel.zero_quantized_weights and "
                   "zero_quantized_gradients, which are false: set one to true, or leave "
                   "zero_quant_block at 256"));
  r.require(p.zero_hierarchical_partition >= 0, {"parallel.zero_hierarchical_partition"},
            concat("parallel.zero_hierarchical_partition=", p.zero_hierarchical_partition,
                   " must be >= 1 (the dp ranks of a secondary group), or 0 for none"));
  r.require(p.zero_hierarchical_partition <= 0 || p.zero_stage == 3,
            {"parallel.zero_hierarchical_partition", "parallel.zero_stage"},
            concat("parallel.zero_hierarchical_partition=", p.zero_hierarchical_partition,
                   " keeps a secondary copy of ZeRO-3's gathered weights, but "
                   "parallel.zero_stage=",
                   p.zero_stage, "; set zero_stage to 3"));
  inside_shard_groups("zero_hierarchical_partition", p.zero_hierarchical_partition,
                      "secondary groups");
  r.positive("parallel.bucket_mb", p.bucket_mb);
}

}  // namespace llmt
