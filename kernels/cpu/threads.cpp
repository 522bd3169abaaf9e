// Sets OpenMP's and OpenBLAS's thread counts together (see kernels/threads.h).
#include "kernels/threads.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

namespace llmt {

namespace {
int positive_env(const char* name) {
  const char* v = std::getenv(name);
  const int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 0;
}
}  // namespace

ThreadChoice default_cpu_threads(int local_ranks) {
  if (int n = positive_env("OMP_NUM_THREADS")) return {n, "OMP_NUM_THREADS"};
  if (int n = positive_env("SLURM_CPUS_PER_TASK")) return {n, "SLURM_CPUS_PER_TASK"};
  const int mask = omp_get_num_procs();  // the CPUs of this process's affinity mask
  const long node = sysconf(_SC_NPROCESSORS_ONLN);
  if (local_ranks > 1 && mask >= node) {
    const int n = std::max(1, mask / local_ranks);
    return {n, std::to_string(mask) + " CPUs of the node / " + std::to_string(local_ranks) +
                   " unbound ranks"};
  }
  return {mask, "affinity mask: " + std::to_string(mask) + (mask == 1 ? " CPU" : " CPUs")};
}

int set_cpu_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return n;
}

int cpu_threads() {
  return omp_get_max_threads();
}

namespace {
// `iters` rounds of kAcc independent FMAs on the widest vectors; returns the FLOPs done (and
// folds the result into `sink` so that nothing is optimised away).
int64_t fma_rounds(int64_t iters, float& sink) {
  constexpr int kAcc = 12;  // > latency x ports of any current core: the units stay busy
#if defined(__AVX512F__)
  using V = __m512;
  constexpr int kLanes = 16;
  V acc[kAcc], a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (V& x : acc) x = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < iters; ++i)
    for (V& x : acc) x = _mm512_fmadd_ps(x, a, b);
  float lanes[16];
  for (V& x : acc) {
    _mm512_storeu_ps(lanes, x);
    for (float l : lanes) sink += l;
  }
#elif defined(__FMA__)
  using V = __m256;
  constexpr int kLanes = 8;
  V acc[kAcc], a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (V& x : acc) x = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < iters; ++i)
    for (V& x : acc) x = _mm256_fmadd_ps(x, a, b);
  float lanes[8];
  for (V& x : acc) {
    _mm256_storeu_ps(lanes, x);
    for (float l : lanes) sink += l;
  }
#else
  constexpr int kLanes = 1;
  float acc[kAcc];
  for (float& x : acc) x = 1.0f;
  for (int64_t i = 0; i < iters; ++i)
    for (float& x : acc) x = std::fma(x, 0.999999f, 1e-7f);
  for (float x : acc) sink += x;
#endif
  return iters * kAcc * kLanes * 2;
}
}  // namespace

double measure_fma_flops_per_thread(int threads, double seconds) {
  double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    float sink = 0;
    fma_rounds(1 << 14, sink);  // warm up: clocks and the vector units' power state
    int64_t flops = 0, iters = 1 << 14;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      flops += fma_rounds(iters, sink);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    total += static_cast<double>(flops) / elapsed + (sink == 12345.0f ? 1e-30 : 0.0);
  }
  return total / threads;
}

}  // namespace llmt
