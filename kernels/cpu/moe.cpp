// Mixture-of-experts kernels (kernel_decls.inc, "mixture of experts"): the router's top-k and its
// gradient, the dispatch plan (counting by sequence and expert, capacity dropping), the row
// permutations between token order and expert order, and the grouped GEMM over the experts' row
// runs, all in fp32. The grouped GEMM is one OpenMP region over (expert, row or column block)
// tiles, each a single-threaded BLAS call (OpenBLAS runs serially inside a parallel region);
// with one thread, one BLAS call per expert.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/moe_math.h"

namespace llmt::cpu {
namespace {

// p (E) := softmax or sigmoid of z (E); returns logsumexp(z) (the z-loss reads it).
float router_scores(float* p, const float* z, int64_t E, bool sigmoid) {
  float mx = z[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, z[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(z[e] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  for (int64_t e = 0; e < E; ++e)
    p[e] = sigmoid ? 1.0f / (1.0f + std::exp(-z[e])) : std::exp(z[e] - lse);
  return lse;
}

// idx (k) := the k largest of p (E) + bias (E, may be null), decreasing, ties to the lower index,
// among the experts of the topk_group groups (of G groups of E/G consecutive experts) whose two
// largest keys sum highest, ties to the lower group. picked (G) is scratch.
void top_k(int32_t* idx, const float* p, const float* bias, int64_t E, int64_t k, int64_t G,
           int64_t topk_group, char* picked) {
  auto key = [&](int64_t e) { return bias ? p[e] + bias[e] : p[e]; };
  const int64_t per = E / G;
  std::fill(picked, picked + G, G == topk_group ? 1 : 0);
  if (G != topk_group) {
    auto group_score = [&](int64_t g) { return kernel_math::group_score(key, g * per, per); };
    for (int64_t i = 0; i < topk_group; ++i) {
      int64_t best = -1;
      float best_score = 0.0f;
      for (int64_t g = 0; g < G; ++g) {
        if (picked[g]) continue;
        const float s = group_score(g);
        if (best < 0 || s > best_score) {
          best = g;
          best_score = s;
        }
      }
      if (best < 0) break;  // (never: topk_group <= G)
      picked[best] = 1;
    }
  }
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = !picked[e / per];
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (!taken && (best < 0 || key(e) > key(best))) best = e;
    }
    idx[j] = static_cast<int32_t>(best);
  }
}

}  // namespace

void moe_route(float* scores, int32_t* idx, float* weights, const float* logits, const float* bias,
               int64_t N, int64_t E, int64_t k, bool sigmoid, bool normalize, int64_t G,
               int64_t topk_group, float scale) {
  parallel_for(N, grain_rows(E * 8), [&](int64_t begin, int64_t end) {
    std::vector<char> picked(static_cast<size_t>(G));
    for (int64_t t = begin; t < end; ++t) {
      float* p = scores + t * E;
      router_scores(p, logits + t * E, E, sigmoid);
      int32_t* ix = idx + t * k;
      top_k(ix, p, bias, E, k, G, topk_group, picked.data());
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += p[ix[j]];
      for (int64_t j = 0; j < k; ++j)
        weights[t * k + j] = (normalize ? p[ix[j]] / sum : p[ix[j]]) * scale;
    }
  });
}

void moe_dispatch(int32_t* counts, int32_t* offsets, int32_t* assign, int32_t* slot,
                  const int32_t* idx, const int32_t* rank_base, int64_t S, int64_t T, int64_t E,
                  int64_t k, int64_t H, int64_t capacity) {
  // kept (S,E): the assignments of each (sequence, expert) that stay; slot marks dropped ones -1.
  std::vector<int64_t> kept(static_cast<size_t>(S * E), 0);
  std::vector<int64_t> in_run(static_cast<size_t>(E));  // rank_base: the count within (j, run)
  const int64_t run = T / H;
  for (int64_t s = 0; s < S; ++s) {
    int32_t* c = counts + s * E;
    std::fill(c, c + E, 0);
    for (int64_t j = 0; j < k; ++j)  // (j, t) order: first choices rank before second ones
      for (int64_t t = s * T; t < (s + 1) * T; ++t) {
        const int32_t e = idx[t * k + j];
        int64_t rank = c[e];
        if (rank_base) {
          const int64_t h = (t - s * T) / run;
          if ((t - s * T) % run == 0) std::fill(in_run.begin(), in_run.end(), 0);
          rank = rank_base[((s * E + e) * k + j) * H + h] + in_run[static_cast<size_t>(e)]++;
        }
        const bool keep = capacity == 0 || rank < capacity;
        ++c[e];
        slot[t * k + j] = keep ? 0 : -1;
        if (keep) ++kept[s * E + e];
      }
  }
  // Expert-major, then sequence: the first permuted row of each (expert, sequence).
  std::vector<int64_t> next(static_cast<size_t>(S * E));
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    offsets[e] = static_cast<int32_t>(row);
    for (int64_t s = 0; s < S; ++s) {
      next[s * E + e] = row;
      row += kept[s * E + e];
    }
  }
  offsets[E] = static_cast<int32_t>(row);
  for (int64_t t = 0; t < S * T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t a = t * k + j;
      if (slot[a] < 0) continue;
      const int64_t r = next[(t / T) * E + idx[a]]++;
      slot[a] = static_cast<int32_t>(r);
      assign[r] = static_cast<int32_t>(a);
    }
  std::fill(assign + row, assign + S * T * k, -1);
}

void moe_permute(float* out, const float* in, const int32_t* assign, const float* weights,
                 int64_t N, int64_t C, int64_t k) {
  parallel_for(N * k, grain_rows(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int32_t a = assign[r];
      if (a < 0) continue;
      const float w = weights ? weights[a] : 1.0f;
      const float* src = in + (a / k) * C;
      float* dst = out + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dst[c] = src[c] * w;
    }
  });
}

