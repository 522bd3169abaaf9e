// The decoder-only transformer with explicit forward and backward (llm.c style): parameters and
// gradients are each one flat f32 buffer carved into per-parameter views in ModelSpec order;
// activations of one micro-batch are one buffer laid out per layer at construction.
//
// Pipeline stages (ModelSpec::shard_pp): the model holds only its chunks' layers (w.layers and the
// activations are indexed by local layer, in global order), plus the embeddings on stage 0 and
// the final norm + head on the last stage; the pipeline API below runs one chunk of one
// micro-batch at a time, each micro-batch's activations in their own buffer.
//
// Dims: B micro-batch, T seq_len, C d_model, V vocab, L layers, H heads, KV kv heads, D head dim,
// Q = (H+2KV)*D, F ffn hidden, F1 = F (gelu) or 2F (swiglu), N = B*T.
// Tensor parallel (tp ranks, docs/parallelism.md): a rank holds H/tp query heads, KV/tp kv heads,
// F/tp of the ffn and V/tp of the vocabulary; below, H, KV, Q, F, F1, V of activations and
// weights are those local counts. Rows of the residual stream: R = N, or N/tp with sequence
// parallelism (this rank's block of tokens); column-parallel inputs are gathered to N rows.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/model/model_spec.h"
#include "engine/parallel/tensor_parallel.h"

namespace llmt {

struct LayerWeights {
  Tensor norm_1_w, norm_1_b;  // (C), (C) layernorm only
  Tensor qkv_w, qkv_b;        // (Q, C), (Q) with bias
  Tensor proj_w, proj_b;      // (C, H*D), (C)
  Tensor norm_2_w, norm_2_b;  // (C), (C)
  Tensor fc1_w, fc1_b;        // (F1, C), (F1)
  Tensor fc2_w, fc2_b;        // (C, F), (C)
};

struct ModelWeights {
  Tensor wte;                        // (V, C)
  Tensor wpe;                        // (T, C) learned positions only
  std::vector<LayerWeights> layers;  // the layers the spec holds (ModelSpec::layers()), in order
  Tensor norm_f_w, norm_f_b;         // (C), (C)
  Tensor head;                       // (V, C): wte when tied, else lm_head.weight
};

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

// Options of one forward/backward that are not shapes.
struct StepContext {
  uint64_t seed = 0;         // dropout key
  int64_t step = 0;          // dropout key
  int64_t first_sample = 0;  // global index of the micro-batch's first sample (dropout key)
  bool dropout = true;       // false for evaluation: no dropout whatever model.dropout says
};

// Which full-size buffers the Transformer allocates. ZeRO-2 owns the gradients and ZeRO-3 also
// the parameters (sharded); for what the model does not own it binds each block's views to its
// own staging buffers (bind_block) before the block runs.
struct ModelStorage {
  bool params = true;  // master (and compute) weights
  bool grads = true;
};

class Transformer {
 public:
  // compute: f32, or bf16/f16 to emulate 16-bit storage (weights and activations rounded to
  // that type at op boundaries; gradients and master weights stay f32).
  // tp: the tensor-parallel group (none: the whole model on this rank). `spec` is the global
  // spec (sharded here for tp) or one already sharded for this tp rank.
  Transformer(const ModelSpec& spec, Allocator& alloc, int64_t micro_batch, DType compute,
              ModelStorage storage = {}, TensorParallel tp = {});

  const ModelSpec& spec() const { return spec_; }
  DType compute_dtype() const { return compute_; }
  // Master parameters and their gradients, one view per ModelSpec::params entry.
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<Tensor>& grads() const { return grads_; }
  Tensor flat_params() const { return flat_params_; }  // (P)
  Tensor flat_grads() const { return flat_grads_; }    // (P)

  // Initialise every parameter from (seed, its global name, element index).
  void init(uint64_t seed);
  // Refresh the compute copy of the weights after the master weights changed (no-op for f32).
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

  // Forward and backward of one micro-batch. tokens, targets: (B,T) i32 on the model's device.
  // Gradients are accumulated into grads() scaled by `dloss` (d total loss / d mean micro-batch
  // loss, e.g. loss_scale / accumulation_steps). Returns the micro-batch's mean loss.
  float forward_backward(Tensor tokens, Tensor targets, float dloss, const StepContext& ctx);
  // Forward only: the mean loss (no gradients are touched).
  float forward_loss(Tensor tokens, Tensor targets, const StepContext& ctx);

