// Sets OpenMP's and OpenBLAS's thread counts together (see kernels/threads.h).
#include "kernels/threads.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/check.h"

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

namespace {
// The clock cache: one line per CPU model and thread count, "<key>\t<clock Hz>".
std::string clock_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg) return std::string(xdg) + "/llmtrain/cpu-clock.tsv";
  if (home && *home) return std::string(home) + "/.cache/llmtrain/cpu-clock.tsv";
  return "";
}

// Hz as the cache writes it (7 digits): a measured clock is rounded to it before use, so the run
// that measures it computes with the value every later run reads.
std::string clock_text(double hz) {
  char value[64];
  std::snprintf(value, sizeof value, "%.6e", hz);
  return value;
}

double cached_clock(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.rfind('\t');
    if (tab != std::string::npos && line.compare(0, tab, key) == 0 && tab == key.size())
      return std::atof(line.c_str() + tab + 1);
  }
  return 0.0;
}

// Appends the line through a new file renamed over the old one, so that a reader never sees half
// of it; false when the directory cannot be written (the clock is then measured next time too).
bool cache_clock(const std::string& path, const std::string& key, double hz) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::string text;
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
      if (line.compare(0, key.size() + 1, key + "\t") != 0) text += line + "\n";
  }
  text += key + "\t" + clock_text(hz) + "\n";
  const std::string tmp = path + "." + std::to_string(getpid()) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) return false;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return !ec;
}
}  // namespace

CpuPeak host_cpu_peak(int threads, double cpufreq_max) {
  const CpuInfo cpu = read_cpuinfo();
  if (cpufreq_max > 0) return cpu_peak(cpu, threads, 0.0, cpufreq_max);
  const double width = cpu_fma_width(cpu).flop_per_cycle;
  // A clock in Hz as cpu_peak takes a measurement: FLOP/s of one thread.
  auto with_clock = [&](double hz, std::string source) {
    CpuPeak p = cpu_peak(cpu, threads, hz * width, 0.0);
    p.clock_source = std::move(source);
    return p;
  };
  if (const char* given = std::getenv("LLMTRAIN_CPU_CLOCK_GHZ"); given && *given) {
    char* end = nullptr;
    const double ghz = std::strtod(given, &end);
    if (end == given || *end != '\0' || !(ghz > 0 && ghz < 100))
      throw Error(detail::concat("LLMTRAIN_CPU_CLOCK_GHZ=", given,
                                 " is not a clock in GHz (a number in (0, 100), e.g. 3.7)"));
    return with_clock(ghz * 1e9, "LLMTRAIN_CPU_CLOCK_GHZ");
  }
  const std::string key = detail::concat(cpu.vendor, " family ", cpu.family, " model ", cpu.model,
                                         " ", cpu.model_name, ", ", threads, " threads");
  const std::string path = clock_cache_path();
  if (!path.empty())
    if (const double hz = cached_clock(path, key); hz > 0)
      return with_clock(hz, "measured once, cached in " + path);
  double best = 0;
  for (int i = 0; i < 3; ++i) best = std::max(best, measure_fma_flops_per_thread(threads));
  const double hz = std::atof(clock_text(best / width).c_str());
  const bool kept = !path.empty() && cache_clock(path, key, hz);
  return with_clock(hz, kept ? "measured, cached in " + path : "measured by an FMA loop");
}

}  // namespace llmt
