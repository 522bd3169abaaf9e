// The op API: one forward/backward pair per op, dispatching on the tensors' device.
//
// Conventions (llm.c): arguments are ordered outputs, inputs, weights, then sizes/options.
// Backward functions ASSIGN activation gradients (dinp) and ADD INTO weight gradients (dweight,
// dbias), so gradient accumulation over micro-batches is free. An absent optional tensor is a
// default-constructed Tensor (defined() == false). Compute is fp32; token ids i32. Activations,
// weights and their gradients may be stored in bf16 or f16 (16-bit storage): the op reads them
// as fp32 and rounds what it writes to its tensor's type once, so an op on 16-bit tensors gives
// the bits of the op on fp32 tensors holding the same values followed by a rounding of its
// outputs. Statistics (mean, rstd, lse, the cross-entropy's max and sums, the losses), the
// router's logits, scores and weights, and the optimizer's parameters and states are f32.
//
// Dims used below: B batch, T sequence, C channels (d_model), V vocabulary, N = B*T rows,
// IC/OC in/out features, H heads (query), KV key/value heads, D head dim, F ffn hidden.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "core/tensor.h"
#include "kernels/rope_math.h"

namespace llmt::ops {

// ---- embeddings -------------------------------------------------------------------------------
// out (B,T,C) = wte[tokens] (+ wpe[pos_offset + t] when wpe is given).
// tokens (B,T) i32, wte (V,C), wpe (P,C) optional with P >= pos_offset + T. With `positions` (T)
// i32 (context parallelism: the global positions of a rank's rows, each < P) row t reads
// wpe[positions[t]] instead.
// Vocab-parallel: with vocab_size > 0, wte (Vl,C) holds rows [vocab_start, vocab_start + Vl) of a
// vocabulary of vocab_size; tokens outside them read zeros (so the tp shards' outputs sum to the
// full lookup). Token ids must lie in [0, vocab_size) (vocab_size = 0: wte's rows).
void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t pos_offset = 0,
                       int64_t vocab_start = 0, int64_t vocab_size = 0, Tensor positions = {});
// dwte (Vl,C) += the rows of the shard's tokens, dwpe (P,C) += every row (optional); dout (B,T,C).
void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens,
                        int64_t pos_offset = 0, int64_t vocab_start = 0, int64_t vocab_size = 0,
                        Tensor positions = {});

// ---- normalisation ----------------------------------------------------------------------------
// out (N,C), mean (N), rstd (N) saved for backward; inp (N,C), weight (C), bias (C) optional.
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps);
// dinp (N,C) assigned; dweight (C) +=; dbias (C) += (optional).
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                        Tensor weight, Tensor mean, Tensor rstd);
// out (N,C) = inp * rstd * weight; rstd (N) saved.
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps);
void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                      Tensor rstd);

// ---- linear (GEMM) ----------------------------------------------------------------------------
// `operands` (f32, bf16 or f16): the GEMM inputs' values (forward: inp, weight; backward: dout,
// inp, weight) are representable in this type, the model's compute precision. A backend may then
// multiply in that type with fp32 accumulation (CUDA: 16-bit copies on tensor cores); the CPU
// ignores it. The tensors stay f32; outputs and gradients are f32.
// out (N,OC) = inp (N,IC) @ weight(OC,IC)^T + bias (OC, optional).
void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias,
                    DType operands = DType::f32);
// dinp (N,IC) assigned, dweight (OC,IC) +=, dbias (OC) +=; each optional (skipped when absent:
// zero-bubble pipelines compute dinp and the weight gradients at different times). Only what
// the GEMMs that run read is required: weight for dinp, inp for dweight.
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                     Tensor weight, DType operands = DType::f32);

// ---- activations ------------------------------------------------------------------------------
// GELU, tanh approximation. Any shape; out may alias inp.
void gelu_forward(Tensor out, Tensor inp);
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp);
// SwiGLU: inp (N,2F) = [gate | up]; out (N,F) = silu(gate) * up.
void swiglu_forward(Tensor out, Tensor inp);
void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp);  // dinp (N,2F) assigned

