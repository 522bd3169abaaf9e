// CPU causal attention in flash-attention tiles of 64 queries x 64 keys, so scratch is per thread
// and O(T*D), never a (T,T) matrix. Tiles are zero-padded to whole vectors so every product
// runs through one register-blocked micro-kernel; exp is kernel_util's vectorisable polynomial.
// Dims: B batch, T sequence, H query heads, KV kv heads, D head dim, Dp = D rounded up to kVec.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>

#include "engine/core/check.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

constexpr int64_t kTile = 64;  // query and key tile rows; only diagonal tiles need the causal mask
// Floats per vector and rows per micro-kernel block: kRows x 2 vector accumulators, half of the
// vector registers (32 with AVX-512, 16 below).
#if defined(__AVX512F__)
constexpr int64_t kVec = 16;
constexpr int kRows = 8;
#elif defined(__AVX__)
constexpr int64_t kVec = 8;
constexpr int kRows = 4;
#else
constexpr int64_t kVec = 4;
constexpr int kRows = 4;
#endif
constexpr float kNegBig = -1e30f;  // running-max start: finite, so m_old - m_new is never inf - inf

using vec = float __attribute__((vector_size(kVec * sizeof(float))));

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store(float* p, vec v) {
  std::memcpy(p, &v, sizeof v);
}

