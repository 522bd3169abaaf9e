// The inputs of a GEMM as cuBLAS multiplies them, shared by the linear (linear.cu) and the grouped
// (moe.cu) GEMMs: with fp32 `operands` the fp32 arrays themselves; with bf16/f16 operands (ops.h:
// the inputs' values are 16-bit values stored as fp32) their copies in that type (precision.cu's
// convert: round to nearest even, exact on such values) in a staging buffer, which tensor cores
// multiply with fp32 accumulation into fp32 outputs. Included only by kernels/cuda/*.cu.
#pragma once

#include <array>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {

inline cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::i32:
    case DType::f64:
      break;
  }
  LLMT_CHECK(false, "GEMM: no operands of type ", dtype_name(t));
  return CUDA_R_32F;
}

// Up to three inputs of one GEMM call (absent ones: nullptr, and they stay absent): their type
// and the arrays cuBLAS reads, valid until the next call queues on the stream (one staging
// buffer, used in stream order).
struct Operands {
  cudaDataType_t type;
  std::array<const void*, 3> p{};
};

inline Operands gemm_operands(DType t, std::array<const float*, 3> src, std::array<int64_t, 3> n) {
  Operands o{cuda_type(t), {}};
  if (t == DType::f32) {
    for (size_t i = 0; i < src.size(); ++i) o.p[i] = src[i];
    return o;
  }
  constexpr size_t kAlign = 256;  // every copy starts on cuBLASLt's preferred alignment
  std::array<size_t, 3> off{};
  size_t total = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    off[i] = total;
    if (src[i]) total += (static_cast<size_t>(n[i]) * 2 + kAlign - 1) / kAlign * kAlign;
  }
  static Scratch staging;  // the 16-bit copies of GEMM inputs
  char* base = static_cast<char*>(staging.reserve(total));
  for (size_t i = 0; i < src.size(); ++i) {
    if (!src[i]) continue;
    convert(base + off[i], t, src[i], DType::f32, n[i]);
    o.p[i] = base + off[i];
  }
  return o;
}

}  // namespace llmt::cuda
