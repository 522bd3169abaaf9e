#include "engine/core/peak_flops.h"

#include <string_view>

#ifdef LLMTRAIN_HAVE_CUDA
#include "engine/core/cuda/cuda_backend.h"
#endif

namespace llmt {

namespace {

bool has(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

struct Peak {
  double tensor16, fp32;  // FLOP/s, dense
};

// Datasheet figures (dense, no sparsity): A100 SXM/PCIe 312 / 19.5 TFLOP/s; H100 SXM
// 989.4 / 66.9; H100 PCIe 756 / 51.2; H200 as H100 SXM.
Peak datasheet(std::string_view name) {
  if (has(name, "H200")) return {989.4e12, 66.9e12};
  if (has(name, "H100"))
    return has(name, "PCIe") ? Peak{756.0e12, 51.2e12} : Peak{989.4e12, 66.9e12};
  if (has(name, "A100")) return {312.0e12, 19.5e12};
  return {0.0, 0.0};
}

}  // namespace

double gpu_peak_flops(const GpuInfo& gpu, DType compute) {
  const bool tensor = compute == DType::bf16 || compute == DType::f16;
  const Peak p = datasheet(gpu.name);
  if (p.fp32 > 0) return tensor ? p.tensor16 : p.fp32;
  // FLOP per clock per SM (dense; an FMA is 2): 16-bit tensor cores with fp32 accumulation, and
  // fp32 CUDA cores. sm_80: 1024 and 64 FMA; sm_90: 2048 and 128 FMA.
  double per_sm = 0;
  if (gpu.cc_major == 8 && gpu.cc_minor == 0) per_sm = tensor ? 2048 : 128;
  if (gpu.cc_major == 9 && gpu.cc_minor == 0) per_sm = tensor ? 4096 : 256;
  return per_sm * gpu.sms * gpu.clock_hz;
}

double cpu_peak_flops(int threads) {
  const double flop_per_cycle = __builtin_cpu_supports("avx512f") ? 64.0 : 32.0;
  return threads * 4.1e9 * flop_per_cycle;
}

double default_peak_flops(Device device, DType compute, int threads) {
  if (device.kind == DeviceKind::cpu) return cpu_peak_flops(threads);
#ifdef LLMTRAIN_HAVE_CUDA
  return gpu_peak_flops(cuda_gpu_info(device.index), compute);
#else
  (void)compute;
  return 0.0;  // unreachable: a CPU-only build refuses CUDA devices before training starts
#endif
}

}  // namespace llmt
