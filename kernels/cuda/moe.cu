// Mixture-of-experts kernels (kernel_decls.inc, "mixture of experts"); the formulas and orders are
// the CPU kernels' (kernels/cpu/moe.cpp). The router runs a thread per token (E is small); the
// dispatch a thread per (sequence, expert), which scans its sequence in the dropping order, so no
// atomics decide which assignment keeps its place; the grouped GEMM is one
// cublasSgemmGroupedBatched call (fp32, no TF32) with one group per expert that has rows, or with
// 16-bit operands one cublasGemmGroupedBatchedEx call on their 16-bit copies (gemm_operands.cuh;
// fp32 accumulation and output, where cuBLAS takes that combination; compiled, not yet run on a
// GPU).
#include <cublas_v2.h>

#include <map>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm_operands.cuh"
#include "kernels/moe_math.h"

namespace llmt::cuda {
namespace {

// The row's max and logsumexp.
__device__ float row_lse(const float* z, int64_t E) {
  float mx = z[0];
  for (int64_t e = 1; e < E; ++e) mx = fmaxf(mx, z[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += exp(static_cast<double>(z[e] - mx));
  return mx + static_cast<float>(log(sum));
}

__device__ float score(const float* z, int64_t e, float lse, bool sigmoid) {
  return sigmoid ? 1.0f / (1.0f + expf(-z[e])) : expf(z[e] - lse);
}

}  // namespace

void moe_route(float* scores, int32_t* idx, float* weights, const float* logits, const float* bias,
               int64_t N, int64_t E, int64_t k, bool sigmoid, bool normalize, int64_t G,
               int64_t topk_group, float scale) {
  for_each(N, [=] __device__(int64_t t) {
    const float* z = logits + t * E;
    float* p = scores + t * E;
    const float lse = row_lse(z, E);
    for (int64_t e = 0; e < E; ++e) p[e] = score(z, e, lse, sigmoid);
    auto key = [&](int64_t e) { return bias ? p[e] + bias[e] : p[e]; };
    // Group-limited routing: group g is open when fewer than topk_group groups rank above it by
    // the sum of their two largest keys (ties: the lower group ranks above).
    const int64_t per = E / G;
    auto group_score = [&](int64_t g) { return kernel_math::group_score(key, g * per, per); };
    auto open = [&](int64_t g) {
      if (topk_group == G) return true;
      const float mine = group_score(g);
      int64_t above = 0;
      for (int64_t h = 0; h < G; ++h) {
        const float other = group_score(h);
        above += other > mine || (other == mine && h < g);
      }
      return above < topk_group;
    };
    int32_t* ix = idx + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ix[i] == e;
        if (!taken && (best < 0 || key(e) > key(best)) && open(e / per)) best = e;
      }
      ix[j] = static_cast<int32_t>(best);
      sum += p[best];
    }
    for (int64_t j = 0; j < k; ++j)
      weights[t * k + j] = (normalize ? p[ix[j]] / sum : p[ix[j]]) * scale;
  });
}

void moe_dispatch(int32_t* counts, int32_t* offsets, int32_t* assign, int32_t* slot,
                  const int32_t* idx, const int32_t* rank_base, int64_t S, int64_t T, int64_t E,
                  int64_t k, int64_t H, int64_t capacity) {
  // Count and mark: (sequence, expert) in (j, t) order; slot 0 kept, -1 dropped (slot >= 0 keeps
  // meaning kept while the rows are filled in).
  for_each(S * E, [=] __device__(int64_t i) {
    const int64_t s = i / E, e = i % E, run = T / H;
    int32_t c = 0;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t h = 0; h < H; ++h) {
        int64_t rank = rank_base ? rank_base[((s * E + e) * k + j) * H + h] : c;
        for (int64_t t = s * T + h * run; t < s * T + (h + 1) * run; ++t)
          if (idx[t * k + j] == e) {
            slot[t * k + j] = capacity == 0 || rank < capacity ? 0 : -1;
            ++c;
            ++rank;
          }
      }
    counts[i] = c;
  });
  // The kept assignments of (sequence s, expert e): a scan of the marks.
  auto kept = [=] __device__(int64_t s, int64_t e) {
    int64_t n = 0;
    for (int64_t a = s * T * k; a < (s + 1) * T * k; ++a) n += idx[a] == e && slot[a] >= 0;
    return n;
  };
  for_each(1, [=] __device__(int64_t) {
    int64_t row = 0;
    for (int64_t e = 0; e < E; ++e) {
      offsets[e] = static_cast<int32_t>(row);
      for (int64_t s = 0; s < S; ++s) row += kept(s, e);
    }
    offsets[E] = static_cast<int32_t>(row);
  });
  // Fill: each (sequence, expert) its rows, in t order.
  for_each(S * E, [=] __device__(int64_t i) {
    const int64_t s = i / E, e = i % E;
    int64_t row = offsets[e];
    for (int64_t s2 = 0; s2 < s; ++s2) row += kept(s2, e);
    for (int64_t t = s * T; t < (s + 1) * T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t a = t * k + j;
        if (idx[a] != e || slot[a] < 0) continue;
        slot[a] = static_cast<int32_t>(row);
        assign[row++] = static_cast<int32_t>(a);
      }
  });
  for_each(S * T * k, [=] __device__(int64_t r) {
    if (r >= offsets[E]) assign[r] = -1;
  });
}

