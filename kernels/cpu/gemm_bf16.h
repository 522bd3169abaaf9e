// bf16 GEMMs with fp32 accumulation through oneDNN (kernels/cpu/linear.cpp), for the linear and
// the grouped linear kernels: on a CPU with AVX512-BF16 (and AMX), GEMM inputs whose values are
// bf16 values give the products an fp32 GEMM would, summed in another order.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmt::cpu {

// Whether GEMMs with these operands go to oneDNN: bf16 operands, a build with oneDNN, a CPU with
// AVX512-BF16, and LLMTRAIN_CPU_BF16_GEMM not "blas" ("auto" or unset; anything else is refused).
bool dnnl_bf16(DType operands);

// c (M,N) row-major = a (M,K) @ b (K,N) (+ c when `accumulate`), in bf16 with fp32 accumulation;
// a is given row-major as (M,K), or as its transpose (K,M) when a_t; b as (K,N), or (N,K) when
// b_t. The inputs are fp32 arrays of bf16 values. Call from one thread (oneDNN threads itself).
void gemm_bf16(float* c, const float* a, bool a_t, const float* b, bool b_t, int64_t M, int64_t N,
               int64_t K, bool accumulate);

// The same on inputs already in bf16, from bf16_copy: a caller running many GEMMs on parts of
// the same arrays (the experts' grouped GEMMs) converts each array once.
void gemm_bf16_copies(float* c, const uint16_t* a, bool a_t, const uint16_t* b, bool b_t, int64_t M,
                      int64_t N, int64_t K, bool accumulate);
// x (n) fp32 holding bf16 values, as bf16 (exact for such values) in this thread's buffer
// `slot` (0-2), valid until the next copy into that slot.
const uint16_t* bf16_copy(int slot, const float* x, int64_t n);

}  // namespace llmt::cpu
