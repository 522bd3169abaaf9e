// Saving and resuming a run on a mesh: the atomic directory protocol (docs/checkpoint-format.md,
// "Atomicity"), `latest`, keep_last, and moving each rank's state tensors to and from the files.
#pragma once

#include <optional>
#include <string>

#include "checkpoints/checkpoint_config.h"
#include "checkpoints/store.h"
#include "engine/core/allocator.h"
#include "engine/parallel/data_parallel.h"

namespace llmt::ckpt {

constexpr const char* kLatestFile = "latest";
constexpr const char* kTempPrefix = ".tmp.";

// "step_00000100".
std::string step_dir_name(int64_t step);

// The checkpoint directory [checkpoint].load asks for, or nullopt to start from initialisation.
// Throws ConfigError naming the path when "latest" (or a path) has no complete checkpoint.
std::optional<std::string> resolve_load(const CheckpointConfig& cfg);

// Removes temporary directories an interrupted save left in `dir`; returns their names (for the
// log). Run by one rank before training.
std::vector<std::string> remove_leftovers(const std::string& dir);

// Compares the checkpoint's tensors with the model's (global names and shapes): throws Error
// listing every tensor that is missing, extra or of another shape, with both shapes.
void check_model(const Checkpoint& ckpt, const ModelSpec& spec);

struct SaveResult {
  std::string path;    // the checkpoint directory
  int64_t bytes = 0;   // tensor bytes written by all ranks
  double seconds = 0;  // wall time of the save on this rank (training blocked that long)
};

// Collective over the mesh's world: every rank writes its pieces (layout.h) of the tensors
// `state` holds into DIR/.tmp.step_N/rank_R.h5; rank 0 writes index.h5; the directory is synced
// and renamed to DIR/step_N; `latest` is replaced atomically; checkpoints beyond keep_last go.
// tp_spec: the model spec sharded for this rank's tp coordinate.
SaveResult save(const CheckpointConfig& cfg, const RunState& run, const ModelSpec& spec,
                const ModelSpec& tp_spec, DataParallel& state, Mesh& mesh, DeviceBackend& backend);

// Reads every state tensor this rank holds from `ckpt` (whatever layout it was written in) and
// lets `state` refresh what derives from them. Returns the bytes read.
int64_t load(const Checkpoint& ckpt, const ModelSpec& tp_spec, DataParallel& state,
             DeviceBackend& backend);

}  // namespace llmt::ckpt