void moe_unpermute(float* out, const float* in, const int32_t* slot, const float* weights,
                   int64_t N, int64_t C, int64_t k) {
  parallel_for(N, grain_rows(C * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* dst = out + t * C;
      std::fill(dst, dst + C, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t r = slot[t * k + j];
        if (r < 0) continue;
        const float w = weights ? weights[t * k + j] : 1.0f;
        const float* src = in + static_cast<int64_t>(r) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dst[c] += w * src[c];
      }
    }
  });
}

void moe_weights_backward(float* dweights, const float* dout, const float* in, const int32_t* slot,
                          int64_t N, int64_t C, int64_t k) {
  parallel_for(N, grain_rows(C * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t r = slot[t * k + j];
        float dot = 0.0f;
        if (r >= 0) {
          const float* a = dout + t * C;
          const float* b = in + static_cast<int64_t>(r) * C;
          for (int64_t c = 0; c < C; ++c) dot += a[c] * b[c];
        }
        dweights[t * k + j] = dot;
      }
  });
}

void moe_route_backward(float* dlogits, const float* dweights, const float* logits,
                        const int32_t* idx, const int32_t* counts, int64_t N, int64_t T, int64_t E,
                        int64_t k, bool sigmoid, bool normalize, float scale, float aux_scale,
                        float z_scale) {
  parallel_for(N, grain_rows(E * 8), [&](int64_t begin, int64_t end) {
    std::vector<float> p(static_cast<size_t>(E)), dp(static_cast<size_t>(E)),
        scaled(static_cast<size_t>(k));
    float* dw = scaled.data();
    for (int64_t t = begin; t < end; ++t) {
      const float* z = logits + t * E;
      const float lse = router_scores(p.data(), z, E, sigmoid);
      std::fill(dp.begin(), dp.end(), 0.0f);
      // The routing weights w_j = scale p[i_j] (/ their sum).
      const int32_t* ix = idx + t * k;
      for (int64_t j = 0; j < k; ++j) dw[j] = dweights[t * k + j] * scale;
      if (normalize) {
        float sum = 0.0f, wdw = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += p[ix[j]];
        for (int64_t j = 0; j < k; ++j) wdw += p[ix[j]] / sum * dw[j];
        for (int64_t j = 0; j < k; ++j) dp[ix[j]] += (dw[j] - wdw) / sum;
      } else {
        for (int64_t j = 0; j < k; ++j) dp[ix[j]] += dw[j];
      }
      // The aux loss, through q = p (softmax) or p / sum(p) (sigmoid).
      if (aux_scale != 0.0f) {
        const int32_t* c = counts + (t / T) * E;
        if (!sigmoid) {
          for (int64_t e = 0; e < E; ++e) dp[e] += aux_scale * static_cast<float>(c[e]);
        } else {
          float sum = 0.0f, qdq = 0.0f;
          for (int64_t e = 0; e < E; ++e) sum += p[e];
          for (int64_t e = 0; e < E; ++e) qdq += p[e] / sum * aux_scale * static_cast<float>(c[e]);
          for (int64_t e = 0; e < E; ++e)
            dp[e] += (aux_scale * static_cast<float>(c[e]) - qdq) / sum;
        }
      }
      float* dz = dlogits + t * E;
      if (!sigmoid) {
        float pdp = 0.0f;
        for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[e];
        for (int64_t e = 0; e < E; ++e) dz[e] = p[e] * (dp[e] - pdp);
      } else {
        for (int64_t e = 0; e < E; ++e) dz[e] = dp[e] * p[e] * (1.0f - p[e]);
      }
      if (z_scale != 0.0f)
        for (int64_t e = 0; e < E; ++e) dz[e] += z_scale * lse * std::exp(z[e] - lse);
    }
  });
}

