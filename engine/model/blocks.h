// The transformer's blocks: Embedding, Norm, Attention (or LatentAttention) and Mlp (or MoeMlp),
// the two residual branches behind the Branch interface so that another attention or MLP is a
// swap, Head (final norm, vocab-parallel logits and loss), and the Layer that assembles norm ->
// branch -> dropout + residual twice. Each block has forward, backward_input and backward_weight,
// and declares what it saves (forward -> backward) and what it stashes (backward_input ->
// backward_weight), as shapes, so activation memory is a sum the model lays out once and `plan` and
// tests can compute.
//
// Backward: backward_input assigns the input gradient; backward_weight adds into the weight
// gradients. Run back to back (every schedule but zero-bubble) the stash holds views of live
// buffers (TensorSpec::view) and the model's small shared scratch for the rest; run apart (ZB-H1)
// it holds copies in the micro-batch's own memory (Stash).
//
// Dims: B micro-batch, T the positions of a sequence this rank holds (seq_len, or seq_len/cp under
// context parallelism, at the global positions env.seq says), C d_model, H/KV query/kv heads and F
// ffn hidden as this tp rank holds them, D head dim, Q = (H+2KV)*D, F1 = F (gelu) or 2F (swiglu), N
// = B*T, R rows of the residual stream this rank holds (N, or N/tp under sequence parallelism),
// V/tp vocabulary rows.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "engine/model/model_spec.h"
#include "engine/parallel/attention_core.h"
#include "engine/parallel/context_parallel.h"
#include "engine/parallel/parallel_layers.h"

namespace llmt {

// Options of one forward/backward that are not shapes.
struct StepContext {
  uint64_t seed = 0;         // dropout key
  int64_t step = 0;          // dropout key
  int64_t first_sample = 0;  // global index of the micro-batch's first sample (dropout key)
  bool dropout = true;       // false for evaluation: no dropout whatever model.dropout says
};

// One tensor a block saves or stashes. `view`: in a back-to-back backward the stash entry is a
// view of a live buffer and takes no memory (a linear's output gradient); otherwise the block
// computes into it (a norm's weight gradient). `dtype`: f32, or the compute type (bf16, f16) for
// an activation stored in 16 bits (docs/model.md, "Precision"); i32 index tensors are laid out as
// f32 entries (same size).
struct TensorSpec {
  std::string name;
  Shape shape;
  bool view = false;
  DType dtype = DType::f32;
};
size_t spec_bytes(const std::vector<TensorSpec>& specs);  // laid out back to back (TensorLayout)

// Lays out tensors back to back in a region of memory (a flat tensor of any type), each at a
// 64-byte boundary: a first pass without a region counts bytes, a second over a region of that
// size hands out views.
class TensorLayout {
 public:
  explicit TensorLayout(Tensor region = {}) : region_(region) {}
  Tensor take(Shape s, DType t = DType::f32);
  std::vector<Tensor> take_all(const std::vector<TensorSpec>& specs);
  size_t bytes() const { return offset_; }

 private:
  Tensor region_;
  size_t offset_ = 0;
};

// What backward_input leaves for backward_weight, one entry per TensorSpec of the block's
// stash(). Persistent (zero-bubble): every entry is memory of the micro-batch's own, and keep()
// copies into it. Back to back: view entries alias the live buffer keep() is given, the others
// are the model's shared scratch.
class Stash {
 public:
  Stash(std::span<Tensor> entries, bool persistent) : entries_(entries), persistent_(persistent) {}
  // Entry i := t: a copy (persistent) or t itself (a view entry of a back-to-back backward).
  Tensor keep(size_t i, Tensor t);
  Tensor operator[](size_t i) const { return entries_[i]; }
  // Entries [first, first + n), for one block of a layer.
  Stash part(size_t first, size_t n) const {
    return Stash(entries_.subspan(first, n), persistent_);
  }

