// The operands of an attention call as strided views, shared by the CPU and CUDA kernels
// (kernels/cpu/attention.cpp, kernels/cuda/attention.cu), so both read the fused-qkv calls of
// ops.h attention_* and context parallelism's attention_block_* the same way. Plain data: a CUDA
// kernel takes it by value.
//
// Query (b, t, h) at q[b*q_bs + t*q_ld + h*D], key/value of kv head g at k/v[b*kv_bs + t*kv_ld +
// g*D]; key j is visible to query i when k_pos[j] <= q_pos[i], or (positions null) j <= i.
#pragma once

#include <cstdint>

namespace llmt {

struct AttnOperands {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  float scale =
      0;  // the softmax's scale on q.k (kernels/ops.h: 1/sqrt(D) unless a caller gives one)
  int64_t q_bs = 0, q_ld = 0, kv_bs = 0, kv_ld = 0;
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, KV = 0, D = 0;
  const int32_t *q_pos = nullptr, *k_pos = nullptr;
};

// Where a backward writes: dq in the queries' layout, dK/dV in the keys'; assigned, or added to.
struct AttnGradViews {
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  int64_t dq_bs = 0, dq_ld = 0, dkv_bs = 0, dkv_ld = 0;
  bool accumulate = false;
};

// The fused call: q, k, v are heads [0,H), [H,H+KV), [H+KV,H+2KV) of qkv (B,T,H+2KV,D), causal.
inline AttnOperands qkv_operands(const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                                 int64_t D) {
  AttnOperands a;
  const int64_t ld = (H + 2 * KV) * D;
  a.q = qkv;
  a.k = qkv + H * D;
  a.v = qkv + (H + KV) * D;
  a.q_bs = a.kv_bs = T * ld;
  a.q_ld = a.kv_ld = ld;
  a.B = B, a.Tq = a.Tk = T, a.H = H, a.KV = KV, a.D = D;
  return a;
}
// Its gradient: dqkv in qkv's layout, assigned.
inline AttnGradViews qkv_grads(float* dqkv, int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t ld = (H + 2 * KV) * D;
  return {dqkv, dqkv + H * D, dqkv + (H + KV) * D, T * ld, ld, T * ld, ld, false};
}

// A block (ops.h attention_block_*): queries heads [0,H) of q_src (B,Tq,Wq,D), keys and values
// heads [kv0, kv0+KV) and [kv0+KV, kv0+2KV) of kv_src (B,Tk,Wk,D), at the given positions.
inline AttnOperands block_operands(const float* q_src, int64_t Wq, const float* kv_src, int64_t Wk,
                                   int64_t kv0, const int32_t* q_pos, const int32_t* k_pos,
                                   int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                                   int64_t D) {
  AttnOperands a;
  a.q = q_src;
  a.k = kv_src + kv0 * D;
  a.v = kv_src + (kv0 + KV) * D;
  a.q_ld = Wq * D;
  a.q_bs = Tq * a.q_ld;
  a.kv_ld = Wk * D;
  a.kv_bs = Tk * a.kv_ld;
  a.B = B, a.Tq = Tq, a.Tk = Tk, a.H = H, a.KV = KV, a.D = D;
  a.q_pos = q_pos;
  a.k_pos = k_pos;
  return a;
}
// Its gradient: dq_src and dkv_src in the layouts of q_src and kv_src, added to.
inline AttnGradViews block_grads(float* dq_src, float* dkv_src, int64_t kv0,
                                 const AttnOperands& a) {
  return {
      dq_src, dkv_src + kv0 * a.D, dkv_src + (kv0 + a.KV) * a.D, a.q_bs, a.q_ld, a.kv_bs, a.kv_ld,
      true};
}

}  // namespace llmt
