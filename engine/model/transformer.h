// The decoder-only transformer: the parameters and gradients (each one flat f32 buffer carved into
// per-parameter views in ModelSpec order), the blocks (blocks.h: embedding, layers assembled from
// norms, attention and MLP, head) that run on them, and the activations of each micro-batch, one
// buffer laid out from the blocks' declared saved tensors.
//
// Pipeline stages (ModelSpec::shard_pp): the model holds only its chunks' layers (in global
// order), plus the embeddings on stage 0 and the final norm + head on the last stage; the
// pipeline API below runs one chunk of one micro-batch at a time, each micro-batch's activations
// in their own buffer.
//
// Dims: B micro-batch, T seq_len, C d_model, V vocab, L layers, N = B*T. Tensor parallel (tp
// ranks, docs/parallelism.md): a rank holds H/tp query heads, KV/tp kv heads, F/tp of the ffn
// and V/tp of the vocabulary. Rows of the residual stream: R = N, or N/tp with sequence
// parallelism (this rank's block of tokens).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "engine/model/blocks.h"
#include "engine/model/model_spec.h"
#include "engine/parallel/tensor_parallel.h"

namespace llmt {

// Callbacks around the model's blocks, for parallel strategies that act per block (DDP starts a
// bucket's all-reduce when its gradients are complete; ZeRO-3 gathers a block's parameters just
// before use). Blocks: 0 = embeddings, 1..L = layers, L+1 = final norm + head (global numbers
// also on a pipeline stage, which visits only its own). Forward visits them in that order,
// backward in reverse. A pipeline stage other than the first that holds block-0 or block-L+1
// parameters (the head, a tied copy of wte) sees before/after_backward(0) at the end of its chunk
// 0's backward: that completes the root's gradients, as block 0 does on one rank.
class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  virtual void before_forward(int block) { (void)block; }
  virtual void before_backward(int block) { (void)block; }
  // The block's weight gradients for this micro-batch are complete (wte's only after block 0).
  virtual void after_backward(int block) { (void)block; }
};

// Which full-size buffers the Transformer allocates. ZeRO-2 owns the gradients and ZeRO-3 also
// the parameters (sharded); for what the model does not own it binds each block's views to its
// own staging buffers (bind_block) before the block runs. ZeRO-1/2 in 16-bit precision own the
// fp32 master weights too (their rows): the model's weights are then the compute copy itself,
// rounded in place by sync_compute_weights.
struct ModelStorage {
  bool params = true;  // master (and compute) weights
  bool grads = true;
  bool master = true;  // 16-bit: params() are fp32 masters beside a compute copy (false: params()
                       // are the compute weights, stored in the compute type)
  DType grad_dtype = DType::f32;  // the weight gradients' type: f32 or the compute type
};

// [train] recompute and recompute_layers: the mode of the first `layers` layers of each model
// chunk (0: all of them); the others recompute nothing.
struct RecomputeOptions {
  Recompute mode = Recompute::none;
  int64_t layers = 0;
  RecomputeModules modules;  // train.recompute_modules: what selective recompute reruns
  // train.distribute_saved_activations (full recompute, tp > 1 without SP): a fully recomputed
  // layer saves 1/tp of its input (Layer's `distributed`), and a pipeline chunk without the head
  // keeps and sends 1/tp of its output, which the next stage receives as its first layer's part.
  bool distribute = false;
};

class Transformer {
 public:
  // compute: f32, or bf16/f16 to emulate 16-bit storage (weights and activations rounded to
  // that type at op boundaries; gradients and master weights stay f32).
  // tp: the tensor-parallel group (none: the whole model on this rank); `spec` is sharded for
  // this tp rank (parallelize, or ModelSpec::shard_tp).
  // cp: the context-parallel group (none: whole sequences); with it the model runs this rank's
  // T = seq_len/cp positions of each sequence (context_parallel.h's zigzag split).
  // ep: expert parallelism's group (null: every expert here); `spec` then holds this rank's
  // experts (ModelSpec::shard_ep).
  // decode_len > 0: a decoder (llmtrain generate) of sequences up to decode_len positions, one
  // position at a time (B = T = 1, micro_batch ignored) through a KV cache (KvCacheAttention);
  // forward only (decode()), without cp or sequence parallelism.
  // fp8: train.fp8, the FP8 inputs of the layers' linears (parallel_layers.h).
  Transformer(const ModelSpec& spec, Allocator& alloc, int64_t micro_batch, DType compute,
              ModelStorage storage = {}, TensorParallel tp = {}, RecomputeOptions recompute = {},
              ContextParallel cp = {}, Communicator* ep = nullptr, int64_t decode_len = 0,
              Fp8Recipe fp8 = {});
  Transformer(const Transformer&) = delete;  // the blocks hold references into the model
  Transformer& operator=(const Transformer&) = delete;