 private:
  std::span<Tensor> entries_;
  bool persistent_;
};

// The model's weights and gradients, one view per ModelSpec::params entry (this rank's shapes).
// Blocks hold indices, so ZeRO rebinding a block's views changes no block.
struct ParamViews {
  std::vector<Tensor> w;  // compute weights (the master weights for f32)
  std::vector<Tensor> g;  // gradients
};

// Backward scratch shared by every block of a model (one micro-batch's worth, reused).
struct BlockScratch {
  Tensor d_res, d_tmp;        // (R,C) residual-stream gradient and a branch's
  Tensor d_c;                 // (N,C) a column-parallel linear's partial input gradient
  Tensor d_qkv, d_att;        // (B,T,H+2KV,D), (B,T,H,D)
  Tensor d_u, d_g;            // (B,T,F1), (B,T,F)
  Tensor core_att, core_lse;  // (B,T,H,D), (B,H,T) selective recompute's attention core
  Tensor replay_out;          // (R,C) full recompute: the replayed layer's output, discarded
  // Selective recompute of the norms and the activations (RecomputeModules): one norm's output
  // (R,C), one MLP's activation output (B,T,F) and, without ep, one MoE layer's routed experts'
  // (M,Fe), in the compute type.
  Tensor norm_out, act_out, moe_act_out;
  Tensor stash;  // the non-view stash entries of a back-to-back backward
  // Distributed saved inputs (Layer::distributed): the residual stream in full, (R,C) in the
  // compute type; the forward passes it between two, a replay gathers its input into [0].
  std::array<Tensor, 2> whole;
  // Mixture-of-experts layers (MoeMlp): router scores (N,E), the branch output y (N,C), the input
  // gradient dx and the router's part dx_router (N,C), the routing weights' gradient dw (N,k),
  // the experts' gradients d_g (M,Fe) and d_xp (M,C), per-sequence aux (S) and per-token z (N).
  Tensor moe_scores, moe_y, moe_dx, moe_dx_router, moe_dw, moe_dg, moe_dxp, moe_aux, moe_zsq;
  // Multi-head latent attention (LatentAttention; f32 unless said): the keys' and values' up
  // projection kv (N,H*(Dn+Dv)) and its gradient; the decoupled RoPE key k_pe (N,Dr), compute
  // type; a rank's rows of a latent before they are gathered over tp (R, max(Cq,Ckv,Dr)),
  // compute type; the kv down projection kva (R,Ckv+Dr) and its gradient d_kva; the up
  // projections' partial input gradients d_lat (N, max(Cq,Ckv)), the key's d_kpe (N,Dr), their
  // sums over tp (R, max(Cq,Ckv)) d_rows; the query latent's gradient d_qa (R,Cq); the input
  // gradient dx (R,C).
  struct Mla {
    Tensor kv, k_pe, rows, kva, d_kva, d_lat, d_kpe, d_rows, d_qa, dx;
    // Selective recompute of the up projections ("mla_up_proj"): one layer's core input qkv
    // (B,T,W,D) (core_heads), compute type, and the saved set it was rebuilt for (its kv latent).
    Tensor qkv;
    const void* qkv_of = nullptr;
  } mla;
  // Multi-token prediction (MtpModule; f32): a norm's output or its gradient x (R,C), the
  // gradient of eh_proj's input d_cat (R,2C), and `carry` (R,C), the gradient of a module's
  // hidden input passed to the depth before it (the last layer's output at depth 1).
  struct Mtp {
    Tensor x, d_cat, carry;
  } mtp;
  // Which saved set the recompute scratch holds now (its first tensor's data), so a zero-bubble
  // backward_weight replays only when another micro-batch or layer has used it since.
  const void* core_of = nullptr;     // core_att/core_lse: computed from this qkv
  const void* replay_of = nullptr;   // the replay set: replayed from this res_in
  const void* norm_of = nullptr;     // norm_out: the norm of this res_in or res_mid
  const void* act_of = nullptr;      // act_out: the activation of this fc1 output u
  const void* moe_act_of = nullptr;  // moe_act_out: the activation of these experts' fc1 rows h
  // The saved input (res_in) of the layer whose blocks run now: one per (layer, micro-batch),
  // what a block keys per-micro-batch state of its own by (MoeMlp under expert parallelism).
  const void* layer_input = nullptr;
};

// What the mixture-of-experts layers of a model measured since reset(): the loss terms they
// added (coefficients included; summed over layers, a sum of micro-batch means), and per MoE
// layer (in the order this rank runs them) the assignments routed to each expert, plus the
// assignments dropped by capacity.
struct MoeStats {
  double aux = 0, z = 0;
  std::vector<std::vector<int64_t>> load;  // [global layer][expert], empty for dense layers
  int64_t dropped = 0, assigned = 0;
  // Set by the model: d objective / d micro-batch mean loss (the aux and z-loss gradients' scale),
  // and whether a forward is a full-recompute replay (its routing is not counted again).
  float dloss = 1.0f;
  bool replaying = false;
  bool forward_only = false;  // an evaluation forward: no backward will follow
  // Expert parallelism: the permuted rows this rank exchanged with other ranks in its forward
  // dispatch, its own sent to their experts plus theirs received for its experts (each such row
  // crosses 4 times: there and back in forward, its gradient there and back in backward).
  int64_t ep_rows = 0;
  void reset() {
    aux = z = 0;
    for (auto& l : load) std::fill(l.begin(), l.end(), 0);
    dropped = assigned = 0;
    ep_rows = 0;
  }
};

// What every block of one model shares.
struct BlockEnv {
  const ModelSpec& spec;  // this rank's (tp-sharded) spec
  Allocator& alloc;
  int64_t B, T;
  const TpLayers& tp;  // compute type, rows, regions
  ParamViews& params;
  BlockScratch& scratch;
  const SequenceShard& seq;  // the global positions of this rank's T
  AttentionCore& attention;  // this rank's, or context parallelism's over the cp group
  MoeStats& moe_stats;
  // Expert parallelism: the group sharing out the experts (the spec holds this rank's), or null.
  Communicator* ep = nullptr;
  // Context parallelism: the group holding the other chunks of these sequences, or null (cp = 1).
  // The mixture of experts sums its per-sequence expert counts over it.
  Communicator* cp = nullptr;
  // Each parameter's index in spec.params by name (the model fills it before making blocks).
  std::unordered_map<std::string, int64_t> index = {};

