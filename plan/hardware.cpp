#include "plan/hardware.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "config/loader.h"
#include "core/peak_flops.h"
#include "kernels/threads.h"

namespace llmt {

// configs/hardware/*.toml as text, generated at configure time (CMakeLists.txt).
const std::map<std::string, std::string>& builtin_hardware_profiles();

namespace {

using detail::concat;

struct Field {
  std::string_view key;
  double HardwareProfile::*value;
  bool may_detect;  // 0 means "fill in from this machine"
};

constexpr Field kFields[] = {
    {"peak_fp32", &HardwareProfile::peak_fp32, true},
    {"peak_bf16", &HardwareProfile::peak_bf16, true},
    {"peak_fp16", &HardwareProfile::peak_fp16, true},
    {"memory_bandwidth", &HardwareProfile::memory_bandwidth, false},
    {"intra_node_bandwidth", &HardwareProfile::intra_node_bandwidth, false},
    {"inter_node_bandwidth", &HardwareProfile::inter_node_bandwidth, false},
    {"matmul_efficiency", &HardwareProfile::matmul_efficiency, false},
};
// Optional, with HardwareProfile's default when absent.
constexpr Field kOptionalFields[] = {
    {"comm_overlap", &HardwareProfile::comm_overlap, true},
    {"nvme_bandwidth", &HardwareProfile::nvme_bandwidth, true},
};

const Schema& hardware_schema() {
  static const Schema s = [] {
    Schema::Section sec{"hardware", {{"name", true}, {"description", true}}};
    for (const Field& f : kFields) sec.keys.push_back({std::string(f.key)});
    for (const Field& f : kOptionalFields) sec.keys.push_back({std::string(f.key)});
    sec.keys.push_back({"memory_gib"});
    sec.keys.push_back({"devices_per_node"});
    return Schema{{sec}};
  }();
  return s;
}

double host_memory_total() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    double kb = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %lf kB", &kb) == 1) return kb * 1024;
  }
  return 0;
}

HardwareProfile build(Loader& loader, const std::string& name, int threads_per_rank) {
  HardwareProfile h;
  h.source = name;
  std::vector<std::string> errors = std::move(loader.errors);
  double memory_gib = -1;
  int64_t per_node = -1;
  std::map<std::string, bool> given;
  for (const Setting& s : loader.settings) {
    given[s.key] = true;
    Problem p;
    if (s.key == "name") {
      p = read_value(*s.node, h.name);
    } else if (s.key == "description") {
      p = read_value(*s.node, h.description);
    } else if (s.key == "memory_gib") {
      p = read_value(*s.node, memory_gib);
    } else if (s.key == "devices_per_node") {
      p = read_value(*s.node, per_node);
    } else {
      for (const Field& f : kFields)
        if (s.key == f.key) p = read_value(*s.node, h.*f.value);
      for (const Field& f : kOptionalFields)
        if (s.key == f.key) p = read_value(*s.node, h.*f.value);
    }
    if (p) errors.push_back(concat(s.dotted(), " at ", s.at.str(), ": ", *p));
  }
  for (const Field& f : kFields) {
    const double v = h.*f.value;
    if (!given.count(std::string(f.key)))
      errors.push_back(concat(name, ": hardware.", f.key, " is missing"));
    else if (v < 0 || (v == 0 && !f.may_detect))
      errors.push_back(concat(name, ": hardware.", f.key, "=", v, " must be > 0",
                              f.may_detect ? " (or 0: detect)" : ""));
  }
  if (h.nvme_bandwidth < 0)
    errors.push_back(
        concat(name, ": hardware.nvme_bandwidth=", h.nvme_bandwidth, " must be >= 0 (0: unknown)"));
  if (h.comm_overlap < 0 || h.comm_overlap > 1)
    errors.push_back(concat(name, ": hardware.comm_overlap=", h.comm_overlap,
                            " is a fraction of the compute, from 0 to 1"));
  if (h.matmul_efficiency > 1)
    errors.push_back(concat(name, ": hardware.matmul_efficiency=", h.matmul_efficiency,
                            " is a fraction of the peak, at most 1"));
  if (memory_gib < 0) errors.push_back(concat(name, ": hardware.memory_gib is missing or < 0"));
  if (per_node < 0)
    errors.push_back(concat(name, ": hardware.devices_per_node is missing or < 0 (0: one node)"));
  if (h.name.empty()) errors.push_back(concat(name, ": hardware.name is missing"));
  if (!errors.empty()) {
    std::string all;
    for (const std::string& e : errors) all += (all.empty() ? "" : "\n") + e;
    throw ConfigError(all);
  }
  h.devices_per_node = static_cast<int>(per_node);
  h.memory_bytes = memory_gib * 1024.0 * 1024 * 1024;
  if (h.memory_bytes == 0) {
    h.memory_bytes = host_memory_total();
    h.detected.push_back("memory (MemTotal)");
  }
  if (h.peak_fp32 == 0 || h.peak_bf16 == 0 || h.peak_fp16 == 0) {
    // The trainer's own CPU peak (core/peak_flops.h): 16-bit precision computes in fp32
    // on the CPU, so every zero peak is the fp32 one.
    const CpuPeak p = host_cpu_peak(std::max(1, threads_per_rank), cpufreq_max_hz());
    for (double* v : {&h.peak_fp32, &h.peak_bf16, &h.peak_fp16})
      if (*v == 0) *v = p.flops;
    h.detected.push_back("peak " + p.text());
  }
  return h;
}

}  // namespace

double HardwareProfile::peak(DType compute) const {
  switch (compute) {
    case DType::bf16:
      return peak_bf16;
    case DType::f16:
      return peak_fp16;
    default:
      return peak_fp32;
  }
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : builtin_hardware_profiles()) names.push_back(name);
  return names;
}

HardwareProfile parse_hardware(const std::string& text, const std::string& name,
                               int threads_per_rank) {
  Loader loader(hardware_schema());
  loader.load_text(text, name);
  return build(loader, name, threads_per_rank);
}

HardwareProfile load_hardware(const std::string& name_or_path, int threads_per_rank) {
  const bool is_path =
      name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".toml") == 0);
  if (!is_path) {
    const auto& builtin = builtin_hardware_profiles();
    auto it = builtin.find(name_or_path);
    if (it == builtin.end()) {
      std::string names;
      for (const std::string& n : hardware_names()) names += (names.empty() ? "" : ", ") + n;
      throw ConfigError(concat("--hardware ", name_or_path, ": no such profile (built in: ", names,
                               "; or give a profile file's path, e.g. ./my-gpu.toml)"));
    }
    HardwareProfile h = parse_hardware(it->second, name_or_path + " (built in)", threads_per_rank);
    h.source = "built in";
    return h;
  }
  Loader loader(hardware_schema());
  loader.load_file(name_or_path, "hardware profile");
  return build(loader, name_or_path, threads_per_rank);
}

}  // namespace llmt
