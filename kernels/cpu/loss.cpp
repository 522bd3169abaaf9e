// Fused softmax cross-entropy. Each row's logsumexp comes from one pass with an online max/sum,
// taken in blocks so the max and the exp-sum vectorise; the gradient pass then rereads the row
// (still in cache) and may overwrite it in place. Probabilities are never stored. The shard
// variants split the same computation at its two reductions (row max, then exp-sum and target
// logit), so a vocab-parallel caller reduces those over tp between the calls.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

// log(sum(exp(x))) over a row of V.
float row_logsumexp(const float* x, int64_t V) {
  constexpr int64_t kBlock = 256;
  float m = -INFINITY, s = 0.0f;
  for (int64_t b = 0; b < V; b += kBlock) {
    const int64_t e = std::min(V, b + kBlock);
    float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
    for (int64_t i = b; i < e; ++i) bm = std::max(bm, x[i]);
    if (bm > m) {
      s *= exp_approx(m - bm);
      m = bm;
    }
    float bs = 0.0f;
#pragma omp simd reduction(+ : bs)
    for (int64_t i = b; i < e; ++i) bs += exp_approx(x[i] - m);
    s += bs;
  }
  return m + std::log(s);
}

}  // namespace

void softmax_cross_entropy(float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int64_t N, int64_t V, float dloss) {
  for (int64_t n = 0; n < N; ++n)
    LLMT_CHECK(targets[n] < V, "softmax_cross_entropy: target ", targets[n], " at row ", n,
               " is outside the vocabulary [0, ", V, ")");
  parallel_for(N, grain_rows(V), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* x = logits + n * V;
      const int32_t target = targets[n];
      if (target < 0) {
        losses[n] = 0.0f;
        if (dlogits) std::fill(dlogits + n * V, dlogits + (n + 1) * V, 0.0f);
        continue;
      }
      const float lse = row_logsumexp(x, V);
      losses[n] = lse - x[target];  // read before dlogits may overwrite x
      if (!dlogits) continue;
      float* d = dlogits + n * V;
#pragma omp simd
      for (int64_t i = 0; i < V; ++i) d[i] = exp_approx(x[i] - lse) * dloss;
      d[target] -= dloss;
    }
  });
}

}  // namespace llmt::cpu

namespace llmt::cpu {
namespace {

void check_targets(const int32_t* targets, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n)
    LLMT_CHECK(targets[n] < V, "cross_entropy: target ", targets[n], " at row ", n,
               " is outside the vocabulary [0, ", V, ")");
}

}  // namespace

void cross_entropy_shard_max(float* max, const float* logits, const int32_t* targets, int64_t N,
                             int64_t Vl, int64_t V) {
  check_targets(targets, N, V);
  parallel_for(N, grain_rows(Vl), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* x = logits + n * Vl;
      float m = -INFINITY;
#pragma omp simd reduction(max : m)
      for (int64_t i = 0; i < Vl; ++i) m = std::max(m, x[i]);
      max[n] = m;
    }
  });
}

void cross_entropy_shard_sums(float* sums, const float* logits, const float* max,
                              const int32_t* targets, int64_t N, int64_t Vl, int64_t vocab_start) {
  parallel_for(N, grain_rows(Vl), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* x = logits + n * Vl;
      const float m = max[n];
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < Vl; ++i) s += exp_approx(x[i] - m);
      sums[n] = s;
      const int64_t t = static_cast<int64_t>(targets[n]) - vocab_start;
      sums[N + n] = targets[n] >= 0 && t >= 0 && t < Vl ? x[t] : 0.0f;
    }
  });
}

void cross_entropy_shard_finish(float* losses, float* dlogits, const float* logits,
                                const float* max, const float* sums, const int32_t* targets,
                                int64_t N, int64_t Vl, int64_t vocab_start, float dloss) {
  parallel_for(N, grain_rows(Vl), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* x = logits + n * Vl;
      float* d = dlogits ? dlogits + n * Vl : nullptr;
      if (targets[n] < 0) {
        losses[n] = 0.0f;
        if (d) std::fill(d, d + Vl, 0.0f);
        continue;
      }
      const float lse = max[n] + std::log(sums[n]);
      losses[n] = lse - sums[N + n];
      if (!d) continue;
#pragma omp simd
      for (int64_t i = 0; i < Vl; ++i) d[i] = exp_approx(x[i] - lse) * dloss;
      const int64_t t = static_cast<int64_t>(targets[n]) - vocab_start;
      if (t >= 0 && t < Vl) d[t] -= dloss;
    }
  });
}

}  // namespace llmt::cpu