// ---- rotary position embedding ----------------------------------------------------------------
// The dims of each head RoPE rotates: [first, first + count), count even; count 0 = the whole
// head. Multi-head latent attention rotates the last qk_rope_head_dim of each query and key head.
struct RopeDims {
  int64_t first = 0, count = 0;
};
// In place on x (B,T,HT,D): rotates heads [0, n_rot_heads) at positions pos_offset + t, with the
// "rotate half" pairing (i, i + R/2) and frequencies theta^(-2i/R) over the R = dims.count
// rotated dims (D by default; R even), scaled as `scaling` says (kernels/rope_math.h: linear,
// Llama 3.1's, YaRN's, whose attention factor also multiplies cos and sin). With `positions` (T)
// i32, row t is at positions[t] instead (context parallelism's global positions).
void rope_forward(Tensor x, int64_t n_rot_heads, int64_t pos_offset, float theta,
                  Tensor positions = {}, RopeDims dims = {}, const RopeScaling& scaling = {});
// In place on dx (B,T,HT,D): the transpose of rope_forward (the inverse rotation, times the same
// attention factor).
void rope_backward(Tensor dx, int64_t n_rot_heads, int64_t pos_offset, float theta,
                   Tensor positions = {}, RopeDims dims = {}, const RopeScaling& scaling = {});

// ---- attention --------------------------------------------------------------------------------
// Causal self-attention with grouped-query heads, computed in tiles with an online softmax:
// memory O(T) per head, never a (T,T) matrix. qkv (B,T,H+2KV,D) holds q heads, then k, then v;
// query head h uses kv head h / (H/KV). Scores q.k times `scale` (0: 1/sqrt(D)); pass the same
// scale to the backward.
// out (B,T,H,D); lse (B,H,T) log-sum-exp of each row's scaled scores (natural log), saved for
// backward.
// operands (f32, bf16 or f16): the inputs' values are representable in this type (the model's
// compute precision); a backend may compute on that type with fp32 accumulation. The CPU ignores
// it; CUDA runs cuDNN's fused attention for bf16/f16 where cuDNN supports the shape (docs/gpu.md).
// Pass the same operands to the backward as to the forward.
void attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t n_head, int64_t n_kv_head,
                       DType operands = DType::f32, float scale = 0.0f);
// dqkv (B,T,H+2KV,D) assigned; dout (B,T,H,D); recomputes scores tile by tile from qkv and lse.
void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                        int64_t n_head, int64_t n_kv_head, DType operands = DType::f32,
                        float scale = 0.0f);

// ---- attention blocks (context parallelism) -----------------------------------------------------
// One block of a sequence's attention, for a rank that holds some of its positions: queries are
// heads [0,H) of q_src (B,Tq,Wq,D) (a qkv tensor: Wq = H+2KV), keys heads [kv0, kv0+KV) and
// values heads [kv0+KV, kv0+2KV) of kv_src (B,Tk,Wk,D) (the same qkv with kv0 = H, or a
// (B,Tk,2KV,D) K/V buffer received from another rank with kv0 = 0). q_pos (Tq), k_pos (Tk) i32: the
// global positions of the rows; key j is visible to query i when k_pos[j] <= q_pos[i] (causal by
// global position). out (B,Tq,H,D) and lse (B,H,Tq) are assigned; a query that sees no key of the
// block gets out 0 and lse -inf. fp32 operands (the CUDA flash kernel, not cuDNN). Scores scaled
// as attention_forward's.
void attention_block_forward(Tensor out, Tensor lse, Tensor q_src, Tensor kv_src, int64_t kv0,
                             Tensor q_pos, Tensor k_pos, int64_t n_head, int64_t n_kv_head,
                             float scale = 0.0f);
// The block's backward against the final output `out` and `lse` (merged over every block) and
// their gradient dout (B,Tq,H,D): dq_src (q_src's shape) += the queries' gradient in heads [0,H),
// dkv_src (kv_src's shape) += the keys' and values' in heads [kv0, kv0+2KV).
void attention_block_backward(Tensor dq_src, Tensor dkv_src, Tensor dout, Tensor q_src,
                              Tensor kv_src, int64_t kv0, Tensor out, Tensor lse, Tensor q_pos,
                              Tensor k_pos, int64_t n_head, int64_t n_kv_head, float scale = 0.0f);
// Merges a block's result into the running one by their log-sum-exp: out (B,T,H,D), lse (B,H,T)
// become the softmax over both key sets (part_out, part_lse: the block's). -inf lse adds nothing.
void attention_merge(Tensor out, Tensor lse, Tensor part_out, Tensor part_lse);
// Heads [dst_head, dst_head+n) of dst (B,T,Wd,D) := heads [src_head, src_head+n) of src
// (B',T',Ws,D) with B*T == B'*T' (packing K/V out of a qkv tensor and back).
void copy_heads(Tensor dst, int64_t dst_head, Tensor src, int64_t src_head, int64_t n_heads);

