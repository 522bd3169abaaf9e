// The tensor-parallel layers over the regions of tensor_parallel.h (parallel_layers.h). Every
// collective here runs on the tp group the TpLayers carries; with tp = 1 only the ops run.
#include "engine/parallel/parallel_layers.h"

#include <algorithm>

#include "kernels/ops.h"

namespace llmt {

namespace {

// x quantised into the model's scratch (TpLayers); `sharded`: x is this rank's part of a tensor
// split over tp.
Tensor fp8_input(const TpLayers& t, Tensor x, Fp8Tiles tiles, bool grad, bool sharded,
                 Tensor into) {
  return fp8_quantized(t.fp8, x, tiles, grad, into, t.fp8_amax,
                       sharded && t.parallel() ? t.tp.comm : nullptr);
}

// The weight gradient from FP8 operands (both tiled down the tokens); the bias gradient from the
// unquantised output gradient.
void fp8_backward_weight(const TpLayers& t, Tensor dw, Tensor db, Tensor dy, bool dy_sharded,
                         Tensor x, bool x_sharded) {
  ops::linear_backward(Tensor(), dw, Tensor(),
                       fp8_input(t, dy, Fp8Tiles::cols, true, dy_sharded, t.fp8_b),
                       fp8_input(t, x, Fp8Tiles::cols, false, x_sharded, t.fp8_a), Tensor());
  if (db.defined()) ops::linear_backward(Tensor(), Tensor(), db, dy, Tensor(), Tensor());
}

}  // namespace

Tensor fp8_quantized(const Fp8Recipe& r, Tensor x, Fp8Tiles tiles, bool grad, Tensor values,
                     Tensor amax, Communicator* amax_group) {
  const int64_t K = x.shape[x.ndim() - 1], M = K > 0 ? x.numel() / K : 0;
  int64_t tr = std::max<int64_t>(M, 1), tc = std::max<int64_t>(K, 1);  // tensorwise: one tile
  const bool blockwise = r.scaling == Fp8Scaling::blockwise;
  if (blockwise) {
    tr = tiles == Fp8Tiles::rows ? 1 : r.block;
    tc = tiles == Fp8Tiles::cols ? 1 : r.block;
  }
  const int64_t TR = (M + tr - 1) / tr, TC = (K + tc - 1) / tc;
  const Tensor tile_max = amax.rows(0, TR * TC).view({TR, TC});
  ops::fp8_amax(tile_max, x.view({M, K}), tr, tc);
  if (!blockwise && amax_group != nullptr) amax_group->all_reduce(tile_max, ReduceOp::max).wait();
  const Tensor out = values.rows(0, M * K);
  ops::fp8_quantize(out.view({M, K}), x.view({M, K}), tile_max, tr, tc,
                    grad && !blockwise ? ops::Fp8Format::e5m2 : ops::Fp8Format::e4m3);
  return out.view(x.shape);
}

Tensor fp8_quantized_groups(const Fp8Recipe& r, Tensor x, std::span<const int64_t> offsets,
                            Fp8Tiles tiles, bool grad, Tensor values, Tensor amax) {
  const int64_t K = x.shape[x.ndim() - 1];
  if (r.scaling == Fp8Scaling::blockwise && tiles == Fp8Tiles::rows) {
    const int64_t M = offsets.back();
    fp8_quantized(r, x.rows(0, M), tiles, grad, values, amax);
  } else {
    for (size_t g = 0; g + 1 < offsets.size(); ++g) {
      if (offsets[g + 1] == offsets[g]) continue;
      fp8_quantized(r, x.rows(offsets[g], offsets[g + 1]), tiles, grad,
                    values.rows(offsets[g] * K, offsets[g + 1] * K), amax);
    }
  }
  return values.rows(0, x.numel()).view(x.shape);
}

Tensor fp8_quantized_stack(const Fp8Recipe& r, Tensor w, Tensor values, Tensor amax) {
  const int64_t W = w.shape[0], OC = w.shape[1], IC = w.shape[2];
  for (int64_t e = 0; e < W; ++e)
    fp8_quantized(r, w.rows(e, e + 1).view({OC, IC}), Fp8Tiles::weight, false,
                  values.rows(e * OC * IC, (e + 1) * OC * IC), amax);
  return values.rows(0, w.numel()).view(w.shape);
}

int64_t fp8_amax_size(const Fp8Recipe& r, int64_t rows, int64_t width) {
  if (r.scaling != Fp8Scaling::blockwise) return 1;
  const int64_t b = r.block;
  return std::max({rows * ((width + b - 1) / b), (rows + b - 1) / b * width,
                   ((rows + b - 1) / b) * ((width + b - 1) / b)});
}

void TpLayers::round(Tensor x) const {
  // A tensor stored in 16 bits was rounded by the op that wrote it.
  if (compute != DType::f32 && x.dtype == DType::f32) ops::round_to(x, compute);
}

Tensor ColumnParallelLinear::input(Tensor x, Tensor into) const {
  if (!t_.sp()) return x;  // copy_to_region forward: identity
  Tensor full = into.defined() ? into : t_.gathered;
  tp::gather_from_sequence_forward(*t_.tp.comm, full, x);
  return full;
}

void ColumnParallelLinear::forward(Tensor y, Tensor x_full, Tensor w, Tensor b) const {
  if (fp8_ && t_.fp8.on()) {
    ops::linear_forward(y, fp8_input(t_, x_full, Fp8Tiles::rows, false, false, t_.fp8_a),
                        fp8_input(t_, w, Fp8Tiles::weight, false, t_.parallel(), t_.fp8_w), b);
    return;
  }
  ops::linear_forward(y, x_full, w, b, t_.compute);
}

Tensor ColumnParallelLinear::backward_input(Tensor dx_partial, Tensor dy, Tensor w,
                                            Tensor into) const {
  partial_input_grad(dx_partial, dy, w);
  return reduce_input_grad(dx_partial, into);
}

void ColumnParallelLinear::partial_input_grad(Tensor dx_partial, Tensor dy, Tensor w) const {
  if (fp8_ && t_.fp8.on()) {
    ops::linear_backward(dx_partial, Tensor(), Tensor(),
                         fp8_input(t_, dy, Fp8Tiles::rows, true, t_.parallel(), t_.fp8_b), Tensor(),
                         fp8_input(t_, w, Fp8Tiles::weight, false, t_.parallel(), t_.fp8_w));
  } else {
    ops::linear_backward(dx_partial, Tensor(), Tensor(), dy, Tensor(), w, t_.compute);
  }
}

Tensor ColumnParallelLinear::reduce_input_grad(Tensor dx_partial, Tensor into) const {
  // The partial sums are reduced in fp32 and the sum rounded once, as one rank rounds the whole
  // GEMM's output (rounding each rank's partial first drifts several times further from the
  // single-rank run: tests/mpi/precision_tp.py).
  Tensor dx = dx_partial;
  if (t_.sp()) {
    dx = into.defined() ? into : t_.shard;
    tp::gather_from_sequence_backward(*t_.tp.comm, dx, dx_partial);
  } else if (t_.parallel()) {
    tp::copy_to_region_backward(*t_.tp.comm, dx_partial);
  }
  t_.round(dx);
  return dx;
}

void ColumnParallelLinear::backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x_full) const {
  if (fp8_ && t_.fp8.on()) return fp8_backward_weight(t_, dw, db, dy, t_.parallel(), x_full, false);
  ops::linear_backward(Tensor(), dw, db, dy, x_full, Tensor(), t_.compute);
}