  int64_t param(const std::string& name) const;      // index; throws if absent
  int64_t param_opt(const std::string& name) const;  // index or -1
  Tensor w(int64_t i) const { return i < 0 ? Tensor() : params.w[static_cast<size_t>(i)]; }
  Tensor g(int64_t i) const { return i < 0 ? Tensor() : params.g[static_cast<size_t>(i)]; }
  void round(Tensor x) const { tp.round(x); }
  // (T) i32 global positions under context parallelism; undefined (positions 0..T-1) without.
  Tensor positions() const { return attention.positions(); }
};

// LayerNorm or RMSNorm over the rows this rank holds.
class Norm {
 public:
  Norm(const BlockEnv& env, const std::string& prefix);  // "layers.3.norm_1", "norm_f"
  std::vector<TensorSpec> saved() const;                 // mean (R) (layernorm), rstd (R)
  std::vector<TensorSpec> stash() const;  // d weight (C), d bias (C) (layernorm): partial sums
  // out (R,C) = norm(in (R,C)), rounded to the compute type.
  void forward(std::span<const Tensor> s, Tensor out, Tensor in) const;
  // din (R,C) from dout (R,C); the weight gradients into the stash, summed over tp under SP.
  void backward_input(std::span<const Tensor> s, Stash& st, Tensor din, Tensor dout,
                      Tensor in) const;
  void backward_weight(const Stash& st) const;

 private:
  const BlockEnv& env_;
  bool layernorm_;
  int64_t w_, b_;
};

// A residual branch: x (R,C), the normalised residual stream -> y (R,C), before dropout and the
// residual add. Attention and Mlp are the two; a context-parallel attention or an expert MLP is
// another implementation of this interface.
class Branch {
 public:
  virtual ~Branch() = default;
  virtual std::vector<TensorSpec> saved() const = 0;
  virtual std::vector<TensorSpec> stash() const = 0;
  // y (R,C), a view of the model's scratch valid until the next branch runs.
  virtual Tensor forward(std::span<const Tensor> s, Tensor x) = 0;
  // dx (R,C) from dy (R,C), a scratch view valid until the next branch's backward.
  virtual Tensor backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) = 0;
  virtual void backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) = 0;
};

// Causal self-attention: column-parallel qkv (+ RoPE), the flash-style core, row-parallel proj.
// With recompute_core (selective recompute) the core's output and LSE are not saved: they are
// recomputed from the saved qkv into the model's scratch in backward.
class Attention final : public Branch {
 public:
  Attention(const BlockEnv& env, const std::string& prefix, bool recompute_core);
  std::vector<TensorSpec> saved()
      const override;  // qkv (B,T,H+2KV,D) [, att (B,T,H,D), lse (B,H,T)]
  std::vector<TensorSpec> stash() const override;  // d proj out (N,C), d qkv out (N,Q)
  Tensor forward(std::span<const Tensor> s, Tensor x) override;
  Tensor backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) override;
  void backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) override;

 private:
  // The core's output and LSE of the saved set s: saved, or recomputed into the scratch unless
  // it holds them already (scratch.core_of).
  std::pair<Tensor, Tensor> core(std::span<const Tensor> s);

  const BlockEnv& env_;
  bool recompute_core_;
  int64_t qkv_w_, qkv_b_, proj_w_, proj_b_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
};

