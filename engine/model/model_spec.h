// ModelSpec: the model's parameters as global names and global shapes, derived from [model]
// before anything is allocated. Parallel transforms change what a rank holds (ParamSpec::shape,
// from each parameter's Placement on each mesh axis), never the names or global shapes;
// checkpoints, init and tests speak these names (docs/model.md, docs/parallelism.md).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "engine/model/model_config.h"
#include "engine/parallel/axis.h"
#include "engine/parallel/placement.h"

namespace llmt {

enum class InitKind : uint8_t { normal, ones, zeros };

// What a parameter is, so that no code parses its name: the token embedding (wte, also the tied
// head), learned positions (wpe), a norm's weight or bias, attention (qkv, proj), a dense MLP's
// (fc1, fc2, and the shared experts'), an MoE router's weight, its aux-loss-free balancing bias
// (moved by the trainer, never by the optimizer), an expert stack [E, ...], and the untied head.
enum class ParamKind : uint8_t {
  embedding,
  position,
  norm,
  attention,
  mlp,
  router,
  router_bias,
  expert,
  head
};

struct ParamSpec {
  std::string name;  // global name, e.g. "layers.3.mlp.fc1.weight"
  Shape shape;       // what this rank holds: global_shape until a parallel transform shards it
  Shape global_shape;
  InitKind init = InitKind::normal;
  float std = 0.0f;    // for InitKind::normal
  bool decay = false;  // AdamW weight decay applies (2-D weights and embeddings)
  // The layout on every mesh axis (indexed by Axis). tp, Megatron 1D tensor parallelism:
  // column-parallel qkv/fc1 Shard(0) by head groups / [gate|up], row-parallel proj/fc2 Shard(1)
  // (their biases replicated, added after the all-reduce), vocab-parallel wte/lm_head Shard(0),
  // norms and wpe replicated. pp: Owned(pp rank) once shard_pp placed it (Replicate before;
  // the last rank's tied copy of wte is Owned(pp-1) beside rank 0's, flagged tied_copy). cp and dp:
  // Replicate (ZeRO's dp shards are the optimizer's and gradients' layout, zero.h; the parameter a
  // layer computes with is whole).
  std::array<Placement, kNumAxes> placement{};
  const Placement& on(Axis a) const { return placement[static_cast<int>(a)]; }
  // Pipeline parallelism with tied embeddings: the last stage's copy of wte.weight (the head).
  // Initialised like stage 0's; its gradient is summed with stage 0's before the update, and it
  // counts once (on stage 0) in norms.
  bool tied_copy = false;
  int64_t layer = -1;  // the global layer ("layers.<layer>."); -1 for wte, wpe, norm_f, lm_head
  ParamKind kind = ParamKind::mlp;
};

struct ModelSpec {
  ModelConfig cfg;     // resolved (presets applied)
  int64_t head_dim;    // D = d_model / n_heads
  int64_t n_kv_heads;  // KV
  int64_t qkv_dim;     // (H + 2KV) * D
  int64_t ffn_dim;     // F
  int64_t fc1_out;     // F (gelu) or 2F (swiglu)
  // Mixture of experts ([model.moe]): an expert's fc1 rows (Fe or 2Fe), the shared experts'
  // width S*Fs and fc1 rows.
  int64_t expert_fc1_out = 0, shared_ffn = 0, shared_fc1_out = 0;
  std::vector<ParamSpec> params;
  // The tp group this spec is sharded for (shard_tp); 1, 0 = the whole model.
  int tp_size = 1, tp_rank = 0;
  // The ep group this spec is sharded for (shard_ep): each expert stack holds experts
  // [ep_rank * E/ep, (ep_rank + 1) * E/ep); 1, 0 = all of them.
  int ep_size = 1, ep_rank = 0;
  // The pipeline stage this spec holds (shard_pp): one run of consecutive global layers per model
  // chunk, [first, last) each (one run [0, L) without pp), and whether it holds the embeddings
  // (stage 0) and the final norm + head + loss (the last stage). params keeps global order and
  // names, restricted to what the stage holds.
  std::vector<std::pair<int64_t, int64_t>> chunks;
  bool has_embedding = true, has_head = true;

