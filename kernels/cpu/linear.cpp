// Linear layers as row-major OpenBLAS GEMMs (weights stored (OC,IC) as in PyTorch). The bias is
// written into `out` first so the forward GEMM accumulates onto it (beta = 1) with no extra pass;
// the weight-gradient GEMM uses beta = 1 to add into dweight.
//
// `operands`: the fp32 GEMM already computes what a 16-bit GEMM with fp32 accumulation computes
// on such inputs. A product of two bf16 values (8-bit significands) or two f16 values (11-bit)
// has at most 22 significant bits, so it is exact in fp32's 24 (f16's range squared stays inside
// fp32's normal range; bf16 shares fp32's exponents, so its products over- or underflow exactly
// where an fp32 GEMM's would). Only the order of the fp32 summation differs. So with bf16
// operands on a CPU with AVX512-BF16 (and AMX) the GEMMs run as oneDNN bf16 matmuls with fp32
// accumulation and output, on bf16 copies of the inputs (exact: their values are bf16 values),
// 4.4-6.3x sgemm's speed on an AMX Xeon (docs/performance.md); the results differ from sgemm's
// by the summation order alone. LLMTRAIN_CPU_BF16_GEMM=blas in the environment keeps sgemm.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#if LLMTRAIN_HAVE_DNNL
#include "oneapi/dnnl/dnnl.hpp"
#endif

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {

#if LLMTRAIN_HAVE_DNNL
const uint16_t* bf16_copy(int slot, const float* x, int64_t n) {
  thread_local std::vector<uint16_t> buffers[3];
  std::vector<uint16_t>& b = buffers[slot];
  if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
  convert(b.data(), DType::bf16, x, DType::f32, n);  // the storage codec's rounding: exact here
  return b.data();
}

bool dnnl_bf16(DType operands) {
  static const bool usable = [] {
    const char* e = std::getenv("LLMTRAIN_CPU_BF16_GEMM");
    const std::string_view v = e != nullptr ? e : "";
    LLMT_CHECK(v.empty() || v == "auto" || v == "blas", "LLMTRAIN_CPU_BF16_GEMM=", v,
               " is not \"auto\" (oneDNN bf16 GEMMs where the CPU has AVX512-BF16) or \"blas\" "
               "(fp32 sgemm)");
    return v != "blas" && __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return operands == DType::bf16 && usable;
}

void gemm_bf16(float* c, const float* a, bool a_t, const float* b, bool b_t, int64_t M, int64_t N,
               int64_t K, bool accumulate) {
  gemm_bf16_copies(c, bf16_copy(0, a, M * K), a_t, bf16_copy(1, b, K * N), b_t, M, N, K,
                   accumulate);
}

void gemm_bf16_copies(float* c, const uint16_t* a, bool a_t, const uint16_t* b, bool b_t, int64_t M,
                      int64_t N, int64_t K, bool accumulate) {
  using dnnl::memory;
  using dt = memory::data_type;
  using tag = memory::format_tag;
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  static dnnl::stream stream(engine);  // in order; each GEMM waits for its own result
  const memory::desc ad({M, K}, dt::bf16, a_t ? tag::ba : tag::ab),
      bd({K, N}, dt::bf16, b_t ? tag::ba : tag::ab), cd({M, N}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  // oneDNN's primitive cache keeps the kernels of the shapes seen before.
  const dnnl::matmul matmul(
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), attr, engine));
  memory am(ad, engine, const_cast<uint16_t*>(a));
  memory bm(bd, engine, const_cast<uint16_t*>(b));
  memory cm(cd, engine, c);
  matmul.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}
#else
bool dnnl_bf16(DType) {
  return false;
}
void gemm_bf16(float*, const float*, bool, const float*, bool, int64_t, int64_t, int64_t, bool) {
  LLMT_CHECK(false, "gemm_bf16: this build has no oneDNN");
}
void gemm_bf16_copies(float*, const uint16_t*, bool, const uint16_t*, bool, int64_t, int64_t,
                      int64_t, bool) {
  LLMT_CHECK(false, "gemm_bf16: this build has no oneDNN");
}
const uint16_t* bf16_copy(int, const float*, int64_t) {
  LLMT_CHECK(false, "gemm_bf16: this build has no oneDNN");
  return nullptr;
}
#endif

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, DType operands) {
  if (N == 0) return;
  if (bias) {
    parallel_for(N, grain_rows(OC), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) std::copy(bias, bias + OC, out + n * OC);
    });
  }
  if (dnnl_bf16(operands)) {
    gemm_bf16(out, inp, false, weight, true, N, OC, IC, bias != nullptr);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC,
              bias ? 1.0f : 0.0f, out, OC);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t IC, int64_t OC, DType operands) {
  if (N == 0) return;
  const bool bf16 = dnnl_bf16(operands);
  if (dinp) {  // (N,IC) = (N,OC) @ (OC,IC)
    if (bf16)
      gemm_bf16(dinp, dout, false, weight, false, N, IC, OC, false);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC,
                  0.0f, dinp, IC);
  }
  if (dweight) {  // (OC,IC) += (N,OC)^T @ (N,IC)
    if (bf16)
      gemm_bf16(dweight, dout, true, inp, false, OC, IC, N, true);
    else
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f,
                  dweight, IC);
  }
  if (dbias) {
    auto sums = parallel_rows_sum(N, grain_rows(OC), OC, [&](int64_t begin, int64_t end, float* a) {
      for (int64_t n = begin; n < end; ++n) accumulate(a, dout + n * OC, OC);
    });
    accumulate(dbias, sums.data(), OC);
  }
}

}  // namespace llmt::cpu