// Multi-head latent attention (DeepSeek-V2 §2.1, V3 §2.1.1; docs/model.md, "Multi-head latent
// attention"). Queries: x -> q_a (Cq) -> RMSNorm -> q_b (H x [nope Dn | rope Dr]), or one
// full-rank q (Cq = 0). Keys and values: x -> kv_a = [c (Ckv) | k_pe (Dr)]; RMSNorm(c) -> kv_b (H x
// [k_nope Dn | v Dv]); each head's key is [k_nope | k_pe], k_pe one RoPE key shared by all heads.
// RoPE rotates the last Dr dims of every query and key. The core sees H query and H kv heads of
// D = Dn + Dr, values zero-padded from Dv to D (Dv <= D), so its scale is 1/sqrt(Dn + Dr); the
// output's first Dv dims of each head go to the row-parallel proj. Under tp (sequence parallelism
// required) each rank projects its own R rows down (q_a, kv_a and the latents' norms replicated,
// gradients partial over tp), gathers the normalised latents and k_pe over tp (N rows: what
// q_b/kv_b, column-parallel by heads, read), and reduce-scatters their gradients back: the
// gathers move the latents (Cq + Ckv + Dr per token) where multi-head attention's moves x (C).
// Dims as Attention's; Cq/Ckv the query/kv latent ranks, Dn/Dr/Dv the head dims of [model.mla].
//
// Under a cp ring the ring moves each position's payload [normalised kv latent | rotated k_pe]
// (Ckv + Dr values, not 2·H·D) and every rank expands the blocks it receives with kv_b
// (KvExpansion): the backward contracts each block's dK/dV into the latent's gradient and adds
// kv_b's weight gradient as the block passes, so that runs in the input half (zero-bubble
// schedules, which defer it, keep the expanded K/V: cp_kv_payload). Under Ulysses the group
// all-gathers the payloads and each rank expands its H/u heads' K/V (rows of kv_b) for all of
// them; the contraction adds those rows' weight gradient. Under FP8 kv_b's inputs are
// quantised block by block (their tiles never cross a block's rows; tensorwise: a scale per
// block).
class LatentAttention final : public Branch, private KvExpansion {
 public:
  // recompute_up (selective recompute's "mla_up_proj"; needs q_lora_rank > 0): qkv is not saved
  // but the gathered RoPE key k_pe before its rotation is; the core's input is rebuilt from the
  // latents into scratch.mla.qkv where backward needs it.
  LatentAttention(const BlockEnv& env, const std::string& prefix, bool recompute_core,
                  bool recompute_up = false);
  // The heads W of the core's input qkv: 3H (queries, keys, values), or H + 1 where the core
  // expands every block's K/V from the payloads itself (Ulysses, hybrid: reads_own_kv false): the
  // queries and one key head, whose RoPE dims hold the rotated k_pe the payload takes.
  static int64_t core_heads(const AttentionCore& core, int64_t H);
  // qkv (B,T,W,D) (0 positions under recompute_up) [, att (B,T,H,D), lse (B,H,T)], [q_a (R,Cq),
  // q_rstd (R), q_latent (N,Cq),] c (R,Ckv), kv_rstd (R), kv_latent (N,Ckv)[, k_pe (N,Dr) under
  // recompute_up]; activations in the compute type.
  std::vector<TensorSpec> saved() const override;
  // d proj out (N,C), d q (N,H*D), d kv (N,H*(Dn+Dv)), d kv_a (R,Ckv+Dr) [, d q_a (R,Cq)] (views),
  // the latent norms' weight gradients (Cq + Ckv).
  std::vector<TensorSpec> stash() const override;
  Tensor forward(std::span<const Tensor> s, Tensor x) override;
  Tensor backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) override;
  void backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) override;

 private:
  // The core output's first Dv dims of each head (N,H*Dv): att itself when Dv = D, else copied
  // into `into`.
  Tensor values_of(Tensor att, Tensor into) const;
  // The core's input of saved set s: s[0], or (recompute_up) scratch.mla.qkv rebuilt from its
  // latents unless it holds them still.
  Tensor qkv_of(std::span<const Tensor> s) const;
  // qkv (B,T,W,D) := the heads of the queries' latent q_latent (N,Cq), or of the queries q
  // (N,H*D) f32 already projected (q_latent undefined), and of the kv latent (N,Ckv) and the
  // gathered RoPE key k_pe (N,Dr), RoPE applied and rounded once.
  void build_qkv(Tensor qkv, Tensor q, Tensor q_latent, Tensor kv_latent, Tensor k_pe) const;
  // The core's output and lse of saved set s (attention_core), run through the payload ring when
  // the core moves one.
  std::pair<Tensor, Tensor> core(std::span<const Tensor> s) const;
  void run_core(Tensor out, Tensor lse, std::span<const Tensor> s) const;
  // The payload ring: this rank's payload (N*(Ckv+Dr), compute type) := [kv_latent | the rotated
  // k_pe of qkv's first key head]; a block's K/V from its payload, and back.
  void fill_payload(std::span<const Tensor> s) const;
  void expand(Tensor kv, Tensor p, int64_t head0, int64_t h) const override;
  void contract(Tensor d_p, Tensor dkv, Tensor p, int64_t head0, int64_t h) const override;
  // Rows [head0 E, (head0+h) E) of kv_b's weight or its gradient (OC,Ckv), E = Dn + Dv: heads
  // [head0, head0+h) of this tp rank's.
  Tensor kv_up_heads(Tensor w, int64_t head0, int64_t h) const;
  Tensor payload_latent(Tensor p) const;                            // (N,Ckv) view of a payload
  Tensor payload_kpe(Tensor p) const;                               // (N,Dr)
  size_t kv_latent_at() const { return lat_ + (Cq_ > 0 ? 5 : 2); }  // kv_latent in the saved set
  size_t st_norms() const { return Cq_ > 0 ? 5 : 4; }               // the norms' entry of the stash
  const BlockEnv& env_;
  bool recompute_core_, recompute_up_;
  int64_t H_, Dn_, Dr_, Dv_, D_, Cq_, Ckv_;
  bool payload_;  // the cp core moves the payload
  int64_t W_;     // qkv's heads (core_heads)
  size_t lat_;    // the first latent tensor in the saved set
  int64_t q_a_, q_norm_, q_up_w_, kv_a_, kv_norm_, kv_up_w_, proj_w_;
  ColumnParallelLinear q_up_, kv_up_;
  RowParallelLinear proj_;
};

