// Building blocks shared by the CPU kernels: splitting work over OpenMP threads into fixed
// contiguous chunks (deterministic for a given thread count, so same-layout reruns are bit-exact),
// per-thread accumulators for parameter gradients, and a branch-free exp the compiler vectorises.
#pragma once

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

namespace llmt::cpu {

// Below this many elements per thread, starting threads costs more than it saves.
inline constexpr int64_t kGrainElems = 1 << 14;

// Rows per thread worth parallelising when each row has `row_elems` elements.
inline int64_t grain_rows(int64_t row_elems) {
  return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, row_elems));
}

inline int threads_for(int64_t n, int64_t grain) {
  return static_cast<int>(
      std::clamp<int64_t>(n / std::max<int64_t>(1, grain), 1, omp_get_max_threads()));
}

// The position of sequence index t: pos[t] when a position array is given (context parallelism's
// global positions), else pos_offset + t.
inline int64_t position(const int32_t* pos, int64_t pos_offset, int64_t t) {
  return pos ? pos[t] : pos_offset + t;
}

// dst (n) += src (n).
inline void accumulate(float* dst, const float* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// body(thread, begin, end) on nt contiguous chunks of [0, n), one per thread (serial if nt == 1).
template <typename Body>
void run_chunks(int64_t n, int nt, Body&& body) {
  if (nt == 1) {
    body(int64_t{0}, int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int64_t t = omp_get_thread_num(), nth = omp_get_num_threads();
    body(t, n * t / nth, n * (t + 1) / nth);
  }
}

// body(begin, end) over [0, n) in one contiguous chunk per thread, or serially when n is small.
template <typename Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  run_chunks(n, threads_for(n, grain),
             [&](int64_t, int64_t begin, int64_t end) { body(begin, end); });
}

// Row-parallel pass that also reduces over rows: body(begin, end, acc) adds its rows' share into
// acc (`width` floats, zeroed, one buffer per thread); returns the sum of the buffers, added in
// thread order. Parameter gradients (norm weights, biases) are built this way without races.
template <typename Body>
std::vector<float> parallel_rows_sum(int64_t N, int64_t grain, int64_t width, Body&& body) {
  const int nt = threads_for(N, grain);
  std::vector<float> acc(static_cast<size_t>(nt) * width, 0.0f);
  run_chunks(N, nt, [&](int64_t t, int64_t begin, int64_t end) {
    body(begin, end, acc.data() + t * width);
  });
  for (int t = 1; t < nt; ++t) accumulate(acc.data(), acc.data() + t * width, width);
  acc.resize(width);
  return acc;
}

// exp(x) for float within ~2 ulp (Cephes' range reduction and polynomial), written without
// branches or float->int conversions so loops calling it vectorise; NaN propagates. Inputs are
// clamped to [-87.3, 88.3]: below, the result (~1e-38) is negligible wherever it is used.
inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  x = x > 88.3f ? 88.3f : x;
  x = x < -87.3f ? -87.3f : x;
  float t = x * kLog2e + kRound;
  float k = t - kRound;
  float r = x - k * kLn2Hi - k * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float er = p * r * r + r + 1.0f;
  // t's low mantissa bits hold k (plus 2^22); rebuild 2^k from them with integer ops.
  int32_t ki = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  return er * std::bit_cast<float>((ki + 127) << 23);
}

}  // namespace llmt::cpu
