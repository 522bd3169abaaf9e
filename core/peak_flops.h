// The peak FLOP/s of one rank's device, the denominator of MFU when `log.peak_flops` = 0.
// Pure arithmetic on a description of the device, so that the GPU figures are testable without a
// GPU; the CUDA backend fills GpuInfo from the driver (cuda_gpu_info).
#pragma once

#include <string>

#include "core/dtype.h"

namespace llmt {

struct GpuInfo {
  std::string name;  // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  int sms = 0;            // streaming multiprocessors
  double clock_hz = 0.0;  // the SM clock the driver reports (its maximum)
};

// Dense peak of the unit our GEMMs run on: tensor cores with fp32 accumulation for 16-bit
// compute (kernels/cuda/linear.cu multiplies bf16/f16 operands there), CUDA-core fp32 for f32
// (no TF32). NVIDIA's published figures for the A100, H100 (SXM and PCIe) and H200, else per-SM
// rates x SMs x clock for compute capability 8.0 and 9.0; 0 when unknown (then MFU is
// reported as 0 and the trainer says to set log.peak_flops).
double gpu_peak_flops(const GpuInfo& gpu, DType compute);

// What /proc/cpuinfo says about the first processor.
struct CpuInfo {
  std::string vendor;  // "AuthenticAMD", "GenuineIntel"
  std::string model_name;
  int family = 0, model = 0;
  bool avx512f = false, avx2 = false, fma = false;
  double mhz = 0;  // "cpu MHz": the current or nominal clock (VMs: nominal)
};
CpuInfo parse_cpuinfo(const std::string& text);
CpuInfo read_cpuinfo();

// fp32 FLOP per cycle per core of the CPU's FMA units, and why: the ISA alone does not say it
// (AMD Zen 4 runs AVX-512 on 256-bit units: 32, as AVX2; Zen 5 on 512-bit units: 64; Intel
// server cores with AVX-512: 64, assuming two FMA units; AVX2 + FMA: 32; else 16).
struct CpuFmaWidth {
  double flop_per_cycle = 0;
  std::string why;  // "AMD family 25 (Zen 3/4): two 256-bit FMA units, AVX-512 split in two"
};
CpuFmaWidth cpu_fma_width(const CpuInfo& cpu);

// A CPU rank's peak: threads x clock x FLOP/cycle. The clock is cpufreq's maximum when the
// kernel exposes it, else the one a measured FMA loop implies (measured per-thread FLOP/s /
// FLOP/cycle: in a VM the nominal "cpu MHz" understates a boosting core), else "cpu MHz".
struct CpuPeak {
  double flops = 0, clock_hz = 0;
  std::string clock_source;
  CpuFmaWidth width;
  int threads = 0;
  std::string text() const;  // for the start-up line
};
// measured_per_thread: FLOP/s of one thread's FMA loop while all `threads` run it (0: none).
CpuPeak cpu_peak(const CpuInfo& cpu, int threads, double measured_per_thread,
                 double cpufreq_max_hz);
// cpufreq's cpuinfo_max_freq of cpu0 in Hz, 0 when the kernel does not expose it.
double cpufreq_max_hz();

// The peak of a GPU rank (its GpuInfo read from the driver; 0 when unknown). CPU ranks use
// cpu_peak.
double default_gpu_peak_flops(Device device, DType compute);

}  // namespace llmt
