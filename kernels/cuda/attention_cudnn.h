// cuDNN's fused scaled-dot-product attention (graph API, through the header-only cuDNN frontend)
// on 16-bit operands: the forward and backward graphs of one shape, built once and cached, and
// their launches. Plain C++ on raw device pointers: attention.cu converts the fp32 tensors to and
// from the 16-bit buffers and calls these; only attention_cudnn.cpp includes cuDNN (one
// translation unit pays for the frontend's headers). Built when cmake/cudnn.cmake found cuDNN
// (LLMTRAIN_HAVE_CUDNN).
// Layouts as in kernels/ops.h, in the operands type unless said: qkv (B,T,H+2KV,D) with q heads,
// then k, then v (cuDNN reads them in place through strides), o and do (B,T,H,D), lse (B,H,T) f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace llmt::cuda::cudnn_sdpa {

struct Shape {
  int64_t B, T, H, KV, D;
  DType operands;      // bf16 or f16
  float scale = 0.0f;  // the scores' scale; 0: 1/sqrt(D)
};

// Empty when cuDNN runs this shape, forward and backward (both graphs built and cached on the
// first call); otherwise why not (a documented limit, or cuDNN's message). The one predicate
// attention_forward and attention_backward share.
std::string unsupported(const Shape& s);

// Device workspace the larger of the two graphs needs, in bytes (a supported shape).
size_t workspace_bytes(const Shape& s);

// Causal attention, scores scaled by s.scale: o (B,T,H,D) assigned; lse (B,H,T) f32 = max + ln(sum
// exp) of each row's scaled scores (cuDNN's Stats: the flash and CPU kernels' lse).
void forward(void* o, float* lse, const void* qkv, void* workspace, const Shape& s);

// dqkv (B,T,H+2KV,D) assigned (every element); do, o (B,T,H,D); lse (B,H,T) f32 from forward.
void backward(void* dqkv, const void* dout, const void* qkv, const void* o, const float* lse,
              void* workspace, const Shape& s);

}  // namespace llmt::cuda::cudnn_sdpa
