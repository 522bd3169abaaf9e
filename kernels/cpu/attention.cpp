// CPU causal attention as flash-attention tiles: per-thread scratch holds a few (64,64) tiles and
// never a (T,T) matrix. Tiles are packed padded to 16-float multiples so every product runs through
// one register-blocked micro-kernel, and exp is a branch-free polynomial the compiler vectorises.
// Dims: B batch, T sequence, H query heads, KV kv heads, D head dim, Dp = D rounded up to 16.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "engine/core/check.h"

namespace llmt::cpu {
namespace {

constexpr int64_t kTile = 64;  // query and key tile rows; only diagonal tiles need the causal mask
constexpr int64_t kVec = 16;   // floats per vector: one zmm with AVX-512, two ymm with AVX2
constexpr int kRows = 4;       // micro-kernel block: kRows x (up to 4 vectors) accumulators
constexpr float kNegBig = -1e30f;  // running-max start: finite, so m_old - m_new is never inf - inf

using vec = float __attribute__((vector_size(kVec * sizeof(float))));

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }

// c (kRows, NV*16) = [c +] a (kRows, K) . b (K, NV*16); ld* are row strides in floats. With
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
// M % kRows == 0, N % 16 == 0.
template <bool kAccumulate, bool kTransA = false>
void gemm(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb,
          int64_t M, int64_t N, int64_t K) {
  for (int64_t n = 0; n < N; n += 4 * kVec) {
    const int64_t nv = std::min<int64_t>(4, (N - n) / kVec);
    for (int64_t m = 0; m < M; m += kRows) {
      float* cm = c + m * ldc + n;
      const float* am = kTransA ? a + m : a + m * lda;
      switch (nv) {
        case 4: micro_kernel<4, kAccumulate, kTransA>(cm, ldc, am, lda, b + n, ldb, K); break;
        case 3: micro_kernel<3, kAccumulate, kTransA>(cm, ldc, am, lda, b + n, ldb, K); break;
        case 2: micro_kernel<2, kAccumulate, kTransA>(cm, ldc, am, lda, b + n, ldb, K); break;
        default: micro_kernel<1, kAccumulate, kTransA>(cm, ldc, am, lda, b + n, ldb, K); break;
      }
    }
  }
}

// exp(x) to ~1 ulp (Cephes expf): x = n ln2 + r, a polynomial in r, 2^n built in the exponent
// bits. Branch-free (rounding by adding 1.5*2^23) so `omp simd` loops vectorise it; x is clamped
// to [-87, 88], so exp(-inf) and exp(-1e30) come out as ~1e-38, not 0.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  const float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                    4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  return y * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
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

// dst (Dp, kTile) = the transpose of pack_rows(src, ld, n, kTile rows, D, Dp, s = 1).
void pack_transposed(float* dst, const float* src, int64_t ld, int64_t n, int64_t D, int64_t Dp) {
  std::fill(dst, dst + Dp * kTile, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < D; ++c) dst[c * kTile + i] = src[i * ld + c];
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

// Work items are (query tile, b, h), the largest (last) query tiles first so the dynamic schedule
// ends balanced. Each streams key tiles 0..diagonal with scores transposed, St = K Q^T (keys,
// queries), so the online softmax (running max m and sum l per query, output rescaled by
// exp(m_old - m_new)) vectorises across queries and only Q, once per item, is transposed.
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D) {
  LLMT_CHECK(KV > 0 && H % KV == 0, "n_head=", H, " is not a multiple of n_kv_head=", KV);
  const int64_t Dp = round_up(D, kVec), ld = (H + 2 * KV) * D, group = H / KV;
  const int64_t n_tiles = (T + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    auto scratch = alloc_scratch(3 * kTile * Dp + kTile * kTile + 4 * kTile);
    float* qt = scratch.get();       // (Dp,kTile) queries transposed
    float* kv = qt + Dp * kTile;     // (kTile,Dp) keys times scale, then values
    float* o = kv + kTile * Dp;      // (kTile,Dp) unnormalised output
    float* st = o + kTile * Dp;      // (kTile keys,kTile queries) scores, then probabilities
    float* m = st + kTile * kTile;   // (kTile) running max of each query's scores
    float* m_new = m + kTile;        // (kTile) the max including this key tile
    float* alpha = m_new + kTile;    // (kTile) exp(m - m_new), the rescale of o and l
    float* l = alpha + kTile;        // (kTile) running sum of exp(score - m)
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < n_tiles * B * H; ++item) {
      const int64_t qb = n_tiles - 1 - item / (B * H), b = item / H % B, h = item % H;
      const int64_t g = h / group, q0 = qb * kTile, mq = std::min(kTile, T - q0);
      const int64_t mrows = round_up(mq, kRows);
      const float* x = qkv + b * T * ld;  // (T,H+2KV,D) of batch row b
      pack_transposed(qt, x + q0 * ld + h * D, ld, mq, D, Dp);
      std::fill(o, o + mrows * Dp, 0.0f);
      std::fill(m, m + kTile, kNegBig);
      std::fill(l, l + kTile, 0.0f);
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t k0 = kb * kTile, nk = std::min(kTile, T - k0);
        pack_rows(kv, x + k0 * ld + (H + g) * D, ld, nk, round_up(nk, kRows), D, Dp, scale);
        gemm<false>(st, kTile, kv, Dp, qt, kTile, round_up(nk, kRows), kTile, Dp);
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
          alpha[i] = fast_exp(m[i] - m_new[i]);
          l[i] *= alpha[i];
          m[i] = m_new[i];
        }
        for (int64_t j = 0; j < nk; ++j) {
          float* sj = st + j * kTile;
          const int64_t first = k0 + j - q0;
#pragma omp simd
          for (int64_t i = 0; i < kTile; ++i) {
            const float e = fast_exp(sj[i] - m[i]);
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
        pack_rows(kv, x + k0 * ld + (H + KV + g) * D, ld, nk, nk, D, Dp, 1.0f);
        gemm<true, true>(o, Dp, st, kTile, kv, Dp, mrows, Dp, nk);
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
// query heads have one writer. For each key tile (outer), each of its query heads and each query
// tile on or below the diagonal: P = exp(Q K^T scale - lse), dV += P^T dO, dP = dO V^T,
// dS = P (dP - delta) scale, dK += dS^T Q, dQ += dS K, with delta_i = dout_i . out_i.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  LLMT_CHECK(KV > 0 && H % KV == 0, "n_head=", H, " is not a multiple of n_kv_head=", KV);
  const int64_t Dp = round_up(D, kVec), ld = (H + 2 * KV) * D, ldo = H * D, group = H / KV;
  const int64_t n_tiles = (T + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    auto scratch = alloc_scratch(8 * kTile * Dp + 2 * kTile * kTile);
    float* k = scratch.get();          // (kTile,Dp) keys
    float* kt = k + kTile * Dp;        // (Dp,kTile) keys transposed
    float* vt = kt + Dp * kTile;       // (Dp,kTile) values transposed
    float* q = vt + Dp * kTile;        // (kTile,Dp) queries
    float* g = q + kTile * Dp;         // (kTile,Dp) dout
    float* dq = g + kTile * Dp;        // (kTile,Dp) dQ of one tile pair
    float* dk = dq + kTile * Dp;       // (kTile,Dp) dK of the key tile, summed over heads
    float* dv = dk + kTile * Dp;       // (kTile,Dp) dV of the key tile, summed over heads
    float* p = dv + kTile * Dp;        // (kTile queries,kTile keys) scores, then P
    float* ds = p + kTile * kTile;     // (kTile,kTile) dP, then dS
#pragma omp for schedule(dynamic)
    for (int64_t bg = 0; bg < B * KV; ++bg) {
      const int64_t b = bg / KV, kh = bg % KV, h_begin = kh * group;
      const float* x = qkv + b * T * ld;  // (T,H+2KV,D) of batch row b
      float* dx = dqkv + b * T * ld;
      const float* y = out + b * T * ldo;  // (T,H,D)
      const float* dy = dout + b * T * ldo;
      for (int64_t t = 0; t < T; ++t) std::fill_n(dx + t * ld + h_begin * D, group * D, 0.0f);
      for (int64_t kb = 0; kb < n_tiles; ++kb) {
        const int64_t k0 = kb * kTile, nk = std::min(kTile, T - k0);
        const int64_t krows = round_up(nk, kRows);
        pack_rows(k, x + k0 * ld + (H + kh) * D, ld, nk, nk, D, Dp, 1.0f);
        pack_transposed(kt, x + k0 * ld + (H + kh) * D, ld, nk, D, Dp);
        pack_transposed(vt, x + k0 * ld + (H + KV + kh) * D, ld, nk, D, Dp);
        std::fill(dk, dk + kTile * Dp, 0.0f);
        std::fill(dv, dv + kTile * Dp, 0.0f);
        for (int64_t h = h_begin; h < h_begin + group; ++h) {
          for (int64_t qb = kb; qb < n_tiles; ++qb) {
            const int64_t q0 = qb * kTile, mq = std::min(kTile, T - q0);
            const int64_t qrows = round_up(mq, kRows);
            pack_rows(q, x + q0 * ld + h * D, ld, mq, qrows, D, Dp, 1.0f);
            pack_rows(g, dy + q0 * ldo + h * D, ldo, mq, qrows, D, Dp, 1.0f);
            gemm<false>(p, kTile, q, Dp, kt, kTile, qrows, kTile, Dp);
            gemm<false>(ds, kTile, g, Dp, vt, kTile, qrows, kTile, Dp);
            for (int64_t i = 0; i < qrows; ++i) {
              float* pi = p + i * kTile;
              float* dsi = ds + i * kTile;
              if (i >= mq) {  // padding rows: P = dS = 0
                std::fill_n(pi, kTile, 0.0f);
                std::fill_n(dsi, kTile, 0.0f);
                continue;
              }
              const int64_t visible = std::min(kTile, q0 + i - k0 + 1);  // keys [0, visible)
              const float lse_row = lse[(b * H + h) * T + q0 + i];
              const float* yi = y + (q0 + i) * ldo + h * D;
              float delta = 0.0f;  // dout_i . out_i
#pragma omp simd reduction(+ : delta)
              for (int64_t d = 0; d < D; ++d) delta += g[i * Dp + d] * yi[d];
#pragma omp simd
              for (int64_t j = 0; j < kTile; ++j) {
                const float e = fast_exp(pi[j] * scale - lse_row);
                const float pij = j < visible ? e : 0.0f;
                pi[j] = pij;
                dsi[j] = pij * (dsi[j] - delta) * scale;
              }
            }
            gemm<true, true>(dv, Dp, p, kTile, g, Dp, krows, Dp, mq);
            gemm<true, true>(dk, Dp, ds, kTile, q, Dp, krows, Dp, mq);
            gemm<false>(dq, Dp, ds, kTile, k, Dp, qrows, Dp, nk);
            for (int64_t i = 0; i < mq; ++i) {
              float* dxi = dx + (q0 + i) * ld + h * D;
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) dxi[d] += dq[i * Dp + d];
            }
          }
        }
        for (int64_t j = 0; j < nk; ++j) {
          std::copy_n(dk + j * Dp, D, dx + (k0 + j) * ld + (H + kh) * D);
          std::copy_n(dv + j * Dp, D, dx + (k0 + j) * ld + (H + KV + kh) * D);
        }
      }
    }
  }
}

}  // namespace llmt::cpu
