// The MFU denominators: datasheet figures for known GPUs, per-SM rates for sm_80/sm_90 otherwise,
// 0 for the rest; tensor-core peaks only for 16-bit compute (our fp32 GEMMs use no TF32).
#include <gtest/gtest.h>

#include "engine/core/peak_flops.h"

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

TEST(PeakFlops, CpuDefault) {
  EXPECT_EQ(default_peak_flops(Device{}, DType::f32, 2), cpu_peak_flops(2));
  const double per_thread = cpu_peak_flops(1);
  EXPECT_TRUE(per_thread == 4.1e9 * 64 || per_thread == 4.1e9 * 32);
  EXPECT_EQ(cpu_peak_flops(3), 3 * per_thread);
}

}  // namespace
}  // namespace llmt