void moe_route_losses(float* aux, float* zsq, const float* logits, const int32_t* counts, int64_t S,
                      int64_t T, int64_t E, int64_t k, bool sigmoid) {
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<double> mean_q(static_cast<size_t>(E));
  for (int64_t s = 0; s < S; ++s) {
    std::fill(mean_q.begin(), mean_q.end(), 0.0);
    for (int64_t t = s * T; t < (s + 1) * T; ++t) {
      const float lse = router_scores(p.data(), logits + t * E, E, sigmoid);
      zsq[t] = lse * lse;
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += sigmoid ? p[e] : 0.0;
      for (int64_t e = 0; e < E; ++e) mean_q[e] += sigmoid ? p[e] / sum : p[e];
    }
    double a = 0.0;
    for (int64_t e = 0; e < E; ++e)
      a += static_cast<double>(counts[s * E + e]) / static_cast<double>(T * k) * mean_q[e] /
           static_cast<double>(T);
    aux[s] = static_cast<float>(static_cast<double>(E) * a);
  }
}

namespace {

// One tile of a grouped GEMM: group g, and a block [b, e) of its rows (or columns).
struct Tile {
  int64_t g, b, e;
};

// Tiles over each group's `extent(g)` in blocks of `block`.
template <typename Extent>
std::vector<Tile> tiles(int64_t G, int64_t block, Extent&& extent) {
  std::vector<Tile> out;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t b = 0, n = extent(g); b < n; b += block)
      out.push_back({g, b, std::min(n, b + block)});
  return out;
}

template <typename Body>
void run_tiles(const std::vector<Tile>& ts, int nt, Body&& body) {
  const auto n = static_cast<int64_t>(ts.size());
#pragma omp parallel for schedule(dynamic) num_threads(nt) if (nt > 1 && n > 1)
  for (int64_t i = 0; i < n; ++i) body(ts[static_cast<size_t>(i)]);
}

