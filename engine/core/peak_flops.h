// The peak FLOP/s of one rank's device, the denominator of MFU when `log.peak_flops` = 0.
// Pure arithmetic on a description of the device, so that the GPU figures are testable without a
// GPU; the CUDA backend fills GpuInfo from the driver (cuda_gpu_info).
#pragma once

#include <string>

#include "engine/core/dtype.h"

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

// threads x 4.1 GHz x FLOP/cycle of the CPU's FMA units (AVX-512: 64, else 32), fp32: the figure
// docs/references.md gives for the project's machines.
double cpu_peak_flops(int threads);

// The default for a rank on `device` computing in `compute` with `threads` CPU threads: the CPU's
// figure, or the GPU's (its GpuInfo read from the driver; 0 when unknown).
double default_peak_flops(Device device, DType compute, int threads);

}  // namespace llmt
