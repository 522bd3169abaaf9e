// CPU causal self-attention with grouped-query heads: flash-attention style tiles with an online
// softmax (forward), and a tiled backward that recomputes the scores from q, k and lse.
// Shapes as in kernels/ops.h: qkv (B,T,H+2KV,D), out (B,T,H,D), lse (B,H,T). `operands` is
// ignored: the CPU computes in fp32 whatever the inputs' precision (same signature as CUDA's).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/attention_args.h"

namespace llmt::cpu {

// One attention call in general form (kernels/attention_args.h's operands), behind ops.h
// attention_* and attention_block_*. Forward: out (B,Tq,H,D) and lse (B,H,Tq) contiguous,
// assigned; a query seeing no key gets out 0 and lse -inf. Backward: dout, out_c and lse_c (the
// final output and lse) in those layouts.
struct AttnArgs : AttnOperands {
  float *out = nullptr, *lse = nullptr;                             // forward
  const float *dout = nullptr, *out_c = nullptr, *lse_c = nullptr;  // backward
};
void flash_forward(const AttnArgs& a);
void flash_backward(const AttnArgs& a, const AttnGradViews& g);

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType operands, float scale);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DType operands, float scale);

}  // namespace llmt::cpu