// Tiles of a grouped GEMM: as large as possible (a GEMM runs fastest on whole operands) while
// there are about 4 per thread to balance uneven groups; never below 64 rows or columns. With one
// thread, one tile per group.
constexpr int64_t kMinTile = 64;
int64_t tile_size(int64_t total, int nt) {
  if (nt <= 1) return std::max<int64_t>(total, 1);
  return std::max<int64_t>(kMinTile, (total + 4 * nt - 1) / (4 * nt));
}

// bf16 grouped GEMMs through oneDNN (gemm_bf16.h). oneDNN builds a kernel for each GEMM shape it
// meets (a JIT compile, costing as much as running it), and routing gives every group another
// row count each step; so each group's rows go to oneDNN padded with zero rows to a bucket (a
// multiple of 64, or of a quarter of the largest power of two <= n: at most 25% more rows, about
// four shapes per doubling), whose kernels oneDNN's primitive cache then keeps. Zero rows add
// exact zeros to a weight gradient; their output rows are dropped.
int64_t padded_rows(int64_t n) {
  if (n == 0) return 0;
  int64_t p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int64_t q = std::max<int64_t>(64, p2 / 4);
  return (n + q - 1) / q * q;
}

struct PaddedGroups {
  std::vector<int64_t> at;  // (G+1): group g's rows start at row at[g] of a padded array

  PaddedGroups(const int64_t* offsets, int64_t G) : at(static_cast<size_t>(G) + 1, 0) {
    for (int64_t g = 0; g < G; ++g) at[g + 1] = at[g] + padded_rows(offsets[g + 1] - offsets[g]);
  }
  // x's group rows (K wide) as bf16 at the padded rows, zeros after each group's rows, in this
  // thread's buffer `slot` (0-2).
  const uint16_t* bf16(int slot, const float* x, const int64_t* offsets, int64_t K) const {
    thread_local std::vector<uint16_t> buffers[3];
    std::vector<uint16_t>& b = buffers[slot];
    const auto G = static_cast<int64_t>(at.size()) - 1;
    b.resize(static_cast<size_t>(at[G] * K));
    for (int64_t g = 0; g < G; ++g) {
      const int64_t n = (offsets[g + 1] - offsets[g]) * K;
      convert(b.data() + at[g] * K, DType::bf16, x + offsets[g] * K, DType::f32, n);
      std::fill(b.data() + at[g] * K + n, b.data() + at[g + 1] * K, uint16_t{0});  // padding
    }
    return b.data();
  }
  // A padded fp32 result (at[G], K) in this thread's buffer; copy_out moves the group rows.
  float* result(int64_t K) const {
    thread_local std::vector<float> b;
    b.resize(static_cast<size_t>(at.back() * K));
    return b.data();
  }
  void copy_out(float* dst, const float* padded, const int64_t* offsets, int64_t K) const {
    for (size_t g = 0; g + 1 < at.size(); ++g)
      std::copy(padded + at[g] * K, padded + (at[g] + offsets[g + 1] - offsets[g]) * K,
                dst + offsets[g] * K);
  }
};

}  // namespace

// With bf16 operands on a CPU that multiplies them (gemm_bf16.h): one oneDNN GEMM per group on
// padded rows (PaddedGroups), each threaded by oneDNN, a weight's groups added in group order.
void grouped_linear_forward(float* out, const float* inp, const float* weight,
                            const int64_t* offsets, const int64_t* weight_of, int64_t G, int64_t W,
                            int64_t IC, int64_t OC, DType operands) {
  if (dnnl_bf16(operands)) {
    const PaddedGroups pad(offsets, G);
    const uint16_t* in16 = pad.bf16(0, inp, offsets, IC);
    const uint16_t* w16 = bf16_copy(1, weight, W * OC * IC);
    float* res = pad.result(OC);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t n = pad.at[g + 1] - pad.at[g], w = weight_of ? weight_of[g] : g;
      if (n > 0)
        gemm_bf16_copies(res + pad.at[g] * OC, in16 + pad.at[g] * IC, false, w16 + w * OC * IC,
                         true, n, OC, IC, false);
    }
    pad.copy_out(out, res, offsets, OC);
    return;
  }
  const int64_t M = offsets[G] - offsets[0];
  const int nt = threads_for(M * IC * OC / 64, kGrainElems * 16);
  const auto ts =
      tiles(G, tile_size(M, nt), [&](int64_t g) { return offsets[g + 1] - offsets[g]; });
  run_tiles(ts, nt, [&](const Tile& t) {
    const int64_t r0 = offsets[t.g] + t.b, n = t.e - t.b;
    const int64_t w = weight_of ? weight_of[t.g] : t.g;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, OC, IC, 1.0f, inp + r0 * IC, IC,
                weight + w * OC * IC, IC, 0.0f, out + r0 * OC, OC);
  });
}

