#include "train/memory_estimate.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/check.h"
#include "engine/data_parallel/data_parallel.h"
#include "engine/model/model_spec.h"

namespace llmt {

namespace {

// Parameters of the whole model, without building a spec of n_layers layers: the embeddings and
// head, plus a dense layer's count for each dense layer and an MoE layer's for each MoE layer.
double total_params(const ModelConfig& m, int64_t ep = 1) {
  auto params = [](ModelConfig c, int64_t layers, bool moe) {
    c.n_layers = layers;
    if (moe) {
      c.moe.first_dense_layers = 0;
      c.moe.every = 1;
    } else {
      c.moe.num_experts = 0;
    }
    return static_cast<double>(ModelSpec::from_config(c).num_params());
  };
  const double p1 = params(m, 1, false), dense = params(m, 2, false) - p1, root = p1 - dense;
  const MoeConfig& e = m.moe;
  const int64_t n_moe = e.enabled() && m.n_layers > e.first_dense_layers
                            ? (m.n_layers - 1 - e.first_dense_layers) / e.every + 1
                            : 0;
  double total = root + static_cast<double>(m.n_layers - n_moe) * dense;
  if (n_moe > 0) {
    // An MoE layer: its E experts' fc1 (Fe or 2Fe rows) and fc2 (1/ep of them on a rank), and
    // the rest (attention, norms, router, shared experts).
    const double moe = params(m, 1, true) - root;
    const double experts = static_cast<double>(e.num_experts * m.d_model * e.d_ff_expert) *
                           (m.activation == Activation::swiglu ? 3 : 2);
    total += static_cast<double>(n_moe) * (moe - experts + experts / static_cast<double>(ep));
  }
  return total;
}

// The first number in `path`, or nullopt ("max" and missing files: no limit).
bool read_number(const std::string& path, double& out) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return false;
  try {
    out = std::stod(word);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

MemoryEstimate estimate_rank_memory(const Config& c, const MeshShape& mesh) {
  const double tp = mesh.size(Axis::tp), pp = mesh.size(Axis::pp);
  // ZeRO shards over dp x cp, or under hybrid sharding over one replica's part of it.
  const double dp = static_cast<double>(mesh.size(Axis::dp) * mesh.size(Axis::cp)) /
                    static_cast<double>(zero_replicas(c.parallel, mesh.size(Axis::dp)));
  const int64_t zero = c.parallel.zero_stage;
  const double P = total_params(c.model, c.parallel.ep) / (tp * pp);
  MemoryEstimate e;
  e.params =
      4 * P / (zero == 3 ? dp : 1) + (c.train.precision != Precision::fp32 && zero < 3 ? 2 * P : 0);
  if (zero == 3 && c.parallel.zero_hierarchical_partition > 0)  // hpZ's secondary copy
    e.params += (c.train.precision != Precision::fp32 ? 2 : 4) * P /
                static_cast<double>(c.parallel.zero_hierarchical_partition * mesh.size(Axis::cp));
  const double g = c.train.grad_dtype == GradDType::compute && c.train.precision != Precision::fp32
                       ? 2
                       : 4;  // bytes of a gradient
  e.grads = g * P / (zero >= 2 ? dp : 1);
  e.optimizer = 8 * P / (zero >= 1 ? dp : 1);
  // [offload] "nvme": the state in files instead (AdamW's m and v and 16-bit ZeRO-1/2's master
  // shards; ZeRO-3's parameter shards).
  if (c.offload.optimizer == OffloadTarget::nvme) {
    e.offloaded += e.optimizer;
    e.optimizer = 0;
    if (c.train.precision != Precision::fp32 && (zero == 1 || zero == 2)) {
      e.offloaded += 4 * P / dp;
      e.params = 2 * P;
    }
  }
  if (c.offload.params == OffloadTarget::nvme && zero == 3) {
    e.offloaded += 4 * P / dp;
    e.params -= 4 * P / dp;
  }
  // Context parallelism: each rank holds seq_len/cp positions of every sequence.
  const double s = static_cast<double>(c.model.seq_len) / mesh.size(Axis::cp),
               b = c.train.micro_batch_size, h = static_cast<double>(c.model.d_model);
  e.activations = 4 * s * b * h * static_cast<double>(c.model.n_layers) / pp /
                  (c.parallel.sequence_parallel ? tp : 1);
  return e;
}

MemoryEstimate rank_state_bytes(const ModelSpec& spec, int64_t zero_stage, int group,
                                int group_rank, bool sixteen_bit, OptimizerType optimizer,
                                int grad_bytes, int secondary_group, bool offload_optimizer,
                                bool offload_params) {
  const bool muon = optimizer == OptimizerType::muon;
  double whole = 0, padded = 0, secondary = 0;
  double adam_owned = 0;                      // what AdamW updates (all but Muon's matrices)
  std::vector<int64_t> muon_own;              // Muon: each hidden matrix's slot elements
  int64_t muon_shard = 0, muon_gathered = 0;  // ZeRO's Muon gather buffers (zero.cpp)
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamSpec& p = spec.params[i];
    // Expert stacks under ep, routed parameters under tp: over their own groups (zero.h).
    const auto [n, d] = spec.row_group(i, group, group_rank);
    const int64_t rows = spec.cut_rows(i), row_numel = p.shape.numel() / rows;
    const int64_t s = (rows + n - 1) / n;
    const int64_t own = std::clamp<int64_t>(rows - d * s, 0, s);
    whole += static_cast<double>(p.shape.numel());
    padded += static_cast<double>(s * row_numel);
    if (secondary_group > 0 && zero_stage == 3) {  // hpZ's secondary rows (zero.h)
      const int64_t n2 = spec.row_group(i, secondary_group, 0).size;
      secondary += static_cast<double>((rows + n2 - 1) / n2 * row_numel);
    }
    const int64_t slot = zero_stage >= 1 ? own * row_numel : p.shape.numel();
    if (!muon || !spec.is_hidden_matrix(i)) {
      adam_owned += static_cast<double>(slot);
      continue;
    }
    muon_own.push_back(slot);
    if (zero_stage >= 1) {
      muon_shard = std::max(muon_shard, s * row_numel);
      muon_gathered = std::max(muon_gathered, s * row_numel * n);
    }
  }
  MemoryEstimate e;
  // 16-bit: a compute copy of what the rank holds, stored in 16 bits, beside the fp32 masters,
  // which ZeRO-1/2 shard (the model's weights are then the compute copy).
  e.params = zero_stage == 3                  ? 4 * padded
             : sixteen_bit && zero_stage >= 1 ? 2 * whole + 4 * padded
                                              : (sixteen_bit ? 6 : 4) * whole;
  e.params += (sixteen_bit ? 2 : 4) * secondary;
  e.grads = grad_bytes * (zero_stage >= 2 ? padded : whole);
  e.optimizer = 8 * adam_owned;
  double momentum = 0;
  if (muon) {
    const MuonLayout m = muon_layout(spec, spec.tp_size);
    const MuonBuffers b = muon_buffers(m.matrices, muon_own);
    momentum = 4 * static_cast<double>(b.momentum);
    e.optimizer += 4 * static_cast<double>(b.elements() + m.tp_local + m.tp_staging + muon_shard +
                                           muon_gathered);
  }
  // [offload] "nvme" (Allocator::allocate's Offload): AdamW's m and v, Muon's momentum and the
  // master shards of ZeRO-1/2 in 16 bits with the optimizer; ZeRO-3's shards with the params.
  if (offload_optimizer) {
    e.offloaded += 8 * adam_owned + momentum;
    e.optimizer -= 8 * adam_owned + momentum;
    if (sixteen_bit && (zero_stage == 1 || zero_stage == 2)) {
      e.offloaded += 4 * padded;
      e.params -= 4 * padded;
    }
  }
  if (offload_params && zero_stage == 3) {
    e.offloaded += 4 * padded;
    e.params -= 4 * padded;
  }
  return e;
}

AvailableMemory host_memory_available() {
  AvailableMemory out{std::numeric_limits<double>::infinity(), "unknown"};
  // Said outright (a shared node whose other jobs MemAvailable does not know of): that is all.
  if (const char* v = std::getenv("LLMTRAIN_MEMORY_AVAILABLE"); v && *v) {
    char* end = nullptr;
    const double bytes = std::strtod(v, &end);
    if (end && *end == 0 && bytes >= 0) return {bytes, "LLMTRAIN_MEMORY_AVAILABLE"};
    throw ConfigError(detail::concat("LLMTRAIN_MEMORY_AVAILABLE=\"", v,
                                     "\": expected a number of bytes, e.g. 8e9"));
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    double kb = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lf kB", &kb) == 1) {
      out = {kb * 1024, "MemAvailable"};
      break;
    }
  }
  double limit = 0, usage = 0;
  if (read_number("/sys/fs/cgroup/memory.max", limit) &&
      read_number("/sys/fs/cgroup/memory.current", usage)) {
    if (limit - usage < out.bytes) out = {limit - usage, "cgroup memory.max - memory.current"};
  } else if (read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes", limit) &&
             read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes", usage) && limit < 1e18) {
    if (limit - usage < out.bytes)
      out = {limit - usage, "cgroup memory.limit_in_bytes - memory.usage_in_bytes"};
  }
  // `ulimit -v`: the address space this process may still map.
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    double vm_kb = 0;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (std::sscanf(line.c_str(), "VmSize: %lf kB", &vm_kb) == 1) break;
    const double left = static_cast<double>(as.rlim_cur) - vm_kb * 1024;
    if (left < out.bytes) out = {std::max(left, 0.0), "ulimit -v (RLIMIT_AS) - VmSize"};
  }
  return out;
}

std::string gib(double bytes) {
  char buf[32];
  const double g = bytes / (1024.0 * 1024 * 1024);
  if (g >= 1024)
    std::snprintf(buf, sizeof buf, "%.4g TiB", g / 1024);
  else if (g >= 1)
    std::snprintf(buf, sizeof buf, "%.4g GiB", g);
  else
    std::snprintf(buf, sizeof buf, "%.4g MiB", g * 1024);
  return buf;
}

}  // namespace llmt
