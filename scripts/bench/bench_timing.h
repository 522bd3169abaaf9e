// Timing helpers of the C++ benchmarks (bench_optim, bench_grouped_gemm).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace llmt::bench {

inline double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Wall-clock milliseconds of one call of f.
inline double time_ms(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace llmt::bench
