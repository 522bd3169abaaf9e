// CPU causal self-attention with grouped-query heads: flash-attention style tiles with an online
// softmax (forward), and a tiled backward that recomputes the scores from q, k and lse.
// Shapes as in kernels/ops.h: qkv (B,T,H+2KV,D), out (B,T,H,D), lse (B,H,T).
#pragma once

#include <cstdint>

namespace llmt::cpu {

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

}  // namespace llmt::cpu