// The MLP: column-parallel fc1, GELU or SwiGLU, row-parallel fc2. `ffn`: its hidden width F
// (global; 0 = model.d_ff); the shared experts of an MoE layer are an Mlp of their total width.
// With recompute_act (selective recompute's "act") the activation's output g is not saved: the
// forward writes it into the model's scratch, and fc2's weight gradient recomputes it from the
// saved u unless the scratch holds it still (scratch.act_of).
class Mlp final : public Branch {
 public:
  Mlp(const BlockEnv& env, const std::string& prefix, int64_t ffn = 0, bool recompute_act = false);
  std::vector<TensorSpec> saved() const override;  // u (B,T,F1) [, g (B,T,F)]
  std::vector<TensorSpec> stash() const override;  // d fc2 out (N,C), d fc1 out (N,F1)
  Tensor forward(std::span<const Tensor> s, Tensor x) override;
  Tensor backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) override;
  void backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) override;

 private:
  // g = act(u) (B,T,F) into `g`, rounded to the compute type.
  void activate(Tensor g, Tensor u) const;
  // The activation output of the saved set s: s[1], or recomputed into scratch.act_out.
  Tensor activation(std::span<const Tensor> s) const;
  const BlockEnv& env_;
  bool recompute_act_;
  bool gelu_;
  int64_t F_, F1_;  // this tp rank's hidden width and fc1 rows
  int64_t fc1_w_, fc1_b_, fc2_w_, fc2_b_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

// Capacity of each (sequence, expert) under capacity_factor c > 0: ceil(c * seq_len * top_k /
// num_experts) assignments; 0 (dropless) when c = 0.
int64_t moe_capacity(const MoeConfig& moe, int64_t seq_len);

// The rows a mixture-of-experts layer routes on this rank: its branch's R rows of the
// micro-batch's N = B*T, from row0 (all of them, or the rank's share under sequence
// parallelism), as `segments` runs of `seg` = gcd(R, T) tokens, each inside one sequence.
struct MoeRows {
  int64_t R = 0, row0 = 0, T = 0, seg = 0, segments = 0;
  int64_t sequence(int64_t segment) const { return (row0 + segment * seg) / T; }
};
MoeRows moe_rows(const TpLayers& tp, int64_t T);

// Expert parallelism's memory of an MoE layer of `spec` for the R rows its rank receives for
// its experts in one micro-batch: what the forward keeps for the backward (MoeMlp::EpRows: the
// rows xr (R,C), their fc1 output hr (R,Fe1), activation gr (R,Fe) and output er (R,C), stored
// in the compute type `compute`, 16 bits in bf16/fp16, and sent so); the gradients the weight
// backward reads, from the input backward on (d_er (R,C), dh_r (R,Fe1), f32: a moment under
// back-to-back backwards, input half to weight half under zero-bubble schedules); and what the
// input backward adds for a moment (fc2's and fc1's input gradients dgr (R,Fe), dxr (R,C), f32).
// R depends on the routing (R k at balance).
// keep_act false: without gr (selective recompute's "moe_act"), which then lives in ep_act_specs'
// buffer only while fc2's forward or weight gradient reads it.
std::vector<TensorSpec> ep_rows_specs(const ModelSpec& spec, int64_t R, DType compute,
                                      bool keep_act = true);
std::vector<TensorSpec> ep_act_specs(const ModelSpec& spec, int64_t R, DType compute);
// Under ep with train.fp8 on: the quantised copies of R received rows' GEMM inputs (two of R x
// the widest of C, Fe1 and Fe) and their tiles' maxima, allocated for one pass's expert GEMMs
// (forward, backward_input, backward_weight each); none without FP8.
std::vector<TensorSpec> ep_fp8_specs(const ModelSpec& spec, int64_t R, const Fp8Recipe& fp8);
std::vector<TensorSpec> ep_grad_specs(const ModelSpec& spec, int64_t R);
std::vector<TensorSpec> ep_backward_specs(const ModelSpec& spec, int64_t R);
// The counts an MoE layer exchanges over its ep group before the rows: rows per (peer, local
// expert) sent and the same received, E int32 each (MemCategory::comm, for the exchange only).
int64_t ep_count_bytes(const ModelSpec& spec);