// Runs of columns between two matrices, for assembling attention heads out of projections and
// back (multi-head latent attention): for every row r and block j < n, the `width` elements
// dst[r, dst_first + j*dst_stride + i] := (add: +=) src[r, src_first + j*src_stride + i], i <
// width. A stride may be 0: one source block copied into every head (src_stride 0), or every
// block summed into one (dst_stride 0, add only; in increasing j, so the sum is deterministic).
struct ColumnBlocks {
  int64_t n = 1, width = 0;
  int64_t dst_first = 0, dst_stride = 0;
  int64_t src_first = 0, src_stride = 0;
};
// dst (rows, Wd), src (rows, Ws): 2-D views of the same row count.
void copy_blocks(Tensor dst, Tensor src, const ColumnBlocks& b, bool add = false);

// ---- mixture of experts (docs/model.md, "Mixture of experts") ---------------------------------
// Dims: E experts, k experts per token, S sequences of T tokens (N = S*T rows), M = N*k permuted
// rows (those past the dispatch's offsets[E] unused). Index tensors are i32; router math is f32.
// scores (N,E) = softmax(logits (N,E)) per row (sigmoid: elementwise); idx (N,k) the top k
// scores (+ bias (E), optional: aux-loss-free balancing, for selection only), decreasing, ties to
// the lower expert, from the experts of the topk_group of `groups` groups (E/groups consecutive
// experts each) whose two largest keys sum highest (group-limited routing; topk_group = groups:
// every expert); weights (N,k) their scores (/ their sum when `normalize`) times `scale`.
struct MoeRouting {
  bool sigmoid = false, normalize = true;
  int64_t groups = 1, topk_group = 1;
  float scale = 1.0f;
};
void moe_route(Tensor scores, Tensor idx, Tensor weights, Tensor logits, const MoeRouting& r,
               Tensor bias = {});
// The dispatch of idx (N,k) over sequences of seq_len tokens: counts (S,E) assignments per
// sequence and expert (before dropping); offsets (E+1) each expert's run of permuted rows;
// assign (M) the assignment t*k+j of each permuted row (-1 unused); slot (N,k) the permuted row
// of each assignment (-1 dropped). capacity > 0 keeps, of each (sequence, expert), the first
// `capacity` assignments ranked by (j, t). rank_base (S,E,k,H) i32, optional (context
// parallelism): the seq_len tokens are H equal runs of a longer sequence, in local order, and
// rank_base[s,e,j,h] is the whole sequence's count of e's assignments ranked before run h's first
// (j-th choice) one; each then ranks that plus its index among run h's in t order.
void moe_dispatch(Tensor counts, Tensor offsets, Tensor assign, Tensor slot, Tensor idx,
                  int64_t seq_len, int64_t capacity, Tensor rank_base = {});
// out (M,C) rows := in (N,C) rows in expert order (times the assignment's weight when weights
// (N,k) is given: the combine's backward). Unused rows are left as they are.
void moe_permute(Tensor out, Tensor in, Tensor assign, Tensor weights = {});
// out (N,C) := per token the sum of its permuted rows of in (M,C) (times weights (N,k) when
// given: the combine), dropped assignments adding nothing.
void moe_unpermute(Tensor out, Tensor in, Tensor slot, Tensor weights = {});
// dweights (N,k) := <dout (N,C) row t, in (M,C) row slot[t,j]> (0 for a dropped one).
void moe_weights_backward(Tensor dweights, Tensor dout, Tensor in, Tensor slot);
// dlogits (N,E) := the gradient of the router's logits: through moe_route's weights (routed as
// r says) from dweights (N,k), the aux loss's aux_scale * counts[s,e] per unit of q[t,e], and the
// z-loss's z_scale * lse * softmax. counts (S,E) may be absent when aux_scale is 0.
void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor logits, Tensor idx, Tensor counts,
                        const MoeRouting& r, float aux_scale, float z_scale);
// aux (S) = E * sum_e counts[s,e]/(T k) * mean_t q[t,e]; zsq (N) = logsumexp(logits row)^2.
void moe_route_losses(Tensor aux, Tensor zsq, Tensor logits, Tensor counts, int64_t k,
                      bool sigmoid);