void moe_permute(float* out, const float* in, const int32_t* assign, const float* weights,
                 int64_t N, int64_t C, int64_t k) {
  for_each(N * k * C, [=] __device__(int64_t i) {
    const int64_t r = i / C, c = i % C;
    const int32_t a = assign[r];
    if (a < 0) return;
    out[i] = in[(a / k) * C + c] * (weights ? weights[a] : 1.0f);
  });
}

void moe_unpermute(float* out, const float* in, const int32_t* slot, const float* weights,
                   int64_t N, int64_t C, int64_t k) {
  for_each(N * C, [=] __device__(int64_t i) {
    const int64_t t = i / C, c = i % C;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = slot[t * k + j];
      if (r >= 0) acc += (weights ? weights[t * k + j] : 1.0f) * in[int64_t{r} * C + c];
    }
    out[i] = acc;
  });
}

void moe_weights_backward(float* dweights, const float* dout, const float* in, const int32_t* slot,
                          int64_t N, int64_t C, int64_t k) {
  for_each(N * k, [=] __device__(int64_t a) {
    const int32_t r = slot[a];
    float dot = 0.0f;
    if (r >= 0)
      for (int64_t c = 0; c < C; ++c) dot += dout[(a / k) * C + c] * in[int64_t{r} * C + c];
    dweights[a] = dot;
  });
}

void moe_route_backward(float* dlogits, const float* dweights, const float* logits,
                        const int32_t* idx, const int32_t* counts, int64_t N, int64_t T, int64_t E,
                        int64_t k, bool sigmoid, bool normalize, float scale, float aux_scale,
                        float z_scale) {
  for_each(N, [=] __device__(int64_t t) {
    const float* z = logits + t * E;
    const float lse = row_lse(z, E);
    const int32_t* ix = idx + t * k;
    const float* dws = dweights + t * k;
    auto dw = [&](int64_t j) { return dws[j] * scale; };  // the routing weights' factor
    const int32_t* c = aux_scale != 0.0f ? counts + (t / T) * E : nullptr;
    float sel = 0.0f, wdw = 0.0f, all = 0.0f, qdq = 0.0f;
    for (int64_t j = 0; j < k; ++j) sel += score(z, ix[j], lse, sigmoid);
    for (int64_t j = 0; j < k; ++j) wdw += score(z, ix[j], lse, sigmoid) / sel * dw(j);
    if (c && sigmoid) {
      for (int64_t e = 0; e < E; ++e) all += score(z, e, lse, true);
      for (int64_t e = 0; e < E; ++e)
        qdq += score(z, e, lse, true) / all * aux_scale * static_cast<float>(c[e]);
    }
    // dp (the gradient of expert e's score), as the CPU kernel accumulates it.
    auto dp = [&](int64_t e) {
      float d = 0.0f;
      for (int64_t j = 0; j < k; ++j)
        if (ix[j] == e) d += normalize ? (dw(j) - wdw) / sel : dw(j);
      if (c) {
        const float a = aux_scale * static_cast<float>(c[e]);
        d += sigmoid ? (a - qdq) / all : a;
      }
      return d;
    };
    float pdp = 0.0f;
    if (!sigmoid)
      for (int64_t e = 0; e < E; ++e) pdp += score(z, e, lse, false) * dp(e);
    for (int64_t e = 0; e < E; ++e) {
      const float p = score(z, e, lse, sigmoid);
      float d = sigmoid ? dp(e) * p * (1.0f - p) : p * (dp(e) - pdp);
      if (z_scale != 0.0f) d += z_scale * lse * expf(z[e] - lse);
      dlogits[t * E + e] = d;
    }
  });
}

