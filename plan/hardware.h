// Hardware profiles: what the cost model (cost_model.h) knows of a device and its network. Data
// files, configs/hardware/NAME.toml, one [hardware] table each; the shipped ones are compiled into
// the binary (so `--hardware h100-80gb-sxm` works from any directory) and a user's own file is
// read by path. The "cpu" profile's zeros are filled from this machine (peak_flops.h, MemTotal).
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"

namespace llmt {

struct HardwareProfile {
  std::string name, description;
  std::string source;                                  // "built in" or the file it was read from
  double peak_fp32 = 0, peak_bf16 = 0, peak_fp16 = 0;  // dense FLOP/s of one device
  double memory_bytes = 0;                             // device memory
  double memory_bandwidth = 0;                         // bytes/s
  // Bytes/s one device sends in one direction to a peer of its node, and to one of another
  // node (its own NIC's share).
  double intra_node_bandwidth = 0, inter_node_bandwidth = 0;
  int devices_per_node = 0;      // 0: all ranks on one node
  double matmul_efficiency = 1;  // the fraction of peak a large GEMM reaches (an assumption)
  // The fraction of the compute a collective the strategy overlaps can actually hide behind
  // (optional key, default 1): 1 where the transfers run beside the compute (NCCL's kernels and
  // copy engines), 0 where they take the compute's cores or progress only inside the
  // communication calls (MPI between CPU ranks of one node).
  double comm_overlap = 1;
  // Bytes/s one device's share of the local disk moves in each direction ([offload] "nvme";
  // optional key, default 0: unknown, no time charged for the offloaded state's transfers).
  double nvme_bandwidth = 0;
  std::vector<std::string> detected;  // what was filled in from this machine, for the report

  // Peak FLOP/s of the dtype the model computes in.
  double peak(DType compute) const;
};

// The names of the built-in profiles, sorted.
std::vector<std::string> hardware_names();
// A built-in profile by name, or a profile file by path (anything with a '/' or ending in
// .toml). Zeros the file marks as "detect" are filled in for this machine: the peak by
// cpu_peak for `threads_per_rank` threads, the memory from /proc/meminfo. Throws ConfigError
// naming the key, the file and the names there are.
HardwareProfile load_hardware(const std::string& name_or_path, int threads_per_rank);
// The same from TOML text (tests); `name` names the document in messages.
HardwareProfile parse_hardware(const std::string& text, const std::string& name,
                               int threads_per_rank);

}  // namespace llmt