Tensor RowParallelLinear::forward(Tensor x, Tensor w, Tensor b) const {
  // Under tp the bias is added once, after the reduction.
  if (fp8_ && t_.fp8.on()) {
    ops::linear_forward(t_.full, fp8_input(t_, x, Fp8Tiles::rows, false, t_.parallel(), t_.fp8_a),
                        fp8_input(t_, w, Fp8Tiles::weight, false, t_.parallel(), t_.fp8_w),
                        t_.parallel() ? Tensor() : b);
  } else {
    ops::linear_forward(t_.full, x, w, t_.parallel() ? Tensor() : b, t_.compute);
  }
  if (!t_.parallel()) return t_.full;
  Tensor out = t_.full;
  if (t_.sp()) {
    tp::reduce_scatter_to_sequence_forward(*t_.tp.comm, t_.shard, t_.full);
    out = t_.shard;
  } else {
    tp::reduce_from_region_forward(*t_.tp.comm, t_.full);
  }
  if (b.defined()) ops::add_bias(out, b);
  return out;
}

Tensor RowParallelLinear::backward_input(Tensor dx, Tensor dy, Tensor w) const {
  Tensor dy_full = dy;  // reduce_from_region backward: identity
  if (t_.sp()) {
    tp::reduce_scatter_to_sequence_backward(*t_.tp.comm, t_.full, dy);
    dy_full = t_.full;
  }
  if (fp8_ && t_.fp8.on()) {
    ops::linear_backward(dx, Tensor(), Tensor(),
                         fp8_input(t_, dy_full, Fp8Tiles::rows, true, false, t_.fp8_b), Tensor(),
                         fp8_input(t_, w, Fp8Tiles::weight, false, t_.parallel(), t_.fp8_w));
  } else {
    ops::linear_backward(dx, Tensor(), Tensor(), dy_full, Tensor(), w, t_.compute);
  }
  return dy_full;
}

