// The offline checkpoint tools behind `llmtrain checkpoint inspect|verify|reshard`: no mesh, no
// MPI, one process; memory bounded by the largest box of one tensor.
#pragma once

#include <string>

#include "checkpoints/store.h"

namespace llmt::ckpt {

// Step, layout, run state and every tensor with its global shape, dtype, L2 norm and number of
// boxes; the resolved config too when `with_config`.
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
