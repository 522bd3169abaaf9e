// CPU causal attention in flash-attention tiles of 64 queries x 64 keys, so scratch is per thread
// and O(T*D), never a (T,T) matrix. Tiles are zero-padded to whole vectors so every product
// runs through one register-blocked micro-kernel; exp is kernel_util's vectorisable polynomial.
// Dims: B batch, T sequence, H query heads, KV kv heads, D head dim, Dp = D rounded up to kVec.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"
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
constexpr float kMasked = -3e38f;  // a masked score: below kNegBig, so it never raises the max

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

// Tile bounds of a position array: per tile of kTile rows, the least and greatest position.
struct TileBounds {
  std::vector<int32_t> lo, hi;
};
TileBounds tile_bounds(const int32_t* pos, int64_t T) {
  const int64_t n = (T + kTile - 1) / kTile;
  TileBounds b{std::vector<int32_t>(static_cast<size_t>(n)),
               std::vector<int32_t>(static_cast<size_t>(n))};
  for (int64_t tb = 0; tb < n; ++tb) {
    const int64_t t0 = tb * kTile, t1 = std::min(T, t0 + kTile);
    b.lo[tb] = *std::min_element(pos + t0, pos + t1);
    b.hi[tb] = *std::max_element(pos + t0, pos + t1);
  }
  return b;
}

// The positions of a call: the given ones, or 0..T-1 (plain causal attention).
std::vector<int32_t> iota_positions(int64_t T) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) p[t] = static_cast<int32_t>(t);
  return p;
}

}  // namespace

