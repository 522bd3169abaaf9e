// Linear layers through cuBLASLt. Row-major (N,IC) activations and (OC,IC) weights are, read
// column-major, their transposes, so out^T = W . inp^T etc. need no copies. fp32 in and out with
// CUBLAS_COMPUTE_32F (no TF32: the results must match the CPU's fp32 GEMMs to fp32 rounding);
// the forward bias rides the GEMM's BIAS epilogue; dweight accumulates with beta = 1; dbias is a
// column sum (common.cuh).
//
// With 16-bit `operands` (ops.h: the inputs' values are bf16/f16 values stored as fp32), the GEMM
// inputs are first converted to that type (precision.cu's convert, round to nearest even, exact on
// such values) in a staging buffer, and cuBLASLt multiplies them on tensor cores with fp32
// accumulation and scale into the same fp32 outputs: the products are exact in fp32, so only the
// summation differs from the fp32 GEMM. A/B = CUDA_R_16BF or CUDA_R_16F with C/D = CUDA_R_32F,
// CUBLAS_COMPUTE_32F and a CUDA_R_32F scale is a combination of the cublasLtMatmul type table
// (https://docs.nvidia.com/cuda/cublas/#cublasltmatmul; PyTorch's fp32-output GEMMs from 16-bit
// inputs use it, pytorch/pytorch#150812). The BIAS epilogue's vector has D's type outside the
// int8/fp8 exceptions (cublasLt.h of CUDA 13.1, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE): fp32 here,
// so the forward bias still rides the epilogue. If cuBLASLt finds no algorithm, matmul() throws.
#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm_operands.cuh"

namespace llmt::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The largest power of two up to 256 dividing p's address. cuBLASLt's heuristics assume 256-byte
// aligned matrices unless told otherwise (cublasLt.h: CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES,
// default 256), and our operands are views at any 4-byte offset of larger buffers.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

Lt& lt() {
  static Lt l = [] {
    Lt x;
    LLMT_CUBLAS_CHECK(cublasLtCreate(&x.handle));
    LLMT_CUDA_CHECK(cudaMalloc(&x.workspace, kWorkspaceBytes));
    return x;
  }();
  return l;
}

// Owns the descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Column-major C (m,n) = alpha op(A) op(B) + beta C [+ bias (m) per column], fp32 accumulation.
// A is (m,k) after op, stored (rows_a, cols_a) with leading dim lda; likewise B (k,n). The type
// of A and B may be CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F (C and the bias stay fp32).
void matmul(float* C, const void* A, const void* B, const float* bias, bool trans_a, bool trans_b,
            int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, float beta,
            cudaDataType_t ab_type = CUDA_R_32F) {
  if (m == 0 || n == 0) return;
  LLMT_CHECK(k > 0, "linear: a GEMM over an empty inner dimension (", m, "x", n, "x0)");
  Lt& l = lt();
  Descs d;
  LLMT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LLMT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LLMT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    LLMT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    LLMT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                     sizeof bias));
    const cudaDataType_t bias_type = CUDA_R_32F;
    LLMT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &bias_type, sizeof bias_type));
  }
  LLMT_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.a, ab_type, trans_a ? k : m, trans_a ? m : k, lda));
  LLMT_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.b, ab_type, trans_b ? n : k, trans_b ? k : n, ldb));
  LLMT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, m, n, m));
  LLMT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  LLMT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes, sizeof kWorkspaceBytes));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligned[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, A},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, B},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, C},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, C}};
  for (const auto& [attr, ptr] : aligned) {
    const uint32_t al = alignment(ptr);
    LLMT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &al, sizeof al));
  }
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  LLMT_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(l.handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heur, &found));
  LLMT_CHECK(found > 0, "cuBLASLt has no algorithm for a ", m, "x", n, "x", k, " GEMM with ",
             ab_type == CUDA_R_32F    ? "fp32"
             : ab_type == CUDA_R_16BF ? "bf16"
                                      : "f16",
             " inputs", bias ? " and the bias epilogue" : "");
  const float alpha = 1.0f;
  LLMT_CUBLAS_CHECK(cublasLtMatmul(l.handle, d.op, &alpha, A, d.a, B, d.b, &beta, C, d.c, C, d.c,
                                   &heur.algo, l.workspace, kWorkspaceBytes, stream()));
}

}  // namespace

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, DType operands) {
  if (N == 0) return;
  const Operands o = gemm_operands(operands, {inp, weight, nullptr}, {N * IC, OC * IC, 0});
  // out^T (OC,N) = W^T^T (OC,IC) . inp^T (IC,N); W read column-major is (IC,OC).
  matmul(out, o.p[1], o.p[0], bias, true, false, OC, N, IC, IC, IC, 0.0f, o.type);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t IC, int64_t OC, DType operands) {
  if (N == 0) return;
  // Only the inputs of the GEMMs that run: weight for dinp, inp for dweight, dout for both.
  const Operands o = gemm_operands(
      operands,
      {dinp || dweight ? dout : nullptr, dinp ? weight : nullptr, dweight ? inp : nullptr},
      {N * OC, OC * IC, N * IC});
  // dinp^T (IC,N) = W (IC,OC column-major) . dout^T (OC,N)
  if (dinp) matmul(dinp, o.p[1], o.p[0], nullptr, false, false, IC, N, OC, IC, OC, 0.0f, o.type);
  // dweight^T (IC,OC) += inp^T (IC,N) . dout (N,OC): dout read column-major is (OC,N), transposed
  // (skipped when null: ZB-H1's input-gradient half leaves the weights to its second half)
  if (dweight)
    matmul(dweight, o.p[2], o.p[0], nullptr, false, true, IC, OC, N, IC, OC, 1.0f, o.type);
  if (dbias)
    add_column_sums(dbias, N, OC,
                    [=] __device__(int64_t n, int64_t c) { return dout[n * OC + c]; });
}

}  // namespace llmt::cuda