  static ModelSpec from_config(const ModelConfig& cfg);
  // The transform to tp rank `rank` of `size`: every ParamSpec::shape becomes the shape that rank
  // holds under its Placement (names and global shapes stay). Throws, with the numbers, when
  // heads, kv heads, d_ff or the vocabulary do not divide by size.
  ModelSpec shard_tp(int size, int rank) const;
  // The transform to pp rank `rank` of `pp` with `virtual_stages` chunks per rank: chunk c holds
  // global stage s = c*pp + rank (schedule.h), whose layers are `stage_layers[s]` consecutive
  // layers (empty: n_layers / (pp*virtual_stages) each). Stage 0 adds wte (+ wpe), the last stage
  // norm_f and lm_head, or with tied embeddings a tied_copy of wte. Example: 4 layers, pp 2, v 2:
  // rank 0 holds layers 0 and 2 (stages 0, 2) and the embeddings, rank 1 layers 1 and 3 and the
  // head. Throws, with the numbers, when the layers do not split that way.
  ModelSpec shard_pp(int pp, int virtual_stages, const std::vector<int64_t>& stage_layers,
                     int rank) const;
  // The transform to ep rank `rank` of `size` (expert parallelism): every expert stack
  // (is_expert) holds num_experts/size experts, the rank's consecutive ones; other parameters
  // stay whole. Throws when the experts do not divide.
  ModelSpec shard_ep(int size, int rank) const;
  // The same rank's spec with whole expert stacks (ep = 1): what gathering the experts over the
  // ep group gives.
  ModelSpec without_ep() const;
  // Whether parameter i is an expert stack (ParamKind::expert: "layers.3.mlp.experts.fc1.weight"),
  // dim 0 the experts.
  bool is_expert(size_t i) const;
  // Whether parameter i is a router weight or an expert stack: replicated over tp, but under
  // tensor parallelism each tp rank routes its own tokens (sequence parallelism's rows), so its
  // gradient there is this rank's part of a sum over tp.
  bool is_routed(size_t i) const;
  // Whether parameter i is a hidden weight matrix: a 2-D attention or MLP weight, or an expert
  // stack (each expert's matrix). Muon updates these (engine/optim/muon.h); biases, norms,
  // embeddings, the head and routers are not.
  bool is_hidden_matrix(size_t i) const;
  // The group parameter i's rows are cut over by ZeRO and by the checkpoint write rule: the
  // ranks holding the same rows that see different data. Given this rank's place `rank` in its
  // dp x cp group of `size` ranks (ranks in mesh order): an expert stack under ep, the
  // expert-data-parallel group (size/ep ranks, place rank/ep); a routed parameter under tp (its
  // tp ranks' gradients are parts of one sum), that group times tp at place tp_rank + tp*place
  // (the mesh order of the tp x dp x cp group); any other, the dp x cp group itself.
  struct RowGroup {
    int size = 1, rank = 0;
  };
  RowGroup row_group(size_t i, int size, int rank) const;
  // The rows parameter i is cut into over that group: dim 0 of this rank's tensor, but an
  // expert stack [E, A, B] is cut in rows of its first two dims (E·A rows of B), so that a group
  // of more ranks than experts still shares it out. Each row is contiguous in memory.
  int64_t cut_rows(size_t i) const;
  // The global layers this spec holds, in order.
  std::vector<int64_t> layers() const;
  // The slices of parameter i's global tensor this rank holds, in local order.
  std::vector<ShardSlice> local_slices(size_t i) const;
  int64_t num_params() const;        // global
  int64_t num_local_params() const;  // this rank's
  // Global, counting of each MoE layer's experts only the top_k a token runs through.
  int64_t num_active_params() const;
  // Index of a parameter by name; throws if absent.
  size_t index_of(const std::string& name) const;
  // Training FLOPs per token: 6*N + 6*L*C*T (docs/references.md), N the active parameters
  // (num_active_params) without position embeddings; the router's E*C per layer counts as one.
  double flops_per_token() const;
};

// One rule of [model] that a parallel layout breaks: the dotted keys involved and the message,
// which names them with their numbers and says why the rule exists.
struct LayoutRuleError {
  std::vector<std::string> keys;
  std::string message;
};

// What [model] must satisfy for tp (and sequence parallelism), the one place these rules are
// written: one error per violation; empty when the layout fits. shard_tp throws the first;
// config validation (train/config.cpp) reports them all with the keys' file positions.
// Values below 1 are left to the checks of their own keys.
std::vector<LayoutRuleError> tensor_parallel_errors(const ModelConfig& cfg, int64_t tp,
                                                    bool sequence_parallel);

}  // namespace llmt