// A mixture of experts (docs/model.md, "Mixture of experts"): fp32 router logits, top-k routing,
// the dispatch into expert order (capacity dropping per sequence), the experts' grouped GEMMs
// (fc1, GELU or SwiGLU, fc2; no biases), the combine weighted by the routing weights, plus the
// shared experts (an Mlp). The aux and z losses add their gradients to the router's in backward
// and their values to env.moe_stats in forward. Under context parallelism the per-sequence
// expert counts are summed over the cp group (every token's routing is local; only the aux loss's
// load fractions need the whole sequence), and capacity dropping ranks each assignment among the
// whole sequence's from every chunk's counts (rank_base). Under tensor parallelism (with
// sequence parallelism) each tp rank routes its own rows (MoeRows) through experts and a router
// replicated over tp, and the counts are summed over tp as well; the shared experts are a
// tp-sharded Mlp.
// Dims: E experts, k per token, S = B sequences, M = N*k permuted rows, Fe1/Fe an expert's fc1
// rows and hidden width.
class MoeMlp final : public Branch {
 public:
  // recomputed: the layer recomputes fully (train.recompute = "full"): under ep its forward keeps
  // no received rows, its backward dispatches them again. recompute_act: the shared experts'
  // activation is recomputed (Mlp's). recompute_moe_act: the routed experts' activation g is not
  // kept (selective recompute's "moe_act"): the forward writes it into scratch.moe_act_out (under
  // ep a buffer of its own, ep_act_specs) for fc2, and fc2's weight gradient recomputes it from
  // h there.
  MoeMlp(const BlockEnv& env, const std::string& prefix, int64_t layer, bool recomputed = false,
         bool recompute_act = false, bool recompute_moe_act = false);
  // logits (N,E), idx (N,k) i32, weights (N,k), counts (S,E) i32, offsets (E+1) i32, assign (M)
  // i32, slot (N,k) i32, xp (M,C), h (M,Fe1), g (M,Fe) (0 rows under ep or recompute_moe_act),
  // eo (M,C) [, the shared Mlp's]
  std::vector<TensorSpec> saved() const override;
  // d logits (N,E), d eo (M,C), d h (M,Fe1) [, the shared Mlp's]
  std::vector<TensorSpec> stash() const override;
  Tensor forward(std::span<const Tensor> s, Tensor x) override;
  Tensor backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) override;
  void backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) override;

 private:
  static constexpr size_t kSaved = 11, kStash = 3;
  // The saved offsets (E+1) read back to the host, for the grouped GEMMs' row runs.
  std::vector<int64_t> offsets(std::span<const Tensor> s) const;
  // Capacity when a sequence's tokens are on several ranks (cp chunks, tp rows):
  // moe_dispatch's rank_base (segments,E,k,runs) in `buf`, the rank in the whole sequence of this
  // rank's first assignment of each (segment, expert, choice j, run of positions), from every
  // chunk's counts summed over the tp and cp groups.
  Tensor rank_base(Tensor idx, Buffer& buf) const;
  // Expert parallelism: what one micro-batch's forward leaves for its backward on this rank, the
  // rows the ep peers sent for this rank's experts (R of them, by peer, then by local expert) and
  // their activations and gradients, in memory of its own (R depends on the routing). Kept from
  // forward to backward_weight, by the layer's input (scratch.layer_input). A full-recompute
  // replay of the layer finds them and only returns the outputs again; a fully recomputed layer
  // (recomputed_) keeps none from its forward, and its replay or backward_input dispatches them
  // again.
  struct EpRows {
    Buffer buf, grad_buf;  // xr, hr, gr, er from the forward; d_er, dh_r from backward_input
    std::vector<int64_t> send, recv;         // elements per peer: to it, from it (rows x C)
    std::vector<int64_t> groups, weight_of;  // grouped GEMM row runs (peer, local expert)
    Tensor xr, hr, gr, er, d_er, dh_r;       // (R,C), (R,Fe1), (R,Fe), (R,C), (R,C), (R,Fe1)
    // (gr undefined under recompute_moe_act: the activation lives in a buffer of its own while
    // fc2's forward or weight gradient reads it, ep_act_specs.)
  };
  // g (rows,Fe) := the experts' activation of their fc1 output h (rows,Fe1), rounded.
  void activate(Tensor g, Tensor h) const;
  // Under ep with recompute_moe_act: r.hr's activation, in `buf` allocated for it.
  Tensor ep_activation(const EpRows& r, Buffer& buf) const;
  bool ep() const { return env_.ep != nullptr && env_.ep->size() > 1; }
  // The experts' grouped GEMMs (ops::grouped_linear_*) over the row runs `groups` (weight_of:
  // each run's local expert; empty: one run per expert) of weight stack `w` (a param index), with
  // FP8 inputs under train.fp8 (TpLayers' recipe): the rows quantised run by run into q, the
  // stack expert by expert into TpLayers::fp8_w.
  struct Fp8Scratch {
    Tensor a, b, amax;
  };
  // The model's scratch (the rows routed here), or under ep `buf` allocated for R received rows
  // (ep_fp8_specs). Empty tensors without FP8.
  Fp8Scratch fp8_scratch(int64_t R, Buffer& buf) const;
  void experts_forward(Tensor out, Tensor in, int64_t w, std::span<const int64_t> groups,
                       std::span<const int64_t> weight_of, const Fp8Scratch& q) const;
  void experts_backward_input(Tensor din, Tensor dout, int64_t w, std::span<const int64_t> groups,
                              std::span<const int64_t> weight_of, const Fp8Scratch& q) const;
  void experts_backward_weight(int64_t w, Tensor dout, Tensor in, std::span<const int64_t> groups,
                               std::span<const int64_t> weight_of, const Fp8Scratch& q) const;
  // Forward under ep: the permuted rows xp (M,C) to the experts' ranks, the experts, and their
  // outputs back into eo (M,C) in xp's order.
  void ep_forward(std::span<const Tensor> s, const std::vector<int64_t>& off);
  // The count exchange and the rows xp (s[7]) to the experts' ranks, their first GEMM and
  // activation (xr, hr, gr; er allocated); `count`: into MoeStats::ep_rows.
  EpRows ep_dispatch(std::span<const Tensor> s, const std::vector<int64_t>& off, bool count);
  std::map<const void*, EpRows> ep_rows_;

  // The sequences' expert counts (B,E) summed over the ranks holding other parts of them (cp's
  // chunks, tp's rows), back into counts (segments,E); `local` is this rank's (segments,E).
  void sequence_counts(Tensor counts, const std::vector<int32_t>& local) const;

  const BlockEnv& env_;
  const MoeConfig& cfg_;
  const MoeRows rows_;
  int64_t layer_;
  bool recomputed_, recompute_moe_act_;
  int64_t E_, k_, Fe_, Fe1_, capacity_;
  size_t st_shared_ = 0;  // the shared Mlp's stash entries
  bool gelu_;
  int64_t router_w_, bias_, fc1_w_, fc2_w_;  // bias_: aux-loss-free balancing's, or -1
  std::optional<Mlp> shared_;
};