// c (kRows, NV*kVec) = [c +] a (kRows, K) . b (K, NV*kVec); ld* are row strides in floats. With
// kTransA, a is stored transposed: element (r, k) at a[k * lda + r].
template <int NV, bool kAccumulate, bool kTransA>
void micro_kernel(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb,
                  int64_t K) {
  vec acc[kRows][NV];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = kAccumulate ? load(c + r * ldc + v * kVec) : vec{};
  for (int64_t k = 0; k < K; ++k) {
    vec bk[NV];
    for (int v = 0; v < NV; ++v) bk[v] = load(b + k * ldb + v * kVec);
    for (int r = 0; r < kRows; ++r) {
      const float ark = kTransA ? a[k * lda + r] : a[r * lda + k];
      for (int v = 0; v < NV; ++v) acc[r][v] += ark * bk[v];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * kVec, acc[r][v]);
}

// c (M,N) = [c +] a (M,K) . b (K,N), row-major, a stored transposed (K,M) with kTransA;
// M % kRows == 0, N % kVec == 0.
template <bool kAccumulate, bool kTransA = false>
void gemm(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb,
          int64_t M, int64_t N, int64_t K) {
  for (int64_t n = 0; n < N; n += 2 * kVec) {
    for (int64_t m = 0; m < M; m += kRows) {
      float* cm = c + m * ldc + n;
      const float* am = kTransA ? a + m : a + m * lda;
      if (N - n >= 2 * kVec)
        micro_kernel<2, kAccumulate, kTransA>(cm, ldc, am, lda, b + n, ldb, K);
      else
        micro_kernel<1, kAccumulate, kTransA>(cm, ldc, am, lda, b + n, ldb, K);
    }
  }
}

// dst (rows, Dp) = s * the first D floats of n rows of src (row stride ld); the rest zero.
void pack_rows(float* dst, const float* src, int64_t ld, int64_t n, int64_t rows, int64_t D,
               int64_t Dp, float s) {
  for (int64_t i = 0; i < rows; ++i) {
    float* d = dst + i * Dp;
    const int64_t valid = i < n ? D : 0;
    for (int64_t c = 0; c < valid; ++c) d[c] = s * src[i * ld + c];
    std::fill(d + valid, d + Dp, 0.0f);
  }
}

// dst (Dp, kTile) = the transpose of pack_rows(dst, src, ld, n, kTile, D, Dp, s).
void pack_transposed(float* dst, const float* src, int64_t ld, int64_t n, int64_t D, int64_t Dp,
                     float s) {
  std::fill(dst, dst + Dp * kTile, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < D; ++c) dst[c * kTile + i] = s * src[i * ld + c];
}

// 64-byte aligned per-thread scratch: tiles start on cache lines, so vector loads never split.
struct AlignedDelete {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
std::unique_ptr<float[], AlignedDelete> alloc_scratch(int64_t n) {
  return std::unique_ptr<float[], AlignedDelete>(static_cast<float*>(
      ::operator new[](static_cast<size_t>(n) * sizeof(float), std::align_val_t{64})));
}

}  // namespace

// Work items are (b, h, query tile), a head's query tiles consecutive and the largest (last) first:
// neighbouring items share K/V in cache and the dynamic schedule ends on small items. An item
// streams key tiles 0..diagonal with scores transposed, St = K Q^T (keys, queries), so the online
// softmax (running max m and sum l per query; o and l rescaled by exp(m_old - m_new)) vectorises
// across queries, and only Q, once per item, needs a transposed copy.
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType /*operands: fp32 regardless*/) {
  LLMT_CHECK(KV > 0 && H % KV == 0, "n_head=", H, " is not a multiple of n_kv_head=", KV);
  const int64_t Dp = round_up(D, kVec), ld = (H + 2 * KV) * D, group = H / KV;
  const int64_t n_tiles = (T + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    auto scratch = alloc_scratch(4 * kTile * Dp + kTile * kTile + 4 * kTile);
    float* qt = scratch.get();        // (Dp,kTile) queries times scale, transposed
    float* kbuf = qt + Dp * kTile;    // (kTile,Dp) keys, when they need padding
    float* vbuf = kbuf + kTile * Dp;  // (kTile,Dp) values, when they need padding
    float* o = vbuf + kTile * Dp;     // (kTile,Dp) unnormalised output
    float* st = o + kTile * Dp;       // (kTile keys,kTile queries) scores, then probabilities
    float* m = st + kTile * kTile;    // (kTile) running max of each query's scores
    float* m_new = m + kTile;         // (kTile) the max including this key tile
    float* alpha = m_new + kTile;     // (kTile) exp(m - m_new), the rescale of o and l
    float* l = alpha + kTile;         // (kTile) running sum of exp(score - m)
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < n_tiles * B * H; ++item) {
      const int64_t qb = n_tiles - 1 - item % n_tiles, b = item / n_tiles / H,
                    h = item / n_tiles % H;
      const int64_t g = h / group, q0 = qb * kTile, mq = std::min(kTile, T - q0);
      const int64_t mrows = round_up(mq, kRows);
      const float* x = qkv + b * T * ld;  // (T,H+2KV,D) of batch row b
      pack_transposed(qt, x + q0 * ld + h * D, ld, mq, D, Dp, scale);
      std::fill(o, o + mrows * Dp, 0.0f);
      std::fill(m, m + kTile, kNegBig);
      std::fill(l, l + kTile, 0.0f);
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t k0 = kb * kTile, nk = std::min(kTile, T - k0);
        const int64_t krows = round_up(nk, kRows);
        // K (krows,Dp) and V (nk,Dp) are read in place from qkv unless they need zero padding.
        const float* k = x + k0 * ld + (H + g) * D;
        const float* v = x + k0 * ld + (H + KV + g) * D;
        int64_t ldk = ld, ldv = ld;
        if (Dp != D || krows != nk) {
          pack_rows(kbuf, k, ld, nk, krows, D, Dp, 1.0f);
          k = kbuf, ldk = Dp;
        }
        if (Dp != D) {
          pack_rows(vbuf, v, ld, nk, nk, D, Dp, 1.0f);
          v = vbuf, ldv = Dp;
        }
        gemm<false>(st, kTile, k, ldk, qt, kTile, krows, kTile, Dp);
        // Key j is visible to queries i >= k0 + j - q0 (causal) and i < mq.
        std::copy(m, m + kTile, m_new);
        for (int64_t j = 0; j < nk; ++j) {
          const float* sj = st + j * kTile;
          const int64_t first = k0 + j - q0;
#pragma omp simd
          for (int64_t i = 0; i < kTile; ++i)
            m_new[i] = std::max(m_new[i], i >= first && i < mq ? sj[i] : kNegBig);
        }
#pragma omp simd
        for (int64_t i = 0; i < kTile; ++i) {
          alpha[i] = exp_approx(m[i] - m_new[i]);
          l[i] *= alpha[i];
          m[i] = m_new[i];
        }
        for (int64_t j = 0; j < nk; ++j) {
          float* sj = st + j * kTile;
          const int64_t first = k0 + j - q0;
#pragma omp simd
          for (int64_t i = 0; i < kTile; ++i) {
            const float e = exp_approx(sj[i] - m[i]);
            const float p = i >= first && i < mq ? e : 0.0f;
            sj[i] = p;
            l[i] += p;
          }
        }
        for (int64_t i = 0; i < mq; ++i) {
          float* oi = o + i * Dp;
          const float a = alpha[i];
#pragma omp simd
          for (int64_t d = 0; d < Dp; ++d) oi[d] *= a;
        }
        gemm<true, true>(o, Dp, st, kTile, v, ldv, mrows, Dp, nk);
      }
      for (int64_t i = 0; i < mq; ++i) {
        const float inv = 1.0f / l[i];
        float* yi = out + ((b * T + q0 + i) * H + h) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) yi[d] = o[i * Dp + d] * inv;
        lse[(b * H + h) * T + q0 + i] = m[i] + std::log(l[i]);
      }
    }
  }
}