  const ModelSpec& spec() const { return spec_; }
  DType compute_dtype() const { return compute_; }
  const ModelStorage& storage() const { return storage_; }
  // Master parameters (or, with ModelStorage::master false, the compute weights) and their
  // gradients, one view per ModelSpec::params entry.
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<Tensor>& grads() const { return views_.g; }
  Tensor flat_params() const { return flat_params_; }  // (P)
  Tensor flat_grads() const { return flat_grads_; }    // (P)

  // Initialise every parameter from (seed, its global name, element index).
  void init(uint64_t seed);
  // Refresh the compute copy of the weights after the master weights changed (no-op for f32
  // and with ModelStorage::master false).
  void sync_compute_weights();
  void zero_grads();

  // Hooks called around each block (nullptr: none). Not owned.
  void set_hooks(ModelHooks* hooks) { hooks_ = hooks; }
  int num_blocks() const { return static_cast<int>(spec_.cfg.n_layers) + 2; }
  // The parameters (indices into params()) that belong to a block: [first, last).
  std::pair<size_t, size_t> block_params(int block) const;
  // Points the views of block `block`'s parameters at `weights` (the compute weights the forward
  // and backward read) and/or `grads`, each a flat f32 buffer holding that block's parameters
  // back to back in spec order; an undefined Tensor leaves that side unchanged. Only for what
  // ModelStorage says the model does not own.
  void bind_block(int block, Tensor weights, Tensor grads);

  // The global positions of the T positions of a sequence this rank holds.
  const SequenceShard& sequence_shard() const { return seq_; }
  // Communicators the model made itself (context parallelism's hybrid groups), for metrics.
  std::vector<Communicator*> own_communicators() const { return attention_->own_communicators(); }
  // Forward and backward of one micro-batch. tokens, targets: (B,T) i32 on the model's device;
  // with multi-token prediction (D = model.mtp_depth > 0) targets is (1 + 2D, B, T): the targets,
  // then for each depth k the inputs k places ahead and the labels k + 1 places ahead (-1 past the
  // window; mtp_targets), forward-only calls reading the first plane only.
  // Gradients are accumulated into grads() scaled by `dloss` (d total loss / d mean micro-batch
  // loss, e.g. loss_scale / accumulation_steps); the MTP modules' mean loss joins it with
  // model.mtp_loss_weight (mtp_loss_sum). Returns the micro-batch's mean loss (without MTP).
  float forward_backward(Tensor tokens, Tensor targets, float dloss, const StepContext& ctx);
  // Forward only: the mean loss (no gradients are touched).
  float forward_loss(Tensor tokens, Tensor targets, const StepContext& ctx);
  // Forward only: the logits (N, V/tp) of tokens (B,T), this rank's vocabulary shard, valid
  // until the next forward (no loss, no gradients).
  Tensor forward_logits(Tensor tokens, const StepContext& ctx);
  // A decoder's step (decode_len > 0): token (1,1) i32 at position pos, after positions
  // 0..pos-1 of the same sequence (decoding from pos 0 again starts a new one). Returns the
  // logits (1, V/tp) of the next token, this rank's vocabulary shard, valid until the next call.
  Tensor decode(Tensor token, int64_t pos);
  int64_t decode_len() const { return decoder_ ? decoder_->max_len() : 0; }

