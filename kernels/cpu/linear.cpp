// Linear layers as row-major OpenBLAS GEMMs (weights stored (OC,IC) as in PyTorch). The bias is
// written into `out` first so the forward GEMM accumulates onto it (beta = 1) with no extra pass;
// the weight-gradient GEMM uses beta = 1 to add into dweight.
//
// `operands` is ignored: the fp32 GEMM already computes what a 16-bit GEMM with fp32 accumulation
// computes on such inputs. A product of two bf16 values (8-bit significands) or two f16 values
// (11-bit) has at most 22 significant bits, so it is exact in fp32's 24 (f16's range squared stays
// inside fp32's normal range; bf16 shares fp32's exponents, so its products over- or underflow
// exactly where an fp32 GEMM's would). Only the order of the fp32 summation differs.
#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, DType /*operands*/) {
  if (N == 0) return;
  if (bias) {
    parallel_for(N, grain_rows(OC), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) std::copy(bias, bias + OC, out + n * OC);
    });
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC,
              bias ? 1.0f : 0.0f, out, OC);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t IC, int64_t OC, DType /*operands*/) {
  if (N == 0) return;
  if (dinp)  // (N,IC) = (N,OC) @ (OC,IC)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC,
                0.0f, dinp, IC);
  if (dweight)  // (OC,IC) += (N,OC)^T @ (N,IC)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f,
                dweight, IC);
  if (dbias) {
    auto sums = parallel_rows_sum(N, grain_rows(OC), OC, [&](int64_t begin, int64_t end, float* a) {
      for (int64_t n = begin; n < end; ++n) accumulate(a, dout + n * OC, OC);
    });
    accumulate(dbias, sums.data(), OC);
  }
}

}  // namespace llmt::cpu