// Grouped GEMM over G = offsets.size() - 1 groups of rows: rows [offsets[g], offsets[g+1]) of
// out (M,OC) := those rows of inp (M,IC) @ weight[w(g)]^T, weight (W,OC,IC), w(g) = weight_of[g]
// (several groups may share a weight: expert parallelism's rows from each peer), or g without
// weight_of (then G = W). Host values. One call for all groups (CPU: one OpenMP region; CUDA:
// one grouped cuBLAS call). `operands` as for linear_forward (the CPU multiplies bf16 operands
// through oneDNN where it can, a group at a time; CUDA 16-bit operands on tensor cores).
void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, std::span<const int64_t> offsets,
                            std::span<const int64_t> weight_of = {}, DType operands = DType::f32);
// dinp (M,IC) := dout (M,OC) @ weight[w(g)] per group's rows (optional); dweight (W,OC,IC) +=
// dout^T @ inp over each weight's groups (optional).
void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                             std::span<const int64_t> offsets,
                             std::span<const int64_t> weight_of = {}, DType operands = DType::f32);

// ---- elementwise ------------------------------------------------------------------------------
void add(Tensor out, Tensor a, Tensor b);  // out = a + b (out may alias a or b)
void add_inplace(Tensor dst, Tensor src);  // dst += src
void scale_inplace(Tensor x, float s);     // x *= s
void add_bias(Tensor x, Tensor bias);      // x (..., C) += bias (C) on every row
void copy(Tensor dst, Tensor src);         // same shape and dtype, any devices
void fill_zero(Tensor x);

// Dropout with a counter-based mask: element i (its global index i = global_offset + local
// index) is kept with probability 1-p and scaled by 1/(1-p). The mask is a pure function of
// (seed, stream, i), recomputed in backward; nothing is stored.
void dropout_forward(Tensor out, Tensor inp, float p, uint64_t seed, uint64_t stream,
                     int64_t global_offset);
void dropout_backward(Tensor dinp, Tensor dout, float p, uint64_t seed, uint64_t stream,
                      int64_t global_offset);

// ---- loss -------------------------------------------------------------------------------------
// Fused softmax + cross-entropy over V, one pass per row, never writing probabilities:
// losses (N) = logsumexp(logits) - logits[target]; dlogits (N,V) = (softmax - onehot) * dloss.
// dlogits may alias logits (the gradient overwrites them). A target < 0 is ignored (loss 0,
// gradient 0). Returns nothing; read losses to get the mean.
void softmax_cross_entropy(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                           float dloss);

// The same loss over a vocabulary shard, split at its reductions so that no rank ever holds the
// full-vocabulary logits (Megatron's vocab-parallel cross-entropy). logits (N,Vl) hold vocabulary
// [vocab_start, vocab_start + Vl) of vocab_size. Between the calls the caller reduces over the
// shards: max with a max, sums with a sum.
// 1. max (N) = row max of the shard. Checks every target < vocab_size.
void cross_entropy_shard_max(Tensor max, Tensor logits, Tensor targets, int64_t vocab_size);
// 2. sums (2,N): [0] = sum exp(logits - max) over the shard, [1] = logits[target] when the shard
//    holds the target, else 0 (max: the reduced row max).
void cross_entropy_shard_sums(Tensor sums, Tensor logits, Tensor max, Tensor targets,
                              int64_t vocab_start);
// 3. losses (N) = max + log(sums[0]) - sums[1]; dlogits (N,Vl) = (softmax - onehot) * dloss,
//    optional, may alias logits. A target < 0 is ignored (loss 0, gradient 0).
void cross_entropy_shard_finish(Tensor losses, Tensor dlogits, Tensor logits, Tensor max,
                                Tensor sums, Tensor targets, int64_t vocab_start, float dloss);

// ---- optimizer and reductions -----------------------------------------------------------------
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // g = grad * grad_scale: clipping and loss unscaling, fused
};
// param, grad, m, v: same shape, f32. Decoupled weight decay: p -= lr * (wd * p +
// mhat/(sqrt(vhat)+eps)).
void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& hp);
// Sum of squares of x in double precision (global norms sum these over tensors and ranks).
double sum_squares(Tensor x);
// True if any element is inf or nan.
bool has_nonfinite(Tensor x);

// Multi-tensor versions (apex's multi_tensor_apply, PyTorch's fused _foreach AdamW): one call
// over a list of tensors instead of one per tensor. On the CPU one parallel region covers the
// whole list; on CUDA a launch covers many tensors and the reductions read back once per list.
// Any tensor may be empty. All tensors of a list on one device.
struct AdamWTensor {
  Tensor param, grad, m, v;  // same shape, f32
  bool decay = true;         // hp.weight_decay applies; false: no weight decay (biases, norms)
};
// adamw_update of every entry; on the CPU bitwise what the per-tensor op gives.
void adamw_update(std::span<const AdamWTensor> ts, const AdamWParams& hp);
// The sum over the list of each tensor's sum of squares, in double, in a fixed order: on the
// CPU bitwise the per-tensor results added in list order (for a given thread count).
double sum_squares(std::span<const Tensor> xs);
// True if any element of any tensor is inf or nan.
bool has_nonfinite(std::span<const Tensor> xs);

