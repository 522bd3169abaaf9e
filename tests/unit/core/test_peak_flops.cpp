// The MFU denominators: datasheet figures for known GPUs, per-SM rates for sm_80/sm_90 otherwise,
// 0 for the rest; tensor-core peaks only for 16-bit compute (our fp32 GEMMs use no TF32).
#include <gtest/gtest.h>

#include "core/check.h"
#include "core/peak_flops.h"

namespace llmt {
namespace {

TEST(PeakFlops, DatasheetFiguresOfKnownGpus) {
  const GpuInfo h100{"NVIDIA H100 80GB HBM3", 9, 0, 132, 1.98e9};
  EXPECT_DOUBLE_EQ(gpu_peak_flops(h100, DType::bf16), 989.4e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops(h100, DType::f16), 989.4e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops(h100, DType::f32), 66.9e12);
  const GpuInfo h100_pcie{"NVIDIA H100 PCIe", 9, 0, 114, 1.755e9};
  EXPECT_DOUBLE_EQ(gpu_peak_flops(h100_pcie, DType::bf16), 756.0e12);
  const GpuInfo h200{"NVIDIA H200", 9, 0, 132, 1.98e9};
  EXPECT_DOUBLE_EQ(gpu_peak_flops(h200, DType::bf16), 989.4e12);
  const GpuInfo a100{"NVIDIA A100-SXM4-80GB", 8, 0, 108, 1.41e9};
  EXPECT_DOUBLE_EQ(gpu_peak_flops(a100, DType::bf16), 312.0e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops(a100, DType::f32), 19.5e12);
}

// An unnamed sm_80 part at the A100's SMs and clock lands on the A100's datasheet figures
// (within their rounding); other architectures are unknown.
TEST(PeakFlops, PerSmRatesOtherwise) {
  const GpuInfo ga100{"some sm_80 part", 8, 0, 108, 1.41e9};
  EXPECT_NEAR(gpu_peak_flops(ga100, DType::bf16), 312.0e12, 0.01 * 312.0e12);
  EXPECT_NEAR(gpu_peak_flops(ga100, DType::f32), 19.5e12, 0.01 * 19.5e12);
  const GpuInfo gh100{"some sm_90 part", 9, 0, 132, 1.83e9};
  EXPECT_NEAR(gpu_peak_flops(gh100, DType::bf16), 989.4e12, 0.01 * 989.4e12);
  EXPECT_EQ(gpu_peak_flops({"NVIDIA GeForce RTX 4090", 8, 9, 128, 2.52e9}, DType::bf16), 0.0);
}

// /proc/cpuinfo of the machines this project has run on, cut to the fields read.
CpuInfo cpu(const char* vendor, int family, int model, const char* flags, double mhz = 2596.1) {
  return parse_cpuinfo(detail::concat(
      "processor\t: 0\nvendor_id\t: ", vendor, "\ncpu family\t: ", family, "\nmodel\t\t: ", model,
      "\nmodel name\t: X\ncpu MHz\t\t: ", mhz, "\nflags\t\t: fpu sse2 ", flags,
      "\n\nprocessor\t: 1\n"
      "vendor_id\t: other\n"));
}

TEST(PeakFlops, CpuinfoIsParsed) {
  const CpuInfo c = cpu("AuthenticAMD", 25, 17, "avx2 fma avx512f avx512bw");
  EXPECT_EQ(c.vendor, "AuthenticAMD");  // the first processor, not the second
  EXPECT_EQ(c.family, 25);
  EXPECT_EQ(c.model, 17);
  EXPECT_TRUE(c.avx512f && c.avx2 && c.fma);
  EXPECT_DOUBLE_EQ(c.mhz, 2596.1);
}

// The FMA width by vendor, family and model: Zen 4 (family 25 model 17, AVX-512 on 256-bit
// units) is 32, not the 64 its flags suggest; Zen 5 64; Intel AVX-512 64, AVX2 32.
TEST(PeakFlops, FmaWidthFollowsTheMicroarchitectureNotTheFlags) {
  EXPECT_EQ(cpu_fma_width(cpu("AuthenticAMD", 25, 17, "avx2 fma avx512f")).flop_per_cycle, 32);
  EXPECT_EQ(cpu_fma_width(cpu("AuthenticAMD", 25, 1, "avx2 fma")).flop_per_cycle, 32);
  EXPECT_EQ(cpu_fma_width(cpu("AuthenticAMD", 26, 2, "avx2 fma avx512f")).flop_per_cycle, 64);
  EXPECT_EQ(cpu_fma_width(cpu("AuthenticAMD", 23, 49, "avx2 fma")).flop_per_cycle, 32);
  EXPECT_EQ(cpu_fma_width(cpu("AuthenticAMD", 23, 1, "avx2 fma")).flop_per_cycle, 16);
  EXPECT_EQ(cpu_fma_width(cpu("GenuineIntel", 6, 143, "avx2 fma avx512f")).flop_per_cycle, 64);
  EXPECT_EQ(cpu_fma_width(cpu("GenuineIntel", 6, 158, "avx2 fma")).flop_per_cycle, 32);
  EXPECT_NE(cpu_fma_width(cpu("AuthenticAMD", 25, 17, "avx512f")).why.find("Zen 3/4"),
            std::string::npos);
}

// The clock: cpufreq's maximum, else what a measured FMA loop implies, else cpu MHz.
TEST(PeakFlops, CpuPeakIsThreadsTimesClockTimesWidth) {
  const CpuInfo zen4 = cpu("AuthenticAMD", 25, 17, "avx2 fma avx512f");
  const CpuPeak fixed = cpu_peak(zen4, 2, 0, 3.7e9);
  EXPECT_DOUBLE_EQ(fixed.flops, 2 * 3.7e9 * 32);
  EXPECT_EQ(fixed.clock_source, "cpufreq maximum");
  const CpuPeak measured = cpu_peak(zen4, 2, 92e9, 0);  // 92 GFLOP/s per thread measured
  EXPECT_DOUBLE_EQ(measured.clock_hz, 92e9 / 32);
  EXPECT_DOUBLE_EQ(measured.flops, 2 * 92e9);
  const CpuPeak nominal = cpu_peak(zen4, 1, 0, 0);
  EXPECT_DOUBLE_EQ(nominal.flops, 2596.1e6 * 32);
  EXPECT_NE(measured.text().find("2 threads x 2.88 GHz (implied by a measured FMA loop) x 32 fp32 "
                                 "FLOP/cycle = 184 GFLOP/s"),
            std::string::npos)
      << measured.text();
}

}  // namespace
}  // namespace llmt