// One pre-norm transformer layer: res_mid = res_in + dropout(attn(norm_1(res_in))), out =
// res_mid + dropout(mlp(norm_2(res_mid))); the dropout mask keyed by (layer, site, step, global
// element index), so a replay draws the same mask. Its saved tensors are [res_in, a, res_mid, m]
// (a, m: the norms' outputs) then each block's; under selective recompute of the norms
// ([res_in, res_mid], then the blocks') a and m are written into the model's scratch
// (scratch.norm_out) and recomputed from res_in, res_mid and the saved statistics for the
// weight gradients that read them; under full recompute only res_in, the rest
// replayed into `replay` (one layer's full set, the model's scratch) in backward. `distributed`
// (full recompute under tp without SP, train.distribute_saved_activations): res_in, the same on
// every tp rank, is saved as this rank's 1/tp of its elements (tp::split_1d) and gathered over tp
// before the replay, into scratch.whole[0] (Megatron's distribute-saved-activations).
class Layer {
 public:
  Layer(const BlockEnv& env, int64_t layer, LayerRecompute recompute, std::span<Tensor> replay,
        bool distributed = false);
  int64_t index() const { return layer_; }
  Recompute recompute() const { return recompute_.mode; }
  bool distributed() const { return distributed_; }
  std::vector<TensorSpec> saved() const;
  std::vector<TensorSpec> stash() const;
  // The saved set of this layer's forward (what full recompute replays into; a fully recomputed
  // layer's replay keeps every tensor).
  std::vector<TensorSpec> full_saved() const;
  // out (R,C) = layer(in (R,C)); in is s[0] (res_in), or for a distributed layer the whole
  // input, of which s[0] holds this rank's part (the caller's split).
  void forward(std::span<const Tensor> s, Tensor in, Tensor out, const StepContext& ctx);
  // scratch.d_res (R,C): on entry the gradient of the layer's output, on return of its input.
  // With `then_weight` every block's backward_weight follows its backward_input at once (and
  // `st` need not persist); otherwise backward_weight(s, st) runs later (zero-bubble).
  void backward_input(std::span<const Tensor> s, Stash& st, const StepContext& ctx,
                      bool then_weight);
  void backward_weight(std::span<const Tensor> s, const Stash& st, const StepContext& ctx);

 private:
  // f: the full saved set (forward writes into it); out (R,C).
  void run_forward(std::span<const Tensor> f, Tensor out, const StepContext& ctx);
  // The full saved set: s itself, or (full recompute) the replay set, replayed from s[0] when it
  // does not hold this s yet.
  std::span<const Tensor> full_set(std::span<const Tensor> s, const StepContext& ctx);
  void residual(Tensor out, Tensor res, Tensor branch, int site, const StepContext& ctx);
  // The output of norm_1 (site 0, of res_in) or norm_2 (site 1, of res_mid) in the full set f:
  // saved, or (selective recompute of the norms) recomputed into scratch.norm_out unless it
  // holds it still.
  Tensor normed(std::span<const Tensor> f, int site) const;
  Tensor branch_grad(int site, const StepContext& ctx);  // dropout backward of scratch.d_res
  float dropout(const StepContext& ctx) const;
  uint64_t dropout_stream(int site, int64_t step) const;
  // Offsets of res_mid and the blocks' parts in the full saved set, and of the stash's.
  size_t mid_, n1_, attn_, n2_, mlp_, end_;
  size_t st_attn_, st_n2_, st_mlp_, st_n1_, st_end_;
  const BlockEnv& env_;
  int64_t layer_;
  LayerRecompute recompute_;
  bool distributed_;
  std::span<Tensor> replay_;
  Norm norm_1_, norm_2_;
  std::unique_ptr<Branch> attn_block_;  // Attention, or LatentAttention (model.attention = mla)
  std::unique_ptr<Branch> mlp_block_;   // Mlp, or MoeMlp on a mixture-of-experts layer
};

// Token (+ learned position) embedding, vocab-parallel.
class Embedding {
 public:
  // positions false: the token embedding only (a multi-token prediction module's), no wpe.
  explicit Embedding(const BlockEnv& env, bool positions = true);
  std::vector<TensorSpec> stash() const;  // d out (R,C) (view)
  // x (R,C) from tokens (B,T), rounded to the compute type.
  void forward(Tensor x, Tensor tokens) const;
  // The gradient of x (R,C) into the stash (the embedding has no input gradient).
  void backward_input(Stash& st, Tensor dx) const;
  void backward_weight(const Stash& st, Tensor tokens) const;

 private:
  const BlockEnv& env_;
  int64_t wte_, wpe_;
  VocabParallelEmbedding emb_;
};