  // ---- Pipeline stages: one model chunk (ModelSpec::chunks) of one micro-batch at a time ----
  // A micro-batch slot `mb`'s activations of chunk `chunk` are allocated by chunk_input (or
  // forward_chunk) and freed by free_chunk, so a schedule holds exactly its in-flight ones.
  int num_chunks() const { return static_cast<int>(spec_.chunks.size()); }
  bool chunk_has_embedding(int chunk) const { return chunk == 0 && spec_.has_embedding; }
  bool chunk_has_head(int chunk) const { return chunk + 1 == num_chunks() && spec_.has_head; }
  // (R,C): the shape of an activation (and its gradient) passed between stages.
  Shape activation_shape() const { return Shape({tp_.R, spec_.cfg.d_model}); }
  // (R,C): where the chunk's input activation goes (recv into it before forward_chunk).
  Tensor chunk_input(int chunk, int mb);
  // Forward of the chunk: tokens (B,T) are read on the embedding chunk, targets (B,T) on the head
  // chunk, which also computes the loss and d(dloss * loss)/d logits; returns the micro-batch's
  // mean loss there, 0 elsewhere.
  float forward_chunk(int chunk, int mb, Tensor tokens, Tensor targets, float dloss,
                      const StepContext& ctx);
  // (R,C): the chunk's output activation after forward_chunk (what the next stage receives).
  Tensor chunk_output(int chunk, int mb);
  // Backward of the chunk; dout (R,C): the gradient of its output (undefined on the head chunk).
  // Accumulates weight gradients and returns the gradient of its input (R,C), a scratch view
  // valid until the next backward (undefined on the embedding chunk).
  Tensor backward_chunk(int chunk, int mb, Tensor dout, Tensor tokens, const StepContext& ctx);
  // The backward split for zero-bubble schedules: backward_input_chunk returns the input gradient
  // as backward_chunk does but accumulates no weight gradient: it stashes what the weight
  // gradients need (each linear's output gradient, the norms' partial gradients) with the
  // micro-batch's activations; backward_weight_chunk then computes them. The hooks' backward
  // calls come with the weight part only. Together they add the same gradients as backward_chunk.
  Tensor backward_input_chunk(int chunk, int mb, Tensor dout, const StepContext& ctx);
  // ctx: the micro-batch's, as given to backward_input_chunk (a fully recomputed layer replays
  // its forward here too when another micro-batch used the replay set in between).
  void backward_weight_chunk(int chunk, int mb, Tensor tokens, const StepContext& ctx);
  // Frees the activations (and the stash) of (chunk, mb).
  void free_chunk(int chunk, int mb);
  // Bytes of one micro-batch's activations of chunk `chunk` (what chunk_input allocates), and of
  // the stash backward_input_chunk adds until backward_weight_chunk.
  size_t chunk_activation_bytes(int chunk) const;
  size_t chunk_stash_bytes(int chunk) const;
  // What local layer `local` saves per micro-batch (its recompute mode's), and the scratch the
  // model holds once for recompute (the attention core under selective, one layer's full set
  // and output under full): docs/model.md derives both.
  std::vector<TensorSpec> layer_saved(int64_t local) const;
  size_t recompute_scratch_bytes() const { return recompute_scratch_bytes_; }
  // The scratch every micro-batch shares (the constructor lays it out once), bytes.
  size_t scratch_bytes() const { return scratch_buf_.bytes(); }
  // What the mixture-of-experts layers measured since the caller last reset it (MoeStats).
  MoeStats& moe_stats() { return moe_stats_; }
  // Multi-token prediction (model.mtp_depth = D > 0): the sum over the training micro-batches
  // since the caller last reset it of the modules' mean loss (each depth's mean over the
  // micro-batch's positions, averaged over the D depths); 0 on a rank without the head.
  double& mtp_loss_sum() { return mtp_loss_sum_; }