// Work items are (b, h, query tile), a head's query tiles consecutive and the last first: with
// causal positions the last tiles see the most keys, neighbouring items share K/V in cache and
// the dynamic schedule ends on small items. An item streams the key tiles any of its queries can
// see (by the tiles' position bounds) with scores transposed, St = K Q^T (keys, queries), so the
// online softmax (running max m and sum l per query; o and l rescaled by exp(m_old - m_new))
// vectorises across queries, and only Q, once per item, needs a transposed copy. The mask is
// applied only to tile pairs that are not wholly visible.
void flash_forward(const AttnArgs& a) {
  LLMT_CHECK(a.KV > 0 && a.H % a.KV == 0, "n_head=", a.H, " is not a multiple of n_kv_head=", a.KV);
  const int64_t B = a.B, Tq = a.Tq, Tk = a.Tk, H = a.H, D = a.D;
  const int64_t Dp = round_up(D, kVec), group = H / a.KV;
  const int64_t q_tiles = (Tq + kTile - 1) / kTile, k_tiles = (Tk + kTile - 1) / kTile;
  const float scale = a.scale;
  const std::vector<int32_t> q_iota = a.q_pos ? std::vector<int32_t>() : iota_positions(Tq);
  const std::vector<int32_t> k_iota = a.k_pos ? std::vector<int32_t>() : iota_positions(Tk);
  const int32_t* qp = a.q_pos ? a.q_pos : q_iota.data();
  const int32_t* kp = a.k_pos ? a.k_pos : k_iota.data();
  const TileBounds qbnd = tile_bounds(qp, Tq), kbnd = tile_bounds(kp, Tk);
#pragma omp parallel
  {
    auto scratch = alloc_scratch(4 * kTile * Dp + kTile * kTile + 5 * kTile);
    float* qt = scratch.get();        // (Dp,kTile) queries times scale, transposed
    float* kbuf = qt + Dp * kTile;    // (kTile,Dp) keys, when they need padding
    float* vbuf = kbuf + kTile * Dp;  // (kTile,Dp) values, when they need padding
    float* o = vbuf + kTile * Dp;     // (kTile,Dp) unnormalised output
    float* st = o + kTile * Dp;       // (kTile keys,kTile queries) scores, then probabilities
    float* m = st + kTile * kTile;    // (kTile) running max of each query's scores
    float* m_new = m + kTile;         // (kTile) the max including this key tile
    float* alpha = m_new + kTile;     // (kTile) exp(m - m_new), the rescale of o and l
    float* l = alpha + kTile;         // (kTile) running sum of exp(score - m)
    float* qpos = l + kTile;          // (kTile) the tile's query positions, padding rows -inf
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < q_tiles * B * H; ++item) {
      const int64_t qb = q_tiles - 1 - item % q_tiles, b = item / q_tiles / H,
                    h = item / q_tiles % H;
      const int64_t g = h / group, q0 = qb * kTile, mq = std::min(kTile, Tq - q0);
      const int64_t mrows = round_up(mq, kRows);
      pack_transposed(qt, a.q + b * a.q_bs + q0 * a.q_ld + h * D, a.q_ld, mq, D, Dp, scale);
      for (int64_t i = 0; i < kTile; ++i)
        qpos[i] = i < mq ? static_cast<float>(qp[q0 + i]) : -1e30f;
      std::fill(o, o + mrows * Dp, 0.0f);
      std::fill(m, m + kTile, kNegBig);
      std::fill(l, l + kTile, 0.0f);
      for (int64_t kb = 0; kb < k_tiles; ++kb) {
        if (kbnd.lo[kb] > qbnd.hi[qb]) continue;  // no query of the tile sees a key of this one
        const bool whole = kbnd.hi[kb] <= qbnd.lo[qb] && mq == kTile;
        const int64_t k0 = kb * kTile, nk = std::min(kTile, Tk - k0);
        const int64_t krows = round_up(nk, kRows);
        // K (krows,Dp) and V (nk,Dp) are read in place unless they need zero padding.
        const float* k = a.k + b * a.kv_bs + k0 * a.kv_ld + g * D;
        const float* v = a.v + b * a.kv_bs + k0 * a.kv_ld + g * D;
        int64_t ldk = a.kv_ld, ldv = a.kv_ld;
        if (Dp != D || krows != nk) {
          pack_rows(kbuf, k, a.kv_ld, nk, krows, D, Dp, 1.0f);
          k = kbuf, ldk = Dp;
        }
        if (Dp != D) {
          pack_rows(vbuf, v, a.kv_ld, nk, nk, D, Dp, 1.0f);
          v = vbuf, ldv = Dp;
        }
        gemm<false>(st, kTile, k, ldk, qt, kTile, krows, kTile, Dp);
        // Key j is visible to query i when its position is not after the query's (and i < mq:
        // padding rows have position -inf).
        if (!whole)
          for (int64_t j = 0; j < nk; ++j) {
            float* sj = st + j * kTile;
            const float kpj = static_cast<float>(kp[k0 + j]);
#pragma omp simd
            for (int64_t i = 0; i < kTile; ++i) sj[i] = kpj <= qpos[i] ? sj[i] : kMasked;
          }
        std::copy(m, m + kTile, m_new);
        for (int64_t j = 0; j < nk; ++j) {
          const float* sj = st + j * kTile;
#pragma omp simd
          for (int64_t i = 0; i < kTile; ++i) m_new[i] = std::max(m_new[i], sj[i]);
        }
#pragma omp simd
        for (int64_t i = 0; i < kTile; ++i) {
          alpha[i] = exp_approx(m[i] - m_new[i]);
          l[i] *= alpha[i];
          m[i] = m_new[i];
        }
        for (int64_t j = 0; j < nk; ++j) {
          float* sj = st + j * kTile;
#pragma omp simd
          for (int64_t i = 0; i < kTile; ++i) {
            const float p = sj[i] == kMasked ? 0.0f : exp_approx(sj[i] - m[i]);
            sj[i] = p;
            l[i] += p;
          }
        }
        for (int64_t i = 0; i < mq; ++i) {
          float* oi = o + i * Dp;
          const float al = alpha[i];
#pragma omp simd
          for (int64_t d = 0; d < Dp; ++d) oi[d] *= al;
        }
        gemm<true, true>(o, Dp, st, kTile, v, ldv, mrows, Dp, nk);
      }
      for (int64_t i = 0; i < mq; ++i) {
        // A query that sees no key: output 0, lse -inf (it adds nothing when merged).
        const bool none = l[i] == 0.0f;
        const float inv = none ? 0.0f : 1.0f / l[i];
        float* yi = a.out + ((b * Tq + q0 + i) * H + h) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) yi[d] = o[i * Dp + d] * inv;
        a.lse[(b * H + h) * Tq + q0 + i] =
            none ? -std::numeric_limits<float>::infinity() : m[i] + std::log(l[i]);
      }
    }
  }
}

