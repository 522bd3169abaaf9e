// The CUDA kernels behind kernels/ops.h, on raw device pointers, with the same signatures and
// semantics as kernels/cpu/cpu_ops.h (the CPU kernels are the numerical reference): ops.cpp checks
// shapes, dtypes and devices and calls these for CUDA tensors. Plain C++: no CUDA type appears
// here. Every launcher runs on the process's compute stream (engine/core/cuda) and returns
// without waiting, except where it must read a result or an error back (noted below: token and
// target range checks, sum_squares, has_nonfinite, copies touching host memory).
//
// Dims: B batch, T sequence, C channels, V vocabulary, N rows (B*T), P position-table rows,
// IC/OC in/out features, F ffn hidden, HT heads in a rope tensor, D head dim, n element count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/core/dtype.h"

namespace llmt::cuda {

// ---- embedding.cu -------------------------------------------------------------------------------
// wte (Vl,C) holds vocabulary rows [vocab_start, vocab_start + Vl) of V (all of them: 0, V).
// out (B,T,C) = wte[tokens (B,T) - vocab_start], 0 for tokens outside the shard, + wpe (P,C)
// [pos_offset + t] (wpe may be null). Throws if a token id is outside [0, V).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t V, int64_t pos_offset,
                       int64_t vocab_start, int64_t Vl);
// dwte (Vl,C) += rows of the shard's tokens, dwpe (P,C) += every row (may be null); dout (B,T,C).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t V, int64_t pos_offset,
                        int64_t vocab_start, int64_t Vl);

// ---- norm.cu ------------------------------------------------------------------------------------
// out (N,C), mean (N), rstd (N); inp (N,C), weight (C), bias (C) may be null.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
// dinp (N,C) =; dweight (C) +=; dbias (C) += (may be null).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int64_t C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C);

// ---- linear.cu ----------------------------------------------------------------------------------
// out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias (OC) (may be null).
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t IC, int64_t OC);
// dinp (N,IC) = dout @ weight (skipped when null); dweight (OC,IC) += dout^T @ inp (skipped when
// null); dbias (OC) += column sums of dout (may be null).
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t IC, int64_t OC);

// ---- activation.cu ------------------------------------------------------------------------------
// GELU (tanh) over n elements; out may alias inp.
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
// inp (N,2F) = [gate | up], out (N,F) = silu(gate) * up; dinp (N,2F) =.
void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F);
void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F);

// ---- rope.cu ------------------------------------------------------------------------------------
// In place on x (B,T,HT,D), heads [0, n_rot): forward rotates by +angle, backward by -angle.
void rope_forward(float* x, int64_t B, int64_t T, int64_t HT, int64_t D, int64_t n_rot,
                  int64_t pos_offset, float theta);
void rope_backward(float* dx, int64_t B, int64_t T, int64_t HT, int64_t D, int64_t n_rot,
                   int64_t pos_offset, float theta);

// ---- elementwise.cu -----------------------------------------------------------------------------
void add(float* out, const float* a, const float* b, int64_t n);  // out may alias a or b
void add_inplace(float* dst, const float* src, int64_t n);
void scale_inplace(float* x, float s, int64_t n);
// x (N,C) += bias (C) on every row.
void add_bias(float* x, const float* bias, int64_t N, int64_t C);
// dst and src may each be host or device memory; waits for the copy when either is host memory.
void copy_bytes(void* dst, const void* src, size_t bytes);
void fill_zero(void* x, size_t bytes);
void fill(float* x, float value, int64_t n);
// out (n) = keep(i) ? inp * 1/(1-p) : 0, keep(i) = uniform(key(seed, stream, global_offset + i))
// >= p. Forward and backward are this same map (the mask is recomputed, never stored).
void dropout(float* out, const float* inp, int64_t n, float p, uint64_t seed, uint64_t stream,
             int64_t global_offset);

// ---- loss.cu ------------------------------------------------------------------------------------
// losses (N) = logsumexp(logits row) - logits[target]; dlogits (N,V) = (softmax - onehot) * dloss
// (may be null; may alias logits). target < 0: loss 0, gradient row 0. Throws if target >= V.
void softmax_cross_entropy(float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int64_t N, int64_t V, float dloss);
// Vocab-parallel pieces over a logits shard (N,Vl) holding vocabulary [vocab_start, +Vl) of V:
// max (N) = row max. Throws if a target is >= V.
void cross_entropy_shard_max(float* max, const float* logits, const int32_t* targets, int64_t N,
                             int64_t Vl, int64_t V);
// sums (2,N): sums[0] = sum exp(logits - max), sums[1] = logits[target - vocab_start] when this
// shard holds the target, else 0.
void cross_entropy_shard_sums(float* sums, const float* logits, const float* max,
                              const int32_t* targets, int64_t N, int64_t Vl, int64_t vocab_start);
// With max and sums reduced over the shards: losses (N) = max + log(sums[0]) - sums[1];
// dlogits (N,Vl) = (softmax - onehot) * dloss (may alias logits). target < 0: loss 0, grad 0.
void cross_entropy_shard_finish(float* losses, float* dlogits, const float* logits,
                                const float* max, const float* sums, const int32_t* targets,
                                int64_t N, int64_t Vl, int64_t vocab_start, float dloss);

// ---- optim.cu -----------------------------------------------------------------------------------
// param, grad, m, v (n); step is 1-based.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale);
double sum_squares(const float* x, int64_t n);
bool has_nonfinite(const float* x, int64_t n);

// ---- precision.cu -------------------------------------------------------------------------------
void round_to_bf16(float* x, int64_t n);
void round_to_f16(float* x, int64_t n);
// dst (n) of dst_type = src (n) of src_type; types among f32, bf16, f16.
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);

// ---- init.cu ------------------------------------------------------------------------------------
// x (R,W) with n = R*W: x[r,w] = std * normal(key(seed, stream, global_offset + r*row_stride + w))
// (row_stride = W: one contiguous run).
void init_normal(float* x, int64_t n, float std, uint64_t seed, uint64_t stream,
                 int64_t global_offset, int64_t W, int64_t row_stride);

// ---- attention.cu -----------------------------------------------------------------------------
// As kernels/cpu/attention.h: qkv (B,T,H+2KV,D), out (B,T,H,D), lse (B,H,T); D <= 256.
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

}  // namespace llmt::cuda