// FlashAttention-2 backward, one work item per (b, kv head) so dK/dV of the kv head and dQ of its
// query heads have one writer. Per query head the item packs q and dout, delta_i = dout_i . out_i
// and lse once and keeps a dQ accumulator: per-thread scratch O(T*D), like FlashAttention-2's dq
// accumulator. Then for each key tile (outer) and query tile on or below the diagonal:
//   P = exp(Q K^T scale - lse), dV += P^T dO, dP = dO V^T, dS = P (dP - delta) scale,
//   dK += dS^T Q, dQ += dS K.
// The first query head of the group assigns dK/dV, the others add to them.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DType /*operands: fp32 regardless*/) {
  LLMT_CHECK(KV > 0 && H % KV == 0, "n_head=", H, " is not a multiple of n_kv_head=", KV);
  const int64_t Dp = round_up(D, kVec), ld = (H + 2 * KV) * D, ldo = H * D, group = H / KV;
  const int64_t n_tiles = (T + kTile - 1) / kTile, Tp = n_tiles * kTile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    auto scratch = alloc_scratch(5 * kTile * Dp + 2 * kTile * kTile + Tp * (3 * Dp + 2));
    float* k = scratch.get();        // (kTile,Dp) keys
    float* kt = k + kTile * Dp;      // (Dp,kTile) keys transposed
    float* vt = kt + Dp * kTile;     // (Dp,kTile) values transposed
    float* dk = vt + Dp * kTile;     // (kTile,Dp) dK of the key tile
    float* dv = dk + kTile * Dp;     // (kTile,Dp) dV of the key tile
    float* p = dv + kTile * Dp;      // (kTile queries,kTile keys) scores, then P
    float* ds = p + kTile * kTile;   // (kTile,kTile) dP, then dS
    float* qa = ds + kTile * kTile;  // (Tp,Dp) queries of the head, zero-padded
    float* ga = qa + Tp * Dp;        // (Tp,Dp) dout of the head
    float* dqa = ga + Tp * Dp;       // (Tp,Dp) dQ accumulator
    float* lse_a = dqa + Tp * Dp;    // (Tp) lse, 0 on padding rows
    float* delta = lse_a + Tp;       // (Tp) dout . out, 0 on padding rows
