// The offline checkpoint tools behind `llmtrain checkpoint inspect|verify|reshard`: no mesh, no
// MPI, one process; memory bounded by the largest box of one tensor (verify and inspect: by the
// checkpoint's read bound), estimated before anything is read.
#pragma once

#include <string>

#include "checkpoints/store.h"

namespace llmt::ckpt {

// The most memory an offline command's buffers hold at once, from the index alone (nothing read
// yet), and what decides it: the app compares it with the memory the host has left before it
// starts (exit 2 unless --force). Metadata (the index, the spec) is not counted.
struct ToolMemory {
  int64_t bytes = 0;
  std::string what;  // "the largest box, param/wte.weight (2048, 128) in rank_00000.h5"
};
// verify and inspect: the largest box read whole (up to the checkpoint's read bound), and for
// inspect a piece of it at a time besides.
ToolMemory verify_memory(const Checkpoint& ckpt);
ToolMemory inspect_memory(const Checkpoint& ckpt);
// reshard: the largest box of the new layout (written whole) and the largest box read whole.
ToolMemory reshard_memory(const Checkpoint& src, const ModelSpec& spec, const RunState& state);

// Step, layout, run state and every tensor with its global shape, dtype, L2 norm and number of
// boxes; the resolved config too when `with_config`. Boxes larger than the read bound are read
// in pieces of whole rows.
std::string inspect(const Checkpoint& ckpt, bool with_config);

// What verify read, for the report.
struct VerifyReport {
  std::vector<std::string> errors;
  int64_t tensors = 0, boxes = 0, bytes = 0;
};
// Checkpoint::verify plus check_model against `spec` (the model of the stored config).
VerifyReport verify(const Checkpoint& ckpt, const ModelSpec& spec);

// Writes a copy of `src` laid out for `state.mesh` (and state's zero stage and sequence
// parallelism, which only matter to the run that loads it) into `out`, via a temporary
// directory renamed into place at the end; `out` must not exist. state: src's run state with
// the new layout and config. Returns the tensor bytes written.
int64_t reshard(const Checkpoint& src, const ModelSpec& spec, const RunState& state,
                const std::string& out);

}  // namespace llmt::ckpt