// Final norm, vocab-parallel head (wte when tied) and softmax cross-entropy. Saves the gathered
// norm output xf (N,C), the norm's statistics, the logits (N,V/tp; overwritten by their
// gradient in forward) and the losses (B,T).
class Head {
 public:
  // f32_logits: the logits stay fp32 (a decoder's, which generate samples from); otherwise they
  // are stored in the compute type, the values the 16-bit rounding gave them anyway.
  // norm: the final norm's parameter prefix (a multi-token prediction module's own).
  Head(const BlockEnv& env, Tensor ce_max, Tensor ce_sums, bool f32_logits = false,
       const std::string& norm = "norm_f");
  std::vector<TensorSpec> saved() const;
  std::vector<TensorSpec> stash() const;  // the final norm's
  // The micro-batch's mean loss of the residual stream x (R,C) against targets (B,T) (over all
  // N positions; a target < 0 adds 0); the logits' gradient d(dloss * mean loss)/d logits is
  // computed with it.
  float forward(std::span<const Tensor> s, Tensor x, Tensor targets, float dloss);
  // The logits (N,V/tp) of x (R,C), this rank's vocabulary shard (a view of the saved set s).
  Tensor logits(std::span<const Tensor> s, Tensor x);
  // This rank's rows (R,C) of the final norm's output after forward (a view of s): what a
  // multi-token prediction module reads as the hidden state before it.
  Tensor normed(std::span<const Tensor> s) const;
  // scratch.d_res (R,C) = the gradient of x; d_normed (R,C), optional: a further gradient of
  // normed() (from a multi-token prediction module), added to the head's before the norm's.
  void backward_input(std::span<const Tensor> s, Stash& st, Tensor x, Tensor d_normed = {});
  void backward_weight(std::span<const Tensor> s, const Stash& st);

 private:
  const BlockEnv& env_;
  bool f32_logits_;
  Norm norm_f_;
  int64_t head_;
  ColumnParallelLinear linear_;
  VocabParallelCrossEntropy loss_;
  std::vector<float> host_losses_;
};

// A multi-token prediction module (DeepSeek-V3 §2.2; docs/model.md, "Multi-token prediction"),
// depth k (1-based) of model.mtp_depth: from the previous depth's hidden state h (R,C) and the
// tokens k places ahead, h' = eh_proj [enorm(wte[tokens]) | hnorm(h)] (eh_proj [C, 2C]
// replicated over tp, each rank its own rows), then the module's transformer layer (global layer
// L + k - 1) gives y, which its own final norm and the shared head score against the tokens k + 1
// places ahead. h is the previous head's normalised input (Head::normed: the main model's final
// norm output at k = 1), as Megatron-Core and DeepSeek's inference code take it. Saves [tokens
// (B,T) i32, e (R,C), [en | hn] (R,2C), y (R,C), enorm's, hnorm's, the layer's, the head's];
// stashes [d e (R,C), enorm's, hnorm's, d h' (R,C), the layer's, the head's].
class MtpModule {
 public:
  MtpModule(const BlockEnv& env, int64_t depth, LayerRecompute recompute, std::span<Tensor> replay,
            Tensor ce_max, Tensor ce_sums);
  int64_t depth() const { return depth_; }
  const Layer& layer() const { return layer_; }
  std::vector<TensorSpec> saved() const;
  std::vector<TensorSpec> stash() const;
  // The module's loss: the mean over the micro-batch's N positions of its cross-entropy against
  // labels (B,T) (-1 where no token lies that far ahead: adds 0, the paper's 1/T), its gradient
  // scaled by dloss. tokens (B,T): the inputs k places ahead (any id where none).
  float forward(std::span<const Tensor> s, Tensor h, Tensor tokens, Tensor labels, float dloss,
                const StepContext& ctx);
  // The hidden state the next depth reads (R,C): its head's normalised input (a view of s).
  Tensor out(std::span<const Tensor> s) const { return head_.normed(s.subspan(head_s_)); }
  // scratch.mtp.carry (R,C): on entry the gradient of out() from the next depth (read only when
  // `from_next`), on return the gradient of h. With `then_weight` each block's weight part
  // follows its input part at once; otherwise backward_weight(s, st) runs later (zero-bubble).
  void backward_input(std::span<const Tensor> s, Stash& st, Tensor h, bool from_next,
                      const StepContext& ctx, bool then_weight);
  void backward_weight(std::span<const Tensor> s, const Stash& st, const StepContext& ctx);

 private:
  void eh_weight(std::span<const Tensor> s, Tensor d_hp) const;  // eh_proj's weight gradient
  const BlockEnv& env_;
  int64_t depth_;
  Embedding emb_;
  Norm enorm_, hnorm_;
  int64_t eh_;
  Layer layer_;
  Head head_;
  // Offsets in the saved set: enorm's, hnorm's, the layer's, the head's, the end; in the stash:
  // enorm's, hnorm's, d h', the layer's, the head's, the end.
  size_t en_, hn_, layer_s_, head_s_, end_s_;
  size_t st_en_, st_hn_, st_hp_, st_layer_, st_head_, st_end_;
};

}  // namespace llmt
