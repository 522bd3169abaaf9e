// The tensor-parallel layers (Megatron-Core tensor_parallel/layers.py): column- and row-parallel
// linears, the vocab-parallel embedding and cross-entropy, and the sequence-parallel norm
// gradient, each owning its communication regions (tensor_parallel.h), so a model built from
// them has no `if (sequence_parallel)` of its own. With tp = 1 every region is the identity.
//
// Dims: N = B*T tokens of a micro-batch; R rows of the residual stream this rank holds (N, or
// N/tp under sequence parallelism, rows [row0, row0 + R)); IC/OC in/out features of a linear as
// this rank holds them (a column-parallel linear's OC and a row-parallel linear's IC are the
// global ones / tp); C the model width, which every region input and output has.
//
// Backward is split as the zero-bubble schedules need it: backward_input assigns the input
// gradient and returns what backward_weight reads (the output gradient a linear's dW needs);
// backward_weight adds into the weight gradients. Rounding to the compute type (16-bit emulation)
// is the caller's, except for a column-parallel linear's input gradient, which is rounded after
// its reduction.
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "engine/parallel/tensor_parallel.h"

namespace llmt {

// train.fp8 (docs/model.md, "FP8 GEMM inputs"): the transformer layers' linears multiply FP8 inputs
// with fp32 accumulation, emulated: each GEMM input is quantised and dequantised into fp32 scratch
// (ops::fp8_quantize), then multiplied by the fp32 GEMM. `blockwise` (DeepSeek-V3 §3.3): E4M3
// everywhere, activations and output gradients in 1 x block tiles along the GEMM's reduction
// dim (block x 1 for the weight gradient, whose reduction dim is the tokens), weights in
// block x block squares. `tensorwise`: one scale per tensor (its amax taken over tp where the
// tensor is split over tp), E4M3 for activations and weights, E5M2 for gradients (Transformer
// Engine's hybrid format). The experts' grouped GEMMs quantise each run of rows and each expert
// apart (fp8_quantized_groups, fp8_quantized_stack). The head, the router and attention stay in
// the compute type.
enum class Fp8Scaling : uint8_t { none, tensorwise, blockwise };
struct Fp8Recipe {
  Fp8Scaling scaling = Fp8Scaling::none;
  int64_t block = 128;  // tile side under blockwise
  bool on() const { return scaling != Fp8Scaling::none; }
};

// How an FP8 GEMM input is tiled under blockwise scaling.
enum class Fp8Tiles : uint8_t {
  rows,    // 1 x block: the left operand of a forward or input-gradient GEMM (reduced along K)
  cols,    // block x 1: the operands of a weight gradient (reduced over the tokens)
  weight,  // block x block
};

// x (..., K) quantised and dequantised as recipe r says (ops::fp8_quantize) into the 1-D f32
// scratch `values`, returned in x's shape; `amax` (1-D f32) holds the tiles' maxima meanwhile
// (fp8_amax_size). `grad`: an output gradient (E5M2 under tensorwise). `amax_group`: under
// tensorwise, the group a split tensor's amax is the max over (tp), or null.
Tensor fp8_quantized(const Fp8Recipe& r, Tensor x, Fp8Tiles tiles, bool grad, Tensor values,
                     Tensor amax, Communicator* amax_group = nullptr);
// The experts' grouped GEMM inputs: x (M,K) whose rows [offsets[g], offsets[g+1]) are group g's
// (an expert's rows, under ep from one peer), each group quantised apart (its own column tiles,
// its own tensorwise scale; row tiles never span two rows anyway). Returns x's shape.
Tensor fp8_quantized_groups(const Fp8Recipe& r, Tensor x, std::span<const int64_t> offsets,
                            Fp8Tiles tiles, bool grad, Tensor values, Tensor amax);
// A stack of expert weights (W,OC,IC), each expert's matrix quantised apart.
Tensor fp8_quantized_stack(const Fp8Recipe& r, Tensor w, Tensor values, Tensor amax);
// The amax scratch (floats) the quantisation of an input of `rows` x `width` needs, and of a
// weight of at most that many rows and columns.
int64_t fp8_amax_size(const Fp8Recipe& r, int64_t rows, int64_t width);

// The tp setting of one model and the buffers its regions share: `gathered` (N,C) holds a
// column-parallel input gathered over the sequence, `shard` (R,C) a reduce-scattered output or
// input gradient, `full` (N,C) a row-parallel linear's partial output or its gathered output
// gradient. The model allocates them once; a region's result is valid until the next region
// that writes the same buffer.
struct TpLayers {
  TensorParallel tp;
  DType compute = DType::f32;
  int64_t N = 0, R = 0, row0 = 0;
  Tensor gathered, shard, full;
  // train.fp8 and its scratch (1-D f32, allocated by the model when fp8.on()): the quantised
  // activation or input gradient (fp8_a) and output gradient (fp8_b) of one GEMM, (N, or the
  // experts' routed rows) x the widest layer weight's features each; its weight (fp8_w), the
  // largest layer weight or expert stack; the tiles' amax (fp8_amax).
  Fp8Recipe fp8;
  Tensor fp8_a, fp8_b, fp8_w, fp8_amax;

