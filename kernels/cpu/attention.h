// CPU causal self-attention with grouped-query heads: flash-attention style tiles with an online
// softmax (forward), and a tiled backward that recomputes the scores from q, k and lse.
// Shapes as in kernels/ops.h: qkv (B,T,H+2KV,D), out (B,T,H,D), lse (B,H,T). `operands` is
// ignored: the CPU computes in fp32 whatever the inputs' precision (same signature as CUDA's).
#pragma once

#include <cstdint>

#include "engine/core/dtype.h"

namespace llmt::cpu {

// One attention call in general form (flash_forward/backward; behind ops.h attention_* and
// attention_block_*): queries (b, t, h) at
// q[b*q_bs + t*q_ld + h*D], keys and values of kv head g at k/v[b*kv_bs + t*kv_ld + g*D]; key j
// is visible to query i when k_pos[j] <= q_pos[i] (positions null: 0..T-1, plain causal).
// Forward: out (B,Tq,H,D) and lse (B,H,Tq) contiguous, assigned; a query seeing no key gets out 0
// and lse -inf. Backward: dout, out_c and lse_c (the final output and lse) in those layouts.
struct AttnArgs {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_bs = 0, q_ld = 0, kv_bs = 0, kv_ld = 0;
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, KV = 0, D = 0;
  const int32_t *q_pos = nullptr, *k_pos = nullptr;
  float *out = nullptr, *lse = nullptr;                                  // forward
  const float *dout = nullptr, *out_c = nullptr, *lse_c = nullptr;       // backward
};
// Where the backward writes: dq in the queries' layout, dk/dv in the keys'; assigned, or added
// to (accumulate).
struct AttnGrads {
  float *dq, *dk, *dv;
  int64_t dq_bs, dq_ld, dkv_bs, dkv_ld;
  bool accumulate;
};
void flash_forward(const AttnArgs& a);
void flash_backward(const AttnArgs& a, const AttnGrads& g);

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType operands);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DType operands);

}  // namespace llmt::cpu