void moe_route_losses(float* aux, float* zsq, const float* logits, const int32_t* counts, int64_t S,
                      int64_t T, int64_t E, int64_t k, bool sigmoid) {
  for_each(S * T, [=] __device__(int64_t t) {
    const float lse = row_lse(logits + t * E, E);
    zsq[t] = lse * lse;
  });
  for_each(S, [=] __device__(int64_t s) {
    double a = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      double mean_q = 0.0;
      for (int64_t t = s * T; t < (s + 1) * T; ++t) {
        const float* z = logits + t * E;
        const float lse = row_lse(z, E);
        double all = 0.0;
        if (sigmoid)
          for (int64_t e2 = 0; e2 < E; ++e2) all += score(z, e2, lse, true);
        mean_q += sigmoid ? score(z, e, lse, true) / all : score(z, e, lse, false);
      }
      a += static_cast<double>(counts[s * E + e]) / static_cast<double>(T * k) * mean_q /
           static_cast<double>(T);
    }
    aux[s] = static_cast<float>(static_cast<double>(E) * a);
  });
}

namespace {

cublasHandle_t blas() {
  static cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    LLMT_CUBLAS_CHECK(cublasCreate(&x));
    LLMT_CUBLAS_CHECK(cublasSetMathMode(x, CUBLAS_DEFAULT_MATH));  // no TF32
    return x;
  }();
  LLMT_CUBLAS_CHECK(cublasSetStream(h, stream()));
  return h;
}

// One column-major GEMM per non-empty group, C_g = op(A_g) op(B_g) (+ beta C_g), in one call,
// on the inputs `in` (gemm_operands: fp32, or 16-bit copies multiplied on tensor cores with fp32
// accumulation into the fp32 C). A_g and B_g are element offsets into in.p[ia] and in.p[ib].
struct Groups {
  explicit Groups(const Operands& in) : in_(in), es_(in.type == CUDA_R_32F ? 4 : 2) {}

  void add(bool trans_a, bool trans_b, int64_t m_, int64_t n_, int64_t k_, int ia, int64_t a_off,
           int64_t lda_, int ib, int64_t b_off, int64_t ldb_, float beta_, float* c_,
           int64_t ldc_) {
    if (m_ == 0 || n_ == 0 || k_ == 0) return;  // nothing to compute (beta = 1 for dweight)
    ta.push_back(trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    tb.push_back(trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    m.push_back(static_cast<int>(m_));
    n.push_back(static_cast<int>(n_));
    k.push_back(static_cast<int>(k_));
    lda.push_back(static_cast<int>(lda_));
    ldb.push_back(static_cast<int>(ldb_));
    ldc.push_back(static_cast<int>(ldc_));
    alpha.push_back(1.0f);
    beta.push_back(beta_);
    a.push_back(static_cast<const char*>(in_.p[static_cast<size_t>(ia)]) + a_off * es_);
    b.push_back(static_cast<const char*>(in_.p[static_cast<size_t>(ib)]) + b_off * es_);
    c.push_back(c_);
    size.push_back(1);
  }

  void run() {
    if (c.empty()) return;
    const size_t g = c.size();
    // The pointer arrays live on the device; the rest are host arrays.
    static Scratch pointers;
    auto** dev = static_cast<void**>(pointers.reserve(3 * g * sizeof(void*)));
    std::vector<const void*> host(a.begin(), a.end());
    host.insert(host.end(), b.begin(), b.end());
    for (float* p : c) host.push_back(p);
    LLMT_CUDA_CHECK(
        cudaMemcpyAsync(dev, host.data(), 3 * g * sizeof(void*), cudaMemcpyHostToDevice, stream()));
    if (in_.type == CUDA_R_32F) {
      LLMT_CUBLAS_CHECK(cublasSgemmGroupedBatched(
          blas(), ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
          reinterpret_cast<const float* const*>(dev), lda.data(),
          reinterpret_cast<const float* const*>(dev + g), ldb.data(), beta.data(),
          reinterpret_cast<float* const*>(dev + 2 * g), ldc.data(), static_cast<int>(g),
          size.data()));
      return;
    }
    // 16-bit A and B, fp32 C, fp32 compute (the type combination linear.cu's cuBLASLt GEMMs use).
    LLMT_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        blas(), ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
        reinterpret_cast<const void* const*>(dev), in_.type, lda.data(),
        reinterpret_cast<const void* const*>(dev + g), in_.type, ldb.data(), beta.data(),
        reinterpret_cast<void* const*>(dev + 2 * g), CUDA_R_32F, ldc.data(), static_cast<int>(g),
        size.data(), CUBLAS_COMPUTE_32F));
  }

  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<float> alpha, beta;
  std::vector<const void*> a, b;
  std::vector<float*> c;

