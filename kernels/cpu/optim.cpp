// AdamW and the reductions the optimizer needs (grad norms, overflow checks), per tensor and over
// a tensor list in one OpenMP parallel region. The element math of AdamW is kernels/adamw_math.h,
// so a tensor updated alone or in a list gets the same bits; this file is compiled with
// -fno-math-errno (kernels/CMakeLists.txt), without which its sqrt kept the AdamW loop scalar.
// Reductions keep one partial per chunk and add them in chunk order, so a rerun with the same
// thread count gives the same bits (OpenMP's reduction clause would not).
#include <bit>
#include <cmath>
#include <vector>

#include "kernels/adamw_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

using kernel_math::AdamWCoeffs;

// Elements [begin, end) of one tensor.
void adamw_range(float* param, const float* grad, float* m, float* v, int64_t begin, int64_t end,
                 float decay, const AdamWCoeffs& c) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i)
    kernel_math::adamw_element(param[i], m[i], v[i], grad[i], decay, c);
}

// A contiguous piece [begin, end) of tensor k of a list.
struct Piece {
  int64_t k, begin, end;
};

// body(piece) for every piece, on up to threads_for(total elements) threads; pieces are handed
// out dynamically, so tensors of any sizes balance (and a core busy with other work does not
// hold the others up). Each piece's result must not depend on which thread runs it.
template <typename Body>
void run_pieces(const std::vector<Piece>& pieces, int64_t total, Body&& body) {
  const auto np = static_cast<int64_t>(pieces.size());
  const auto nt = static_cast<int>(std::min<int64_t>(threads_for(total, kGrainElems), np));
  if (nt <= 1) {
    for (int64_t j = 0; j < np; ++j) body(j, pieces[static_cast<size_t>(j)]);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(dynamic)
  for (int64_t j = 0; j < np; ++j) body(j, pieces[static_cast<size_t>(j)]);
}

// Sum of f(i) over [begin, end) in double. Sixteen independent lane accumulators break the add
// dependency chain (one accumulator made this latency-bound at a third of memory bandwidth).
template <typename F>
double chunk_sum(int64_t begin, int64_t end, F&& f) {
  constexpr int kLanes = 16;
  double acc[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) acc[l] += f(i + l);
  }
  for (; i < end; ++i) acc[0] += f(i);
  double s = 0.0;
  for (double a : acc) s += a;
  return s;
}

// The sum over tensors k (in list order) of the sum of f(x[k][i]) over each tensor's elements.
// Tensor k is cut into threads_for(numel[k]) equal chunks, whose sums are added in chunk order:
// a fixed order for a given thread count, however the chunks of all tensors are spread over the
// threads. A list of one tensor is the per-tensor op, so the list's result is bitwise the sum,
// in list order, of the per-tensor results.
template <typename F>
double multi_sum(const float* const* x, const int64_t* numel, int64_t count, F f) {
  std::vector<Piece> chunks;
  int64_t total = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t n = numel[k];
    const int nt = threads_for(n, kGrainElems);
    for (int t = 0; t < nt; ++t) chunks.push_back({k, n * t / nt, n * (t + 1) / nt});
    total += n;
  }
  std::vector<double> partial(chunks.size(), 0.0);
  run_pieces(chunks, total, [&](int64_t j, const Piece& c) {
    const float* xk = x[c.k];
    partial[static_cast<size_t>(j)] =
        chunk_sum(c.begin, c.end, [=](int64_t i) { return f(xk[i]); });
  });
  double sum = 0.0;
  for (size_t j = 0; j < chunks.size();) {
    double tensor_sum = 0.0;
    const int64_t k = chunks[j].k;
    for (; j < chunks.size() && chunks[j].k == k; ++j) tensor_sum += partial[j];
    sum += tensor_sum;
  }
  return sum;
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale) {
  const AdamWCoeffs c = kernel_math::adamw_coeffs(lr, beta1, beta2, eps, step, grad_scale);
  const float decay = kernel_math::adamw_decay(lr, weight_decay);
  parallel_for(n, kGrainElems, [&](int64_t begin, int64_t end) {
    adamw_range(param, grad, m, v, begin, end, decay, c);
  });
}

void adamw_update_multi(float* const* param, const float* const* grad, float* const* m,
                        float* const* v, const int64_t* numel, const float* weight_decay,
                        int64_t count, float lr, float beta1, float beta2, float eps, int64_t step,
                        float grad_scale) {
  // Pieces of kGrainElems elements at most: small enough to balance, large enough that handing
  // them out costs nothing next to their memory traffic (4 * 64 KiB read, 3 * 64 KiB written).
  const AdamWCoeffs c = kernel_math::adamw_coeffs(lr, beta1, beta2, eps, step, grad_scale);
  std::vector<float> decay(static_cast<size_t>(count));
  std::vector<Piece> pieces;
  int64_t total = 0;
  for (int64_t k = 0; k < count; ++k) {
    decay[static_cast<size_t>(k)] = kernel_math::adamw_decay(lr, weight_decay[k]);
    for (int64_t b = 0; b < numel[k]; b += kGrainElems)
      pieces.push_back({k, b, std::min(numel[k], b + kGrainElems)});
    total += numel[k];
  }
  run_pieces(pieces, total, [&](int64_t, const Piece& p) {
    adamw_range(param[p.k], grad[p.k], m[p.k], v[p.k], p.begin, p.end,
                decay[static_cast<size_t>(p.k)], c);
  });
}

double sum_squares(const float* x, int64_t n) {
  return sum_squares_multi(&x, &n, 1);
}

bool has_nonfinite(const float* x, int64_t n) {
  return has_nonfinite_multi(&x, &n, 1);
}

double sum_squares_multi(const float* const* x, const int64_t* numel, int64_t count) {
  return multi_sum(x, numel, count, [](float e) {
    const double d = e;
    return d * d;
  });
}

bool has_nonfinite_multi(const float* const* x, const int64_t* numel, int64_t count) {
  constexpr uint32_t kExp = 0x7f800000u;  // all exponent bits set: inf or nan
  return multi_sum(x, numel, count, [](float e) {
           return (std::bit_cast<uint32_t>(e) & kExp) == kExp ? 1.0 : 0.0;
         }) > 0.0;
}

}  // namespace llmt::cpu
