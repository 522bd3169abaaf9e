// CPU causal self-attention with grouped-query heads: flash-attention style tiles with an online
// softmax (forward), and a tiled backward that recomputes the scores from q, k and lse.
// Shapes as in kernels/ops.h: qkv (B,T,H+2KV,D), out (B,T,H,D), lse (B,H,T). `operands` is
// ignored: the CPU computes in fp32 whatever the inputs' precision (same signature as CUDA's).
#pragma once

#include <cstdint>

#include "engine/core/dtype.h"

namespace llmt::cpu {

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType operands);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DType operands);

}  // namespace llmt::cpu