 private:
  const Operands& in_;
  int64_t es_;
};

// The operands the grouped GEMMs use: 16-bit ones where cublasGemmGroupedBatchedEx takes them
// with an fp32 C (tried once per type on a 16 x 16 x 16 problem), else fp32 (the same values,
// at fp32 speed).
DType grouped_operands(DType requested) {
  if (requested == DType::f32) return requested;
  static std::map<DType, bool> supported;
  auto it = supported.find(requested);
  if (it == supported.end()) {
    static Scratch probe;
    const cudaDataType_t t = cuda_type(requested);
    char* base = static_cast<char*>(probe.reserve(3 * 256 * 4 + 3 * sizeof(void*)));
    void* host[3] = {base, base + 1024, base + 2048};
    auto** dev = reinterpret_cast<void**>(base + 3072);
    LLMT_CUDA_CHECK(cudaMemsetAsync(base, 0, 3072, stream()));
    LLMT_CUDA_CHECK(cudaMemcpyAsync(dev, host, sizeof host, cudaMemcpyHostToDevice, stream()));
    const cublasOperation_t op = CUBLAS_OP_N;
    const int d = 16, one = 1;
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t st = cublasGemmGroupedBatchedEx(
        blas(), &op, &op, &d, &d, &d, &alpha, reinterpret_cast<const void* const*>(dev), t, &d,
        reinterpret_cast<const void* const*>(dev + 1), t, &d, &beta,
        reinterpret_cast<void* const*>(dev + 2), CUDA_R_32F, &d, 1, &one, CUBLAS_COMPUTE_32F);
    LLMT_CUDA_CHECK(cudaStreamSynchronize(stream()));
    it = supported.emplace(requested, st == CUBLAS_STATUS_SUCCESS).first;
  }
  return it->second ? requested : DType::f32;
}

}  // namespace

// Row-major (rows, cols) is column-major (cols, rows): out^T (OC,n) = W (OC,IC) . inp^T (IC,n).
void grouped_linear_forward(float* out, const float* inp, const float* weight,
                            const int64_t* offsets, const int64_t* weight_of, int64_t G, int64_t W,
                            int64_t IC, int64_t OC, DType operands) {
  const Operands in = gemm_operands(grouped_operands(operands), {inp, weight, nullptr},
                                    {offsets[G] * IC, W * OC * IC, 0});
  Groups gs(in);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0, w = weight_of ? weight_of[g] : g;
    gs.add(true, false, OC, n, IC, 1, w * OC * IC, IC, 0, r0 * IC, IC, 0.0f, out + r0 * OC, OC);
  }
  gs.run();
}

// dinp^T (IC,n) = W^T (IC,OC) . dout^T (OC,n); dW^T (IC,OC) += inp^T (IC,n) . dout (n,OC). The
// gradients of a weight shared by several groups are added by successive calls (one group of
// each weight per call), since a grouped call's GEMMs run concurrently.
void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const int64_t* offsets, const int64_t* weight_of,
                             int64_t G, int64_t W, int64_t IC, int64_t OC, DType operands) {
  auto w_of = [&](int64_t g) { return weight_of ? weight_of[g] : g; };
  const int64_t M = offsets[G];
  // Operands 0: dout, 1: weight (for dinp), 2: inp (for dweight).
  const Operands in = gemm_operands(grouped_operands(operands),
                                    {dout, dinp ? weight : nullptr, dweight ? inp : nullptr},
                                    {M * OC, W * OC * IC, M * IC});
  if (dinp) {
    Groups gs(in);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
      gs.add(false, false, IC, n, OC, 1, w_of(g) * OC * IC, IC, 0, r0 * OC, OC, 0.0f,
             dinp + r0 * IC, IC);
    }
    gs.run();
  }
  if (!dweight) return;
  for (int64_t round = 0;; ++round) {
    Groups gs(in);
    std::vector<int64_t> rank_in_weight(static_cast<size_t>(W), 0);
    bool any = false;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t w = w_of(g);
      if (rank_in_weight[static_cast<size_t>(w)]++ != round) continue;
      any = true;
      const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
      gs.add(false, true, IC, OC, n, 2, r0 * IC, IC, 0, r0 * OC, OC, 1.0f, dweight + w * OC * IC,
             IC);
    }
    if (!any) break;
    gs.run();
  }
}

}  // namespace llmt::cuda