void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const int64_t* offsets, const int64_t* weight_of,
                             int64_t G, int64_t W, int64_t IC, int64_t OC, DType operands) {
  const int64_t M = offsets[G] - offsets[0];
  const int nt = threads_for(M * IC * OC / 64, kGrainElems * 16);
  auto w_of = [&](int64_t g) { return weight_of ? weight_of[g] : g; };
  if (dnnl_bf16(operands)) {
    const PaddedGroups pad(offsets, G);
    const uint16_t* dout16 = pad.bf16(0, dout, offsets, OC);
    const uint16_t* w16 = dinp ? bf16_copy(1, weight, W * OC * IC) : nullptr;
    const uint16_t* in16 = dweight ? pad.bf16(2, inp, offsets, IC) : nullptr;
    float* res = dinp ? pad.result(IC) : nullptr;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r0 = pad.at[g], n = pad.at[g + 1] - r0;
      if (n == 0) continue;
      if (dinp)
        gemm_bf16_copies(res + r0 * IC, dout16 + r0 * OC, false, w16 + w_of(g) * OC * IC, false, n,
                         IC, OC, false);
      if (dweight)
        gemm_bf16_copies(dweight + w_of(g) * OC * IC, dout16 + r0 * OC, true, in16 + r0 * IC, false,
                         OC, IC, n, true);
    }
    if (dinp) pad.copy_out(dinp, res, offsets, IC);
    return;
  }
  if (dinp) {  // rows of (n,IC) = (n,OC) @ (OC,IC)
    const auto ts =
        tiles(G, tile_size(M, nt), [&](int64_t g) { return offsets[g + 1] - offsets[g]; });
    run_tiles(ts, nt, [&](const Tile& t) {
      const int64_t r0 = offsets[t.g] + t.b, n = t.e - t.b;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, IC, OC, 1.0f, dout + r0 * OC, OC,
                  weight + w_of(t.g) * OC * IC, IC, 0.0f, dinp + r0 * IC, IC);
    });
  }
  if (dweight) {
    // Tiles over (weight, rows [b, e) of its (OC,IC) gradient); each adds its groups' (n,OC)^T @
    // (n,IC) in group order, so two groups of one weight never write at once.
    std::vector<std::vector<int64_t>> groups(static_cast<size_t>(W));
    for (int64_t g = 0; g < G; ++g)
      if (offsets[g + 1] > offsets[g]) groups[static_cast<size_t>(w_of(g))].push_back(g);
    int64_t used = 0;
    for (const auto& gs : groups) used += !gs.empty();
    const auto ts = tiles(W, tile_size(used * OC, nt), [&](int64_t w) {
      return groups[static_cast<size_t>(w)].empty() ? int64_t{0} : OC;
    });
    run_tiles(ts, nt, [&](const Tile& t) {
      for (const int64_t g : groups[static_cast<size_t>(t.g)]) {
        const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t.e - t.b, IC, n, 1.0f,
                    dout + r0 * OC + t.b, OC, inp + r0 * IC, IC, 1.0f,
                    dweight + t.g * OC * IC + t.b * IC, IC);
      }
    });
  }
}

}  // namespace llmt::cpu