void RowParallelLinear::backward_weight(Tensor dw, Tensor db, Tensor dy_full, Tensor x) const {
  if (fp8_ && t_.fp8.on()) return fp8_backward_weight(t_, dw, db, dy_full, false, x, t_.parallel());
  ops::linear_backward(Tensor(), dw, db, dy_full, x, Tensor(), t_.compute);
}

void VocabParallelEmbedding::forward(Tensor x, Tensor tokens, Tensor wte, Tensor wpe,
                                     Tensor positions) const {
  const int64_t B = tokens.shape[0], T = tokens.shape[1], C = x.shape[x.ndim() - 1];
  if (!t_.parallel()) {
    ops::embedding_forward(x.view({B, T, C}), tokens, wte, wpe, 0, 0, 0, positions);
    return;
  }
  Tensor full = t_.sp() ? t_.full : x;
  ops::embedding_forward(full.view({B, T, C}), tokens, wte, t_.tp.rank() == 0 ? wpe : Tensor(), 0,
                         vocab_start(), vocab_size_, positions);
  if (t_.sp())
    tp::reduce_scatter_to_sequence_forward(*t_.tp.comm, x, full);
  else
    tp::reduce_from_region_forward(*t_.tp.comm, x);
}

void VocabParallelEmbedding::backward_weight(Tensor dwte, Tensor dwpe, Tensor dx, Tensor tokens,
                                             Tensor positions) const {
  const int64_t B = tokens.shape[0], T = tokens.shape[1], C = dx.shape[dx.ndim() - 1];
  if (!t_.parallel()) {
    ops::embedding_backward(dwte, dwpe, dx.view({B, T, C}), tokens, 0, 0, 0, positions);
    return;
  }
  // Every rank has the whole (gathered, under SP) embedding gradient: its vocabulary rows go to
  // its wte shard, and all of it to wpe, whose gradient is thus the same on every rank.
  Tensor d = dx;
  if (t_.sp()) {
    tp::reduce_scatter_to_sequence_backward(*t_.tp.comm, t_.full, dx);
    d = t_.full;
  }
  ops::embedding_backward(dwte, dwpe, d.view({B, T, C}), tokens, 0, vocab_start(), vocab_size_,
                          positions);
}

void VocabParallelCrossEntropy::forward_backward(Tensor losses, Tensor logits, Tensor targets,
                                                 float dloss) const {
  if (!t_.parallel()) {
    ops::softmax_cross_entropy(losses, logits, logits, targets, dloss);
    return;
  }
  const int64_t vocab_start = t_.tp.rank() * (vocab_size_ / t_.tp.size());
  tp::vocab_parallel_cross_entropy(*t_.tp.comm, losses, logits, targets, vocab_start, vocab_size_,
                                   dloss, max_, sums_);
}

void sum_sequence_partials(const TpLayers& t, Tensor partial) {
  if (t.sp()) tp::copy_to_region_backward(*t.tp.comm, partial);
}

}  // namespace llmt
