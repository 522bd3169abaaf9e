// [parallel] section: the mesh degrees and the data-parallel strategy. Lives with the parallel
// engine so it depends only on its own section; engine/train parses it and checks it against
// the world size (validate_layout) before anything is allocated.
#pragma once

#include <cstdint>

namespace llmt {

struct ParallelConfig {
  int64_t tp = 1;                  // tensor parallel degree
  int64_t cp = 1;                  // context parallel degree (not implemented yet: must be 1)
  int64_t dp = -1;                 // data parallel degree; -1 = world / (tp * cp * pp)
  int64_t pp = 1;                  // pipeline parallel degree (not implemented yet: must be 1)
  int64_t zero_stage = 0;          // 0 DDP, 1 optimizer state, 2 + gradients, 3 + parameters
  bool sequence_parallel = false;  // Megatron SP over the tp group
  double bucket_mb = 25.0;         // DDP/ZeRO gradient bucket size, MiB
};

}  // namespace llmt