// FlashAttention-2 backward, one work item per (b, kv head) so dK/dV of the kv head and dQ of its
// query heads have one writer. Per query head the item packs q and dout, delta_i = dout_i . out_i
// and lse once and keeps a dQ accumulator: per-thread scratch O(Tq*D), like FlashAttention-2's dq
// accumulator. Then for each key tile (outer) and each query tile that sees any of its keys:
//   P = exp(Q K^T scale - lse), dV += P^T dO, dP = dO V^T, dS = P (dP - delta) scale,
//   dK += dS^T Q, dQ += dS K.
// Assigned: the first query head of the group assigns dK/dV, the others add, dQ is copied out.
// Accumulated: everything is added.
void flash_backward(const AttnArgs& a, const AttnGradViews& gr) {
  LLMT_CHECK(a.KV > 0 && a.H % a.KV == 0, "n_head=", a.H, " is not a multiple of n_kv_head=", a.KV);
  const int64_t B = a.B, Tq = a.Tq, Tk = a.Tk, H = a.H, D = a.D;
  const int64_t Dp = round_up(D, kVec), ldo = H * D, group = H / a.KV;
  const int64_t q_tiles = (Tq + kTile - 1) / kTile, k_tiles = (Tk + kTile - 1) / kTile;
  const int64_t Tqp = q_tiles * kTile;
  const float scale = a.scale;
  const std::vector<int32_t> q_iota = a.q_pos ? std::vector<int32_t>() : iota_positions(Tq);
  const std::vector<int32_t> k_iota = a.k_pos ? std::vector<int32_t>() : iota_positions(Tk);
  const int32_t* qp = a.q_pos ? a.q_pos : q_iota.data();
  const int32_t* kp = a.k_pos ? a.k_pos : k_iota.data();
  const TileBounds qbnd = tile_bounds(qp, Tq), kbnd = tile_bounds(kp, Tk);
#pragma omp parallel
  {
    auto scratch = alloc_scratch(5 * kTile * Dp + 2 * kTile * kTile + Tqp * (3 * Dp + 2));
    float* k = scratch.get();        // (kTile,Dp) keys
    float* kt = k + kTile * Dp;      // (Dp,kTile) keys transposed
    float* vt = kt + Dp * kTile;     // (Dp,kTile) values transposed
    float* dk = vt + Dp * kTile;     // (kTile,Dp) dK of the key tile
    float* dv = dk + kTile * Dp;     // (kTile,Dp) dV of the key tile
    float* p = dv + kTile * Dp;      // (kTile queries,kTile keys) scores, then P
    float* ds = p + kTile * kTile;   // (kTile,kTile) dP, then dS
    float* qa = ds + kTile * kTile;  // (Tqp,Dp) queries of the head, zero-padded
    float* ga = qa + Tqp * Dp;       // (Tqp,Dp) dout of the head
    float* dqa = ga + Tqp * Dp;      // (Tqp,Dp) dQ accumulator
    float* lse_a = dqa + Tqp * Dp;   // (Tqp) lse, 0 on padding rows
    float* delta = lse_a + Tqp;      // (Tqp) dout . out, 0 on padding rows
    std::vector<int32_t> kpos_tile(kTile);
    int32_t* kpt = kpos_tile.data();  // (kTile) the key tile's positions, int max past Tk
#pragma omp for schedule(dynamic)
    for (int64_t bg = 0; bg < B * a.KV; ++bg) {
      const int64_t b = bg / a.KV, kh = bg % a.KV;
      const float* kb_src = a.k + b * a.kv_bs + kh * D;
      const float* vb_src = a.v + b * a.kv_bs + kh * D;
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        pack_rows(qa, a.q + b * a.q_bs + h * D, a.q_ld, Tq, Tqp, D, Dp, 1.0f);
        pack_rows(ga, a.dout + b * Tq * ldo + h * D, ldo, Tq, Tqp, D, Dp, 1.0f);
        for (int64_t t = 0; t < Tqp; ++t) {
          float dot = 0.0f;
          if (t < Tq) {
            const float* yt = a.out_c + (b * Tq + t) * ldo + h * D;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += ga[t * Dp + d] * yt[d];
          }
          delta[t] = dot;
          lse_a[t] = t < Tq ? a.lse_c[(b * H + h) * Tq + t] : 0.0f;
        }
        std::fill(dqa, dqa + Tqp * Dp, 0.0f);
        for (int64_t kb = 0; kb < k_tiles; ++kb) {
          const int64_t k0 = kb * kTile, nk = std::min(kTile, Tk - k0);
          const int64_t krows = round_up(nk, kRows);
          pack_rows(k, kb_src + k0 * a.kv_ld, a.kv_ld, nk, nk, D, Dp, 1.0f);
          pack_transposed(kt, kb_src + k0 * a.kv_ld, a.kv_ld, nk, D, Dp, 1.0f);
          pack_transposed(vt, vb_src + k0 * a.kv_ld, a.kv_ld, nk, D, Dp, 1.0f);
          std::fill(dk, dk + kTile * Dp, 0.0f);
          std::fill(dv, dv + kTile * Dp, 0.0f);
          for (int64_t j = 0; j < kTile; ++j)
            kpt[j] = j < nk ? kp[k0 + j] : std::numeric_limits<int32_t>::max();
          for (int64_t qb = 0; qb < q_tiles; ++qb) {
            if (kbnd.lo[kb] > qbnd.hi[qb]) continue;  // no query of this tile sees the keys
            const int64_t q0 = qb * kTile, mq = std::min(kTile, Tq - q0);
            const int64_t qrows = round_up(mq, kRows);
            const float* q = qa + q0 * Dp;  // (qrows,Dp) of this tile
            const float* g = ga + q0 * Dp;
            gemm<false>(p, kTile, q, Dp, kt, kTile, qrows, kTile, Dp);
            gemm<false>(ds, kTile, g, Dp, vt, kTile, qrows, kTile, Dp);
            for (int64_t i = 0; i < qrows; ++i) {
              float* pi = p + i * kTile;
              float* dsi = ds + i * kTile;
              // key j is visible to query i when its position is not after i's; none to
              // padding rows (position -1) or columns (position int max)
              const int32_t qpi = i < mq ? qp[q0 + i] : -1;
              const float lse_i = lse_a[q0 + i], delta_i = delta[q0 + i];
#pragma omp simd
              for (int64_t j = 0; j < kTile; ++j) {
                const bool vis = kpt[j] <= qpi;
                const float e = exp_approx(pi[j] * scale - lse_i);
                const float pij = vis ? e : 0.0f;
                pi[j] = pij;
                dsi[j] = pij * (dsi[j] - delta_i) * scale;
              }
            }
            gemm<true, true>(dv, Dp, p, kTile, g, Dp, krows, Dp, mq);
            gemm<true, true>(dk, Dp, ds, kTile, q, Dp, krows, Dp, mq);
            gemm<true>(dqa + q0 * Dp, Dp, ds, kTile, k, Dp, qrows, Dp, nk);
          }
          const bool assign = !gr.accumulate && h == kh * group;
          float* dkb = gr.dk + b * gr.dkv_bs + kh * D;
          float* dvb = gr.dv + b * gr.dkv_bs + kh * D;
          for (int64_t j = 0; j < nk; ++j) {
            float* dkj = dkb + (k0 + j) * gr.dkv_ld;
            float* dvj = dvb + (k0 + j) * gr.dkv_ld;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) {
              dkj[d] = assign ? dk[j * Dp + d] : dkj[d] + dk[j * Dp + d];
              dvj[d] = assign ? dv[j * Dp + d] : dvj[d] + dv[j * Dp + d];
            }
          }
        }
        float* dqb = gr.dq + b * gr.dq_bs + h * D;
        for (int64_t t = 0; t < Tq; ++t) {
          float* dst = dqb + t * gr.dq_ld;
          const float* src = dqa + t * Dp;
          if (gr.accumulate) {
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
          } else {
            std::copy_n(src, D, dst);
          }
        }
      }
    }
  }
}

