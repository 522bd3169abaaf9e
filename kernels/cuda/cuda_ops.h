// The CUDA kernels behind kernels/ops.h, on raw device pointers, with the same signatures and
// semantics as kernels/cpu/cpu_ops.h (the CPU kernels are the numerical reference): ops.cpp checks
// shapes, dtypes and devices and calls these for CUDA tensors. Plain C++: no CUDA type appears
// here. Every launcher runs on the process's compute stream (core/cuda) and returns
// without waiting, except where it must read a result or an error back (token and
// target range checks, sum_squares, has_nonfinite, copies touching host memory).
//
// Dims: B batch, T sequence, C channels, V vocabulary, N rows (B*T), P position-table rows,
// IC/OC in/out features, F ffn hidden, HT heads in a rope tensor, D head dim, n element count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "kernels/rope_math.h"

namespace llmt::cuda {

#include "kernels/kernel_decls.inc"

// ---- attention.cu -----------------------------------------------------------------------------
// As kernels/cpu/attention.h: qkv (B,T,H+2KV,D), out (B,T,H,D), lse (B,H,T). With operands bf16
// or f16 and a shape cuDNN supports, cuDNN's fused attention (attention_cudnn.h); otherwise the
// flash kernel, D <= 256. Forward and backward decide by the same predicate (attention_path).
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType operands, float scale);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DType operands, float scale);
// Which implementation attention_forward/backward use for this call: "cudnn", or "flash: " and
// the reason (operands f32, a build without cuDNN, or what cuDNN said about the shape). Builds
// and caches cuDNN's graphs for the shape, so it needs a GPU when operands are 16-bit.
std::string attention_path(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType operands);

}  // namespace llmt::cuda