 private:
  // One micro-batch's activations of one chunk (the whole model without pp), views of `buf` laid
  // out from the blocks' saved(); under a zero-bubble schedule also the stash from
  // backward_input to backward_weight, in `stash_buf` from the blocks' stash().
  struct Acts {
    Buffer buf;
    std::vector<std::vector<Tensor>> layers;  // each layer's saved set, the chunk's layers
    Tensor out;                               // (R,C) residual stream after the last layer
    std::vector<Tensor> head;                 // head chunk: Head::saved()
    std::vector<std::vector<Tensor>> mtp;     // head chunk: each MtpModule::saved()
    Buffer stash_buf;
    std::vector<std::vector<Tensor>> layer_stash, mtp_stash;
    std::vector<Tensor> head_stash, emb_stash;
  };
  // Lays out `a` for chunk `chunk` (views only when the layout has a region).
  void carve_acts(TensorLayout& lay, Acts& a, int chunk) const;
  void carve_stash(TensorLayout& lay, Acts& a, int chunk) const;
  Acts& acts_of(int chunk, int mb);
  Tensor input_of(Acts& a) { return a.layers.empty() ? a.out : a.layers[0][0]; }
  // Whether chunk `chunk`'s output is kept (and sent) as this rank's 1/tp part.
  bool out_distributed(int chunk) const { return distribute_ && !chunk_has_head(chunk); }
  float forward(int chunk, Acts& a, Tensor tokens, Tensor targets, float dloss,
                const StepContext& ctx);
  // The embedding (on its chunk) and the chunk's layers.
  void forward_layers(int chunk, Acts& a, Tensor tokens, const StepContext& ctx);
  bool is_bt(const Tensor& t) const;  // (B,T)
  // The backward of (chunk, a), leaving the gradient of the chunk's input in scratch d_res. With
  // `then_weight` each block's weight part follows its input part, with the hooks around them;
  // otherwise (zero-bubble) only the input parts run, stashing into a's stash, and
  // backward_weight_chunk runs the rest.
  void backward(int chunk, Acts& a, Tensor tokens, const StepContext& ctx, bool then_weight);
  // before/after_backward(0) on a stage other than the first that holds root parameters.
  void root_hooks();
  // The head chunk's multi-token prediction modules, forward (after the head's) and backward
  // (before it: leaves the gradient of a.out they add in scratch.mtp.carry).
  void mtp_forward(Acts& a, Tensor targets, float dloss, const StepContext& ctx);
  void mtp_backward(Acts& a, const StepContext& ctx, bool then_weight);
  // Plane j (B,T) of targets (1 + 2D, B, T); targets itself when it is (B,T) and j = 0.
  Tensor target_plane(Tensor targets, int64_t j) const;
  int64_t chunk_layers(int chunk) const { return chunk_first_[chunk + 1] - chunk_first_[chunk]; }

  ModelSpec spec_;
  Allocator& alloc_;
  ModelHooks* hooks_ = nullptr;
  std::vector<size_t> block_first_;   // block b owns params [block_first_[b], block_first_[b+1])
  std::vector<int64_t> layers_;       // global index of each local layer
  std::vector<int64_t> chunk_first_;  // chunk k holds local layers [chunk_first_[k], [k+1])
  int64_t B_, T_;                     // T_: the positions this rank holds (seq_len/cp)
  DType compute_;
  ModelStorage storage_;

  Buffer params_buf_, grads_buf_, compute_buf_, scratch_buf_;
  Tensor flat_params_, flat_grads_;
  std::vector<Tensor> params_;  // master weights
  ParamViews views_;            // compute weights and gradients, what the blocks read
  TpLayers tp_;
  BlockScratch scratch_;
  SequenceShard seq_;
  std::unique_ptr<AttentionCore> attention_;  // LocalAttention, or ContextParallelAttention
  KvCacheAttention* decoder_ = nullptr;       // attention_ when decoding
  MoeStats moe_stats_;
  BlockEnv env_;
  // Full recompute: one layer's full saved set, of a dense layer [0] and of an MoE layer [1].
  std::array<std::vector<Tensor>, 2> replay_sets_;
  size_t recompute_scratch_bytes_ = 0;
  bool distribute_ = false;  // RecomputeOptions::distribute
  std::optional<Embedding> embedding_;
  std::vector<std::unique_ptr<Layer>> layer_blocks_;  // per local layer
  std::optional<Head> head_;
  std::vector<std::unique_ptr<MtpModule>> mtp_;  // with the head: depths 1..D (none decoding)
  std::vector<std::vector<Tensor>> mtp_stash_;   // back-to-back: each module's stash
  double mtp_loss_sum_ = 0;
  // Back-to-back backward: the stash entries (views, or the non-view ones in scratch.stash).
  std::array<std::vector<Tensor>, 2> layer_stash_;  // of a dense layer [0], an MoE layer [1]
  std::vector<Tensor> head_stash_, emb_stash_;
  Acts whole_;  // without pp: the one micro-batch's activations, allocated at construction
  std::vector<std::vector<Acts>> pipe_acts_;  // [chunk][mb] under pp, allocated per micro-batch
};

// Initialises x = rows [row_begin, row_begin + x.shape[0]) of parameter i as this rank holds it
// (spec.params[i].shape; or, x 2-D for a higher-dimensional expert stack, of its
// ModelSpec::cut_rows), with exactly the values of those elements in the single-rank tensor:
// each piece from the counter-based generator at its global index, whatever the tp slices
// (placement.h) and whatever further row split (ZeRO's dp shards) cut it.
void init_param_rows(const ModelSpec& spec, size_t i, Tensor x, int64_t row_begin, uint64_t seed);

}  // namespace llmt
