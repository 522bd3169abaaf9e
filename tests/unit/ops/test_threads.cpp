// The measured half of the CPU peak (kernels/threads.h): the FMA loop keeps the vector units
// busy, so the clock it implies with this CPU's FMA width (core/peak_flops.h) is a real
// clock: above 0.4 GHz even with the tests of a loaded machine running beside it (the best of
// three samples), below 6. A loop bound by latency, or not vectorised, implies a fraction of a
// real clock (scalar: 1/16).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/check.h"
#include "core/peak_flops.h"
#include "kernels/threads.h"

namespace llmt {
namespace {

TEST(CpuPeak, MeasuredFmaLoopImpliesARealClock) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitizer build's loop is not the one the trainer measures (it ran at 0.26 GHz under ASan
  // on a loaded machine): the check belongs to the optimised build.
  GTEST_SKIP() << "sanitizer build";
#endif
  const CpuInfo cpu = read_cpuinfo();
  double per_thread = 0;
  for (int i = 0; i < 3; ++i)
    per_thread = std::max(per_thread, measure_fma_flops_per_thread(1, 0.05));
  const double ghz = per_thread / cpu_fma_width(cpu).flop_per_cycle / 1e9;
#if defined(__AVX512F__) || defined(__FMA__)
  EXPECT_GT(ghz, 0.4) << cpu_fma_width(cpu).why << ": " << per_thread / 1e9 << " GFLOP/s";
#endif
  EXPECT_LT(ghz, 6.0) << cpu_fma_width(cpu).why << ": " << per_thread / 1e9 << " GFLOP/s";
}

// Without cpufreq the clock is measured once per CPU model and thread count and then read from
// the cache (XDG_CACHE_HOME here: a directory of the test's own), so the peak is the same on
// every call (a fresh measurement differs from run to run); a clock given in
// LLMTRAIN_CPU_CLOCK_GHZ wins, and a malformed one is refused; cpufreq's maximum wins over both.
TEST(CpuPeak, MeasuredOnceThenCached) {
  const std::string dir = ::testing::TempDir() + "/cpu_peak_cache_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  ASSERT_EQ(setenv("XDG_CACHE_HOME", dir.c_str(), 1), 0);
  unsetenv("LLMTRAIN_CPU_CLOCK_GHZ");
  const CpuPeak first = host_cpu_peak(1, 0.0);
  EXPECT_NE(first.clock_source.find("measured, cached in " + dir), std::string::npos)
      << first.clock_source;
  ASSERT_TRUE(std::filesystem::exists(dir + "/llmtrain/cpu-clock.tsv"));
  for (int i = 0; i < 3; ++i) {
    const CpuPeak again = host_cpu_peak(1, 0.0);
    EXPECT_EQ(again.flops, first.flops);
    EXPECT_NE(again.clock_source.find("measured once, cached"), std::string::npos);
  }
  // Another thread count is another line of the same file.
  const CpuPeak two = host_cpu_peak(2, 0.0);
  EXPECT_EQ(two.threads, 2);
  EXPECT_EQ(host_cpu_peak(2, 0.0).flops, two.flops);
  EXPECT_EQ(host_cpu_peak(1, 0.0).flops, first.flops);

  ASSERT_EQ(setenv("LLMTRAIN_CPU_CLOCK_GHZ", "2.5", 1), 0);
  const CpuPeak given = host_cpu_peak(2, 0.0);
  EXPECT_DOUBLE_EQ(given.flops, 2 * 2.5e9 * given.width.flop_per_cycle);
  EXPECT_EQ(given.clock_source, "LLMTRAIN_CPU_CLOCK_GHZ");
  EXPECT_DOUBLE_EQ(host_cpu_peak(2, 3e9).clock_hz, 3e9);  // cpufreq's maximum
  ASSERT_EQ(setenv("LLMTRAIN_CPU_CLOCK_GHZ", "fast", 1), 0);
  EXPECT_THROW(host_cpu_peak(1, 0.0), Error);
  unsetenv("LLMTRAIN_CPU_CLOCK_GHZ");
  unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace llmt