// ---- the fused-qkv entry points of kernels/ops.h ------------------------------------------------

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType /*operands: fp32 regardless*/, float scale) {
  AttnArgs a{qkv_operands(qkv, B, T, H, KV, D)};
  a.scale = scale;
  a.out = out;
  a.lse = lse;
  flash_forward(a);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DType /*operands: fp32 regardless*/, float scale) {
  AttnArgs a{qkv_operands(qkv, B, T, H, KV, D)};
  a.scale = scale;
  a.dout = dout;
  a.out_c = out;
  a.lse_c = lse;
  flash_backward(a, qkv_grads(dqkv, T, H, KV, D));
}

// ---- the block entry points (context parallelism) -----------------------------------------------

void attention_block_forward(float* out, float* lse, const float* q_src, int64_t Wq,
                             const float* kv_src, int64_t Wk, int64_t kv0, const int32_t* q_pos,
                             const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                             int64_t KV, int64_t D, float scale) {
  AttnArgs a{block_operands(q_src, Wq, kv_src, Wk, kv0, q_pos, k_pos, B, Tq, Tk, H, KV, D)};
  a.scale = scale;
  a.out = out;
  a.lse = lse;
  flash_forward(a);
}

void attention_block_backward(float* dq_src, float* dkv_src, const float* dout, const float* q_src,
                              int64_t Wq, const float* kv_src, int64_t Wk, int64_t kv0,
                              const float* out, const float* lse, const int32_t* q_pos,
                              const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                              int64_t KV, int64_t D, float scale) {
  AttnArgs a{block_operands(q_src, Wq, kv_src, Wk, kv0, q_pos, k_pos, B, Tq, Tk, H, KV, D)};
  a.scale = scale;
  a.dout = dout;
  a.out_c = out;
  a.lse_c = lse;
  flash_backward(a, block_grads(dq_src, dkv_src, kv0, a));
}

