// [offload] section: training state moved off the device's memory (ZeRO-Offload and
// ZeRO-Infinity's placements; docs/offload.md). Lives with the data-parallel strategies that
// allocate that state; train parses it, and the Trainer gives the allocator its FileStore
// (core/file_memory.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace llmt {

class Rules;

enum class OffloadTarget : uint8_t { none, host, nvme };
constexpr std::array<std::string_view, 3> kOffloadTargetNames{"none", "host", "nvme"};

struct OffloadConfig {
  // The optimizer's state (AdamW's m and v) and the fp32 master weights where they are kept apart
  // from the weights the model computes with (ZeRO stages 1-2 in 16-bit precision).
  OffloadTarget optimizer = OffloadTarget::none;
  // ZeRO-3's parameter shards (its fp32 master weights, gathered from before each use).
  OffloadTarget params = OffloadTarget::none;
  std::string nvme_dir;   // the directory of the files ("nvme"); must exist
  double buffer_mb = 64;  // the chunk streamed through memory at a time (read ahead, written back)
  bool any() const { return optimizer != OffloadTarget::none || params != OffloadTarget::none; }
};

// [offload]'s own rules: nvme_dir given with "nvme", buffer_mb >= 1, "host" refused (not built),
// nvme_dir and buffer_mb left at their defaults without "nvme".
void check_offload_config(const OffloadConfig& c, Rules& r);

}  // namespace llmt