#pragma omp for schedule(dynamic)
    for (int64_t bg = 0; bg < B * KV; ++bg) {
      const int64_t b = bg / KV, kh = bg % KV;
      const float* x = qkv + b * T * ld;  // (T,H+2KV,D) of batch row b
      float* dx = dqkv + b * T * ld;
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        pack_rows(qa, x + h * D, ld, T, Tp, D, Dp, 1.0f);
        pack_rows(ga, dout + b * T * ldo + h * D, ldo, T, Tp, D, Dp, 1.0f);
        for (int64_t t = 0; t < Tp; ++t) {
          float dot = 0.0f;
          if (t < T) {
            const float* yt = out + (b * T + t) * ldo + h * D;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += ga[t * Dp + d] * yt[d];
          }
          delta[t] = dot;
          lse_a[t] = t < T ? lse[(b * H + h) * T + t] : 0.0f;
        }
        std::fill(dqa, dqa + Tp * Dp, 0.0f);
        for (int64_t kb = 0; kb < n_tiles; ++kb) {
          const int64_t k0 = kb * kTile, nk = std::min(kTile, T - k0);
          const int64_t krows = round_up(nk, kRows);
          pack_rows(k, x + k0 * ld + (H + kh) * D, ld, nk, nk, D, Dp, 1.0f);
          pack_transposed(kt, x + k0 * ld + (H + kh) * D, ld, nk, D, Dp, 1.0f);
          pack_transposed(vt, x + k0 * ld + (H + KV + kh) * D, ld, nk, D, Dp, 1.0f);
          std::fill(dk, dk + kTile * Dp, 0.0f);
          std::fill(dv, dv + kTile * Dp, 0.0f);
          for (int64_t qb = kb; qb < n_tiles; ++qb) {
            const int64_t q0 = qb * kTile, mq = std::min(kTile, T - q0);
            const int64_t qrows = round_up(mq, kRows);
            const float* q = qa + q0 * Dp;  // (qrows,Dp) of this tile
            const float* g = ga + q0 * Dp;
            gemm<false>(p, kTile, q, Dp, kt, kTile, qrows, kTile, Dp);
            gemm<false>(ds, kTile, g, Dp, vt, kTile, qrows, kTile, Dp);
            for (int64_t i = 0; i < qrows; ++i) {
              float* pi = p + i * kTile;
              float* dsi = ds + i * kTile;
              // keys [0, visible) of the tile are visible to query i; none to padding rows
              const int64_t visible = i < mq ? std::min(kTile, q0 + i - k0 + 1) : 0;
              const float lse_i = lse_a[q0 + i], delta_i = delta[q0 + i];
#pragma omp simd
              for (int64_t j = 0; j < kTile; ++j) {
                const float e = exp_approx(pi[j] * scale - lse_i);
                const float pij = j < visible ? e : 0.0f;
                pi[j] = pij;
                dsi[j] = pij * (dsi[j] - delta_i) * scale;
              }
            }
            gemm<true, true>(dv, Dp, p, kTile, g, Dp, krows, Dp, mq);
            gemm<true, true>(dk, Dp, ds, kTile, q, Dp, krows, Dp, mq);
            gemm<true>(dqa + q0 * Dp, Dp, ds, kTile, k, Dp, qrows, Dp, nk);
          }
          const bool assign = h == kh * group;
          for (int64_t j = 0; j < nk; ++j) {
            float* dkj = dx + (k0 + j) * ld + (H + kh) * D;
            float* dvj = dx + (k0 + j) * ld + (H + KV + kh) * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) {
              dkj[d] = assign ? dk[j * Dp + d] : dkj[d] + dk[j * Dp + d];
              dvj[d] = assign ? dv[j * Dp + d] : dvj[d] + dv[j * Dp + d];
            }
          }
        }
        for (int64_t t = 0; t < T; ++t) std::copy_n(dqa + t * Dp, D, dx + t * ld + h * D);
      }
    }
  }
}

}  // namespace llmt::cpu