// ---- precision --------------------------------------------------------------------------------
// Rounds f32 values in place to the nearest value representable in `target` (bf16: round to
// nearest even on the top 16 bits; f16: IEEE half incl. overflow to inf and subnormals). Used to
// emulate 16-bit storage on the fp32 CPU backend.
void round_to(Tensor x, DType target);
// Converts between f32, bf16 and f16 storage (same shape).
void convert(Tensor dst, Tensor src);

// ---- FP8 (train.fp8, emulated; kernels/fp8_math.h) --------------------------------------------
// The OCP formats: E4M3 (largest 448) and E5M2 (largest 57344).
enum class Fp8Format : uint8_t { e4m3, e5m2 };
// in (M,K) is cut into tiles of tile_rows x tile_cols (each >= 1; a tile wider than the tensor
// covers it; edge tiles partial). amax (ceil(M/tile_rows), ceil(K/tile_cols)) f32 = the largest
// |value| of each tile.
void fp8_amax(Tensor amax, Tensor in, int64_t tile_rows, int64_t tile_cols);
// out (M,K) f32 = in quantised to `fmt` with its tile's scale s = amax / fmt's largest value and
// dequantised: s * fp8(in / s), round to nearest even, saturating; 0 in a tile whose amax is 0.
// What an FP8 GEMM with fp32 accumulation multiplies; amax from fp8_amax (possibly reduced over
// ranks first). out may not alias in.
void fp8_quantize(Tensor out, Tensor in, Tensor amax, int64_t tile_rows, int64_t tile_cols,
                  Fp8Format fmt);

// ---- integer block quantisation (ZeRO++'s qwZ and qgZ; kernels/int_quant_math.h) ------------
// Each row of in (S,L) f32/bf16/f16 is cut into blocks of `block` (>= 1) values, the last
// partial; packed (S,W) i32, W = int_packed_words(L, block, bits), holds per block its scale
// amax/Q and its codes rne(v / scale) in [-Q, Q] of `bits` bits (8: Q = 127, 4 to a word;
// 4: Q = 7, 8 to a word), the layout of kernels/int_quant_math.h.
int64_t int_packed_words(int64_t n, int64_t block, int bits);
void quantize_int(Tensor packed, Tensor in, int64_t block, int bits);
// out (S,L) f32/bf16/f16 = scale * code of each value of packed (S,W) (rounded to out's type).
void dequantize_int(Tensor out, Tensor packed, int64_t block, int bits);

// ---- initialisation ---------------------------------------------------------------------------
// x[i] = std * normal(key(seed, stream, global_offset + i)): depends only on the seed, the
// parameter's stream (hash of its global name) and the global index, never on the layout.
// A column shard of a 2-D tensor: x (R,W) and global_row_stride = the global row length; element
// (r,w) takes index global_offset + r * global_row_stride + w (0: x is one contiguous run).
void init_normal(Tensor x, float std, uint64_t seed, uint64_t stream, int64_t global_offset = 0,
                 int64_t global_row_stride = 0);
void fill(Tensor x, float value);

// ---- recording (llmtrain plan) -----------------------------------------------------------------
// While a Recording lives, the ops called on its thread check their arguments as always but run
// no kernel (so a model built on the meta device can run a step), and count the bytes their
// tensors move at their storage type: an input once, an output once, an argument read and
// written twice, an embedding table as the rows its tokens touch. Matmuls and the attention core
// (linear, grouped linear, attention blocks) are counted apart: the cost model times them by
// their FLOPs, everything else by these bytes. So is round_to, the rounding of an fp32-stored
// tensor to 16-bit values (16-bit storage emulated), which a kernel storing 16 bits does as it
// writes.
struct OpTally {
  double matmul_bytes = 0, other_bytes = 0, rounding_bytes = 0;
  int64_t ops = 0;                      // op calls
  std::map<std::string, double> bytes;  // by op name, the other ops'
};
class Recording {
 public:
  explicit Recording(OpTally& tally);
  ~Recording();
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  // True while a Recording lives on this thread.
  static bool active();

 private:
  OpTally* outer_;
};

}  // namespace llmt::ops