  // ---- Pipeline stages: one model chunk (ModelSpec::chunks) of one micro-batch at a time ----
  // A micro-batch slot `mb`'s activations of chunk `chunk` are allocated by chunk_input (or
  // forward_chunk) and freed by free_chunk, so a schedule holds exactly its in-flight ones.
  int num_chunks() const { return static_cast<int>(spec_.chunks.size()); }
  bool chunk_has_embedding(int chunk) const { return chunk == 0 && spec_.has_embedding; }
  bool chunk_has_head(int chunk) const { return chunk + 1 == num_chunks() && spec_.has_head; }
  // (R,C): the shape of an activation (and its gradient) passed between stages.
  Shape activation_shape() const { return Shape({R_, spec_.cfg.d_model}); }
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
  void backward_weight_chunk(int chunk, int mb, Tensor tokens);
  // Frees the activations (and the stash) of (chunk, mb).
  void free_chunk(int chunk, int mb);
  // Bytes of one micro-batch's activations of chunk `chunk` (what chunk_input allocates), and of
  // the stash backward_input_chunk adds until backward_weight_chunk.
  size_t chunk_activation_bytes(int chunk) const;
  size_t chunk_stash_bytes(int chunk) const;

 private:
  struct LayerActs {
    Tensor res_in;             // (R,C) residual stream entering the layer
    Tensor a, mean_1, rstd_1;  // (R,C), (R), (R) norm_1
    Tensor qkv;                // (B,T,H+2KV,D) after rope
    Tensor att, lse;           // (B,T,H,D), (B,H,T)
    Tensor res_mid;            // (R,C) after the attention residual
    Tensor m, mean_2, rstd_2;  // (R,C), (R), (R) norm_2
    Tensor u;                  // (B,T,F1) fc1 output
    Tensor g;                  // (B,T,F) activation output
  };
  // Zero-bubble stash of one layer: the output gradients of its linears and its norms' weight
  // (and bias) gradients.
  struct LayerStash {
    Tensor fc2, fc1, proj, qkv;  // (N,C), (N,F1), (N,C), (N,Q)
    Tensor norm;                 // (4,C): norm_1 w, b, norm_2 w, b
  };
  // One micro-batch's activations of one chunk (the whole model without pp).
  struct Acts {
    Buffer buf;
    std::vector<LayerActs> layers;  // the chunk's layers
    Tensor out;                     // (R,C) residual stream after the chunk's last layer
    Tensor xf, mean_f, rstd_f;      // head: (N,C) (gathered under SP), (R), (R) norm_f
    Tensor logits;                  // head: (N,V); overwritten by its gradient
    Tensor losses;                  // head: (B,T)
    Buffer stash_buf;               // zero-bubble: from backward_input to backward_weight
    std::vector<LayerStash> stash;  // per layer of the chunk
    Tensor norm_f_stash;            // head: (2,C) norm_f w, b
    Tensor d_emb;                   // embedding chunk: (R,C) gradient of the embedding output
  };
  class Layout;  // back-to-back views in one buffer (transformer.cpp)
  // Lays out `a` for chunk `chunk` (views only when lay has a buffer).
  void carve_acts(Layout& lay, Acts& a, int chunk) const;
  void carve_stash(Layout& lay, Acts& a, int chunk) const;
  Acts& acts_of(int chunk, int mb);
  Tensor input_of(Acts& a) { return a.layers.empty() ? a.out : a.layers[0].res_in; }
  float forward(int chunk, Acts& a, Tensor tokens, Tensor targets, float dloss,
                const StepContext& ctx);
  // Leaves the gradient of the chunk's input in d_res_.
  void backward(int chunk, Acts& a, Tensor tokens, const StepContext& ctx);
  void layer_forward(int64_t local, LayerActs& a, Tensor res_out, const StepContext& ctx);
  // Full backward of a layer, or with `stash` its input-gradient part only (zero-bubble).
  void layer_backward(int64_t local, LayerActs& a, const StepContext& ctx,
                      LayerStash* stash = nullptr);
  void layer_backward_weight(int64_t local, LayerActs& a, const LayerStash& stash);
  // before/after_backward(0) on a stage other than the first that holds root parameters.
  void root_hooks();
  void norm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b);
  void norm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w,
                     Tensor mean, Tensor rstd);
  // Rounds an activation (or, for f16, an activation gradient) to the compute type.
  void lowp(Tensor t) const;
  void residual_branch(Tensor out, Tensor res, Tensor branch, Tensor scratch, int64_t layer,
                       int site, const StepContext& ctx);
  uint64_t dropout_stream(int64_t layer, int site, int64_t step) const;
  // Tensor-parallel regions (identity when tp = 1). The (N,C) input of a column-parallel linear
  // from this rank's norm output a (R,C): all-gathered into gather_ under SP, else a itself.
  Tensor column_input(Tensor a);
  // A row-parallel linear's partial output (N,C) -> the branch (R,C): summed over tp (all-reduce,
  // or reduce-scatter into branch_ under SP), then its bias added once.
  Tensor row_output(Tensor partial, Tensor bias);
  // Backward of row_output: the branch gradient (R,C) -> (N,C) (all-gathered into scratch_c_).
  Tensor row_output_grad(Tensor dbranch);
  // Backward of column_input: the partial input gradient (N,C) -> (R,C), summed over tp.
  Tensor column_input_grad(Tensor dinp);

  ModelSpec spec_;
  Allocator& alloc_;
  ModelHooks* hooks_ = nullptr;
  std::vector<size_t> block_first_;   // block b owns params [block_first_[b], block_first_[b+1])
  std::vector<int64_t> layers_;       // global index of each local layer
  std::vector<int64_t> chunk_first_;  // chunk k holds local layers [chunk_first_[k], [k+1])
  int64_t B_, T_;
  DType compute_;
  ModelStorage storage_;
  TensorParallel tp_;
  bool sp_ = false;   // sequence parallel with tp > 1
  int64_t R_;         // rows of the residual stream on this rank
  int64_t row0_ = 0;  // global row (in the micro-batch's N) of this rank's first
  int64_t H_, KV_, F_, F1_, V_, vocab_start_;  // this rank's heads, ffn, vocabulary

  Buffer params_buf_, grads_buf_, compute_buf_, scratch_buf_;
  Tensor flat_params_, flat_grads_;
  std::vector<Tensor> params_, grads_, compute_params_;
  ModelWeights w_;   // views of the compute weights (== master for f32)
  ModelWeights gw_;  // views of the gradients
  Acts whole_;       // without pp: the one micro-batch's activations, allocated at construction
  std::vector<std::vector<Acts>> pipe_acts_;  // [chunk][mb] under pp, allocated per micro-batch
  Tensor ce_max_, ce_sums_;                   // (N), (2,N) vocab-parallel cross-entropy (tp > 1)
  // Backward scratch.
  Tensor d_res_, d_tmp_;  // (R,C) x2
  Tensor d_c_;            // (N,C)
  Tensor d_qkv_, d_att_;  // (B,T,Q), (B,T,H*D)
  Tensor d_u_, d_g_;      // (B,T,F1), (B,T,F)
  Tensor scratch_c_;      // (N,C) branch output before dropout/residual (partial under tp)
  // Sequence parallel only: the gathered column-parallel input (N,C), the reduce-scattered
  // branch (R,C), and a norm's partial weight/bias gradients (2,C) before their all-reduce.
  Tensor gather_, branch_, sp_dnorm_;
  std::vector<float> host_losses_;
};

ModelWeights bind_weights(const ModelSpec& spec, const std::vector<Tensor>& views);

// Initialises x = rows [row_begin, row_begin + x.shape[0]) of parameter i as this rank holds it
// (spec.params[i].shape), with exactly the values of those elements in the single-rank tensor:
// each piece from the counter-based generator at its global index, whatever the tp slices
// (placement.h) and whatever further row split (ZeRO's dp shards) cut it.
void init_param_rows(const ModelSpec& spec, size_t i, Tensor x, int64_t row_begin, uint64_t seed);

}  // namespace llmt