// Rows (b, h, t): weights e^(lse - lse') and e^(part_lse - lse'), where lse' = max + log(sum);
// both -inf (no key in either) leaves the row as it is.
void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse,
                     int64_t B, int64_t T, int64_t H, int64_t D) {
  parallel_for(B * H * T, grain_rows(D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float a = lse[r], p = part_lse[r];
      const float mx = std::max(a, p);
      if (mx == -std::numeric_limits<float>::infinity()) continue;
      const float wa = std::exp(a - mx), wp = std::exp(p - mx);
      const float sum = wa + wp;
      lse[r] = mx + std::log(sum);
      const float ca = wa / sum, cp = wp / sum;
      const int64_t b = r / (H * T), h = r / T % H, t = r % T;
      float* o = out + ((b * T + t) * H + h) * D;
      const float* po = part_out + ((b * T + t) * H + h) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] = ca * o[d] + cp * po[d];
    }
  });
}

void copy_heads(float* dst, int64_t Wd, int64_t dst_head, const float* src, int64_t Ws,
                int64_t src_head, int64_t n, int64_t N, int64_t D) {
  parallel_for(N, grain_rows(n * D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      std::copy_n(src + (r * Ws + src_head) * D, n * D, dst + (r * Wd + dst_head) * D);
  });
}

void copy_blocks(float* dst, int64_t Wd, const float* src, int64_t Ws, int64_t rows, int64_t n,
                 int64_t w, int64_t d0, int64_t ds, int64_t s0, int64_t ss, bool add) {
  parallel_for(rows, grain_rows(n * w), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t j = 0; j < n; ++j) {
        float* d = dst + r * Wd + d0 + j * ds;
        const float* s = src + r * Ws + s0 + j * ss;
        if (add) {
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) d[i] += s[i];
        } else {
          std::copy_n(s, w, d);
        }
      }
  });
}

}  // namespace llmt::cpu
