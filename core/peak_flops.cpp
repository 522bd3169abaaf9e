#include "core/peak_flops.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>

#include "core/check.h"

#ifdef LLMTRAIN_HAVE_CUDA
#include "core/cuda/cuda_backend.h"
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

CpuInfo parse_cpuinfo(const std::string& text) {
  CpuInfo c;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) break;  // the first processor only
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id") c.vendor = value;
    if (key == "model name") c.model_name = value;
    if (key == "cpu family") c.family = std::atoi(value.c_str());
    if (key == "model") c.model = std::atoi(value.c_str());
    if (key == "cpu MHz") c.mhz = std::atof(value.c_str());
    if (key == "flags") {
      std::istringstream flags(value);
      for (std::string f; flags >> f;) {
        c.avx512f = c.avx512f || f == "avx512f";
        c.avx2 = c.avx2 || f == "avx2";
        c.fma = c.fma || f == "fma";
      }
    }
  }
  return c;
}

CpuInfo read_cpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_cpuinfo(text.str());
}

CpuFmaWidth cpu_fma_width(const CpuInfo& c) {
  const std::string id = detail::concat(c.vendor == "AuthenticAMD" ? "AMD" : c.vendor, " family ",
                                        c.family, " model ", c.model);
  if (c.vendor == "AuthenticAMD") {
    if (c.family == 26 && c.avx512f) return {64, id + " (Zen 5): AVX-512 on 512-bit FMA units"};
    if (c.family == 25)
      return {32, id + " (Zen 3/4): two 256-bit FMA units" +
                      std::string(c.avx512f ? ", AVX-512 split in two" : "")};
    if (c.family == 23 && c.model >= 0x30) return {32, id + " (Zen 2): two 256-bit FMA units"};
    if (c.family == 23) return {16, id + " (Zen 1): two 128-bit FMA units"};
  }
  if (c.avx512f) return {64, id + ": AVX-512, two 512-bit FMA units assumed"};
  if (c.avx2 && c.fma) return {32, id + ": AVX2, two 256-bit FMA units"};
  return {16, id + ": no AVX2/FMA, 16 assumed"};
}

double cpufreq_max_hz() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  double khz = 0;
  return in >> khz ? khz * 1e3 : 0.0;
}

CpuPeak cpu_peak(const CpuInfo& cpu, int threads, double measured_per_thread, double cpufreq_max) {
  CpuPeak p;
  p.width = cpu_fma_width(cpu);
  p.threads = threads;
  if (cpufreq_max > 0) {
    p.clock_hz = cpufreq_max;
    p.clock_source = "cpufreq maximum";
  } else if (measured_per_thread > 0) {
    p.clock_hz = measured_per_thread / p.width.flop_per_cycle;
    p.clock_source = "implied by a measured FMA loop";
  } else {
    p.clock_hz = cpu.mhz * 1e6;
    p.clock_source = "/proc/cpuinfo cpu MHz";
  }
  p.flops = threads * p.clock_hz * p.width.flop_per_cycle;
  return p;
}

std::string CpuPeak::text() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d thread%s x %.3g GHz (%s) x %g fp32 FLOP/cycle = %.4g GFLOP/s",
                threads, threads == 1 ? "" : "s", clock_hz / 1e9, clock_source.c_str(),
                width.flop_per_cycle, flops / 1e9);
  return std::string(buf) + " [" + width.why + "]";
}

double default_gpu_peak_flops(Device device, DType compute) {
#ifdef LLMTRAIN_HAVE_CUDA
  return gpu_peak_flops(cuda_gpu_info(device.index), compute);
#else
  (void)device;
  (void)compute;
  return 0.0;  // unreachable: a CPU-only build refuses CUDA devices before training starts
#endif
}

}  // namespace llmt
