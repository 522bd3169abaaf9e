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
  // The layout on every axis (indexed by Axis). tp, Megatron 1D tensor parallelism:
  // column-parallel qkv/fc1 Shard(0) by head groups / [gate|up], row-parallel proj/fc2 Shard(1)
  // (their biases replicated, added after the all-reduce), vocab-parallel wte/lm_head Shard(0),
  // norms, wpe, routers and expert stacks replicated. pp: Owned(pp rank) once shard_pp placed it
  // (Replicate before; the last rank's tied copy of wte is Owned(pp-1) beside rank 0's, flagged
  // tied_copy). ep: an expert stack [E, ...] Shard(0), each ep rank a run of whole experts; the
  // rest replicated. cp and dp: Replicate (ZeRO's dp shards are the optimizer's and gradients'
  // layout, zero.h; the parameter a layer computes with is whole).
  std::array<Placement, kNumPlacementAxes> placement{};
  const Placement& on(Axis a) const { return placement[static_cast<int>(a)]; }
  // Pipeline parallelism with tied embeddings or multi-token prediction
  // (ModelConfig::embedding_on_last_stage): the last stage's copy of wte.weight.
  // Initialised like stage 0's; its gradient is summed with stage 0's before the update, and it
  // counts once (on stage 0) in norms.
  bool tied_copy = false;
  // The global layer ("layers.<layer>."); -1 for wte, wpe, norm_f, lm_head and the multi-token
  // prediction modules (named "layers.<L + k - 1>.", held with the head: block L+1, ZeRO's root
  // unit, the last pipeline stage).
  int64_t layer = -1;
  ParamKind kind = ParamKind::mlp;
  bool mtp = false;  // a multi-token prediction module's (ModelConfig::mtp_depth)
  // Replicated over tp, but under tp > 1 each tp rank's gradient is a part of a sum over tp (a
  // router and the expert stacks: each tp rank routes its own rows of the sequence), so it reduces
  // over its data-parallel group times tp (GradGroup::tp).
  bool tp_partial_grad = false;
};

struct ModelSpec {
  ModelConfig cfg;  // resolved (presets applied)
  // The attention core's heads (AttentionCore): D = d_model / n_heads and KV kv heads; latent
  // attention: D = qk_nope + qk_rope (values zero-padded to it), KV = H.
  int64_t head_dim;    // D
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
  // global stage s = c*pp + rank, or with `v_shape` the V of ZB-V (schedule.h's stage_of), whose
  // layers are `stage_layers[s]` consecutive layers (empty: n_layers / (pp*virtual_stages) each).
  // Stage 0 adds wte (+ wpe), the last stage norm_f, lm_head and the multi-token prediction
  // modules, and, on another rank than stage 0's, with tied embeddings or MTP a tied_copy of wte.
  // Example: 4 layers, pp 2, v 2: rank 0 holds layers 0 and 2 (stages 0, 2) and the embeddings,
  // rank 1 layers 1 and 3 and the head; in a V rank 0 holds layers 0 and 3, the embeddings and
  // the head (one wte), rank 1 layers 1 and 2. Throws, with the numbers, when the layers do not
  // split that way.
  ModelSpec shard_pp(int pp, int virtual_stages, const std::vector<int64_t>& stage_layers, int rank,
                     bool v_shape = false) const;
  // The transform to ep rank `rank` of `size` (expert parallelism), applied after shard_tp: every
  // parameter sharded over ep (its Placement on Axis::ep: an expert stack's Shard(0)) holds that
  // rank's part, num_experts/size consecutive experts; other parameters stay as they are. Throws
  // when the experts do not divide.
  ModelSpec shard_ep(int size, int rank) const;
  // The same rank's spec with whole expert stacks (ep = 1): what gathering the experts over the
  // ep group gives.
  ModelSpec without_ep() const;
  // Whether parameter i is an expert stack (ParamKind::expert: "layers.3.mlp.experts.fc1.weight"),
  // dim 0 the experts.
  bool is_expert(size_t i) const;
  // The group parameter i's gradient is summed over and ZeRO cuts its rows over, from its
  // placements on the axes this spec is sharded for: narrowed to the ep coordinate when ep_size >
  // 1 shards it, widened by tp when tp_size > 1 and its gradient is partial over tp
  // (ParamSpec::tp_partial_grad). Mesh::grad_group gives the communicator.
  GradGroup grad_group(size_t i) const;
  // Which gradient groups (by GradGroup::index()) some parameter of the whole model has at this
  // spec's tp and ep sizes: the same on every rank, whatever its pipeline stage, so every rank
  // makes the same groups (a collective) in the same order.
  std::array<bool, kNumGradGroups> grad_groups_of_model() const;
  // Whether parameter i is a hidden weight matrix: a 2-D attention or MLP weight, or an expert
  // stack (each expert's matrix). Muon updates these (engine/optim/muon.h); biases, norms,
  // embeddings, the head and routers are not.
  bool is_hidden_matrix(size_t i) const;
  // The size of parameter i's grad_group and this rank's place in it, given this rank's place
  // `rank` in its dp x cp group of `size` ranks (ranks in mesh order): what ZeRO and the
  // checkpoint write rule cut its rows over. Narrowed to the ep coordinate: size/ep ranks, place
  // rank/ep (the group's ranks with this rank's place mod ep); widened by tp: that times tp at
  // place tp_rank + tp*place (the mesh order of the tp x dp x cp group).
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
  // The multi-token prediction modules' layers this spec holds: L .. L + mtp_depth - 1 with the
  // head, none elsewhere.
  std::vector<int64_t> mtp_layers() const;
  // The slices of parameter i's global tensor this rank holds, in local order.
  std::vector<ShardSlice> local_slices(size_t i) const;
  int64_t num_params() const;        // global
  int64_t num_local_params() const;  // this rank's
  // Global, of the multi-token prediction modules (in num_params; their embedding and head are
  // the model's).
  int64_t num_mtp_params() const;
  // Global, counting of each MoE layer's experts only the top_k a token runs through, without the
  // multi-token prediction modules (as the papers count them).
  int64_t num_active_params() const;
  // Index of a parameter by name; throws if absent.
  size_t index_of(const std::string& name) const;
  // The weights of parameter i a token multiplies with (its matmuls' weights, global): a 2-D
  // attention, MLP, router or head weight whole, an expert stack's top_k of E experts, the token
  // embedding only when tied (the head's matmul; untied it is a lookup); no norm, bias, learned
  // position or balancing bias (no matmul).
  double matmul_weights(size_t i) const;
  // Training FLOPs per token, matmuls only: 6*N + 6*L*A*T (docs/references.md), N the sum of
  // matmul_weights over the model, the second term attention's scores and weighted sum; with
  // multi-token prediction each of the D modules adds its weights (in N), its attention (L + D
  // layers) and its head, 6*V*C.
  double flops_per_token() const;
  // A of that term: the mean of the query/key and value widths over all heads, H*(Dqk + Dv)/2;
  // C for multi-head attention (H*D), H*(qk_nope + qk_rope + v_head_dim)/2 for latent attention.
  double attention_width() const;
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