  bool parallel() const { return tp.size() > 1; }
  bool sp() const { return tp.sequence_parallel && tp.size() > 1; }
  // Rounds x in place to the compute type (no-op for f32, and for x stored in 16 bits).
  void round(Tensor x) const;
};

// Y = X W^T + b with W (OC, IC) sharded on its output rows over tp (Shard(0)). Its input region
// (input()) is separate from the GEMMs, so a caller may keep the gathered input (the head does).
// `fp8`: its GEMMs take FP8 inputs when t.fp8 is on (the layers' linears; not the head).
class ColumnParallelLinear {
 public:
  explicit ColumnParallelLinear(const TpLayers& t, bool fp8 = false) : t_(t), fp8_(fp8) {}
  // The (N,IC) input of x (R,IC): x itself, or gathered over tp into `into` (default t.gathered)
  // under SP.
  Tensor input(Tensor x, Tensor into = {}) const;
  // Where to compute the (R,IC) rows whose input() is to land in `into` (N,IC): `into` itself,
  // or under SP t.shard (then gathered into `into`).
  Tensor input_rows(Tensor into) const { return t_.sp() ? t_.shard : into; }
  // y (N,OC) = x_full @ w^T + b; x_full (N,IC) from input().
  void forward(Tensor y, Tensor x_full, Tensor w, Tensor b) const;
  // dx (R,IC): dx_partial (N,IC) = dy (N,OC) @ w, summed over tp in fp32 (all-reduce in place,
  // or reduce-scattered into `into` (R,IC), default t.shard, under SP), then rounded to the
  // compute type once. Returns the view holding dx.
  Tensor backward_input(Tensor dx_partial, Tensor dy, Tensor w, Tensor into = {}) const;
  // backward_input's two halves, for a caller that sums several partial input gradients before
  // one reduction (the latent cp ring, block by block): dx_partial (N,IC) = dy @ w on this rank;
  // and its sum over tp, rounded once.
  void partial_input_grad(Tensor dx_partial, Tensor dy, Tensor w) const;
  Tensor reduce_input_grad(Tensor dx_partial, Tensor into = {}) const;
  // dw (OC,IC) += dy^T x_full; db (OC) += sum of dy's rows (optional).
  void backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x_full) const;

 private:
  const TpLayers& t_;
  bool fp8_;
};

// Y = X W^T + b with W (OC, IC) sharded on its input columns over tp (Shard(1)); b replicated,
// added once after the reduction. `fp8` as for ColumnParallelLinear.
class RowParallelLinear {
 public:
  explicit RowParallelLinear(const TpLayers& t, bool fp8 = false) : t_(t), fp8_(fp8) {}
  // y (R,OC) = sum over tp of x (N,IC) @ w^T (all-reduce, or reduce-scatter under SP), + b.
  // The product goes to t.full; returns the view holding y (t.full, or t.shard under SP).
  Tensor forward(Tensor x, Tensor w, Tensor b) const;
  // dx (N,IC) = gather(dy (R,OC)) @ w. Returns the gathered output gradient (N,OC): dy itself,
  // or t.full under SP, which backward_weight reads.
  Tensor backward_input(Tensor dx, Tensor dy, Tensor w) const;
  // dw (OC,IC) += dy_full^T x; db (OC) += sum of dy_full's rows (the same on every tp rank).
  void backward_weight(Tensor dw, Tensor db, Tensor dy_full, Tensor x) const;

 private:
  const TpLayers& t_;
  bool fp8_;
};

// Token (+ learned position) embedding with wte (V/tp, C) sharded over the vocabulary: each rank
// looks up its rows (zeros elsewhere), tp rank 0 adds the positions, the sum over tp is the full
// embedding (all-reduce, or reduce-scatter to this rank's rows under SP).
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(const TpLayers& t, int64_t vocab_size) : t_(t), vocab_size_(vocab_size) {}
  // x (R,C) = embedding of tokens (B,T); wte (V/tp, C), wpe (P,C) optional, read at row t's
  // position: positions[t] (context parallelism: (T) i32 global positions) or t.
  void forward(Tensor x, Tensor tokens, Tensor wte, Tensor wpe, Tensor positions = {}) const;
  // dwte += its vocabulary rows' gradients, dwpe += every row's (the same on every tp rank);
  // dx (R,C) the gradient of forward's x.
  void backward_weight(Tensor dwte, Tensor dwpe, Tensor dx, Tensor tokens,
                       Tensor positions = {}) const;

 private:
  int64_t vocab_start() const { return t_.tp.rank() * (vocab_size_ / t_.tp.size()); }
  const TpLayers& t_;
  int64_t vocab_size_;
};

// Softmax cross-entropy over logits (N, V/tp) sharded over the vocabulary (Megatron
// cross_entropy.py): losses (N) the full loss per row on every rank; the logits are overwritten
// by d(dloss * loss)/d logits. max (N) and sums (2,N) are scratch (tp > 1 only).
class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(const TpLayers& t, int64_t vocab_size, Tensor max, Tensor sums)
      : t_(t), vocab_size_(vocab_size), max_(max), sums_(sums) {}
  void forward_backward(Tensor losses, Tensor logits, Tensor targets, float dloss) const;

 private:
  const TpLayers& t_;
  int64_t vocab_size_;
  Tensor max_, sums_;
};

// Under SP a norm sees only this rank's rows, so its weight (and bias) gradients are partial sums
// over the sequence: completed by an all-reduce over tp (copy_to_region backward). Without SP
// every tp rank has all rows and the whole gradient: nothing to do.
void sum_sequence_partials(const TpLayers& t, Tensor partial);

}  // namespace llmt
