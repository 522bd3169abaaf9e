// Saving and resuming a run on a mesh: the atomic directory protocol (docs/checkpoint-format.md,
// "Atomicity"), `latest`, keep_last, and moving each rank's state tensors to and from the files.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "checkpoints/checkpoint_config.h"
#include "checkpoints/store.h"
#include "core/allocator.h"
#include "engine/optim/sharded_optimizer.h"
#include "engine/parallel/mesh.h"

namespace llmt::ckpt {

constexpr const char* kLatestFile = "latest";
constexpr const char* kTempPrefix = ".tmp.";

// "step_00000100".
std::string step_dir_name(int64_t step);

// DIR itself when it holds index.h5, else the checkpoint DIR/latest names (a checkpoint.dir of
// a run). Throws ConfigError naming DIR when it is neither.
std::string resolve_checkpoint_dir(const std::string& dir);

// The checkpoint directory [checkpoint].load asks for, or nullopt to start from initialisation.
// Throws ConfigError naming the path when "latest" (or a path) has no complete checkpoint.
std::optional<std::string> resolve_load(const CheckpointConfig& cfg);

// Removes temporary directories an interrupted save left in `dir`; returns their names (for the
// log). Run by one rank before training.
std::vector<std::string> remove_leftovers(const std::string& dir);

// Compares the checkpoint's tensors with the model's (global names and shapes) for each of
// `states` (the master weights always; a run passes TrainingState::state_names(), the offline
// tools the checkpoint's own states()): throws ConfigError listing every state one side keeps and
// the other does not, and every tensor that is missing, extra or of another shape, with both
// shapes.
void check_model(const Checkpoint& ckpt, const ModelSpec& spec,
                 const std::vector<std::string>& states);

struct SaveResult {
  std::string path;            // the checkpoint directory
  int64_t bytes = 0;           // tensor bytes written by all ranks
  double write_seconds = 0;    // from the start until this rank's file was written and synced
  double total_seconds = 0;    // from the start until the checkpoint was complete
  double blocked_seconds = 0;  // of which training was blocked (all of it for a synchronous save)
};

// One save of the atomic protocol, in phases. The constructor (collective) creates the
// temporary directory and either writes this rank's file at once (background = false) or copies
// this rank's pieces to host memory and writes them from a thread while training goes on (rank 0
// also writes index.h5, which depends on the layout only). poll() (collective: every rank calls
// it at the same points) finishes the save once every rank's files are written: rank 0 renames
// the directory, replaces `latest` and prunes.
class PendingSave {
 public:
  // staging: the host memory the save copies through (a background save's whole snapshot, a
  // synchronous one's largest piece; pinned when `backend` is a GPU), kept by the caller from one
  // save to the next so that it is allocated and pinned once (null: the save allocates its own).
  PendingSave(const CheckpointConfig& cfg, const RunState& run, const ModelSpec& spec,
              const ModelSpec& tp_spec, TrainingState& state, Mesh& mesh, DeviceBackend& backend,
              bool background, HostBuffer* staging = nullptr);
  ~PendingSave();
  PendingSave(const PendingSave&) = delete;
  PendingSave& operator=(const PendingSave&) = delete;
  // wait = false: returns false at once unless every rank's file is written; true once the
  // checkpoint is complete. Throws on every rank if any rank failed.
  bool poll(bool wait);
  const SaveResult& result() const { return result_; }
  int64_t step() const { return run_.step; }

 private:
  struct PieceData {
    Piece piece;
    const float* device;  // the rows in the state tensor (device memory)
    int64_t numel;
    int64_t offset = 0;  // background saves: where the snapshot of the rows is in staging_
  };
  void write_file(DeviceBackend* backend);  // backend: read the device rows (synchronous)

  CheckpointConfig cfg_;
  RunState run_;
  const ModelSpec& spec_;
  const ModelSpec& tp_spec_;
  std::vector<std::string> states_;  // what the training state lists, master weights first
  Mesh& mesh_;
  std::chrono::steady_clock::time_point start_;
  std::string name_, tmp_;
  std::vector<PieceData> pieces_;
  // This rank's file (rank 0: and index.h5) as the manifest lists it, once written.
  std::vector<ManifestFile> written_files_;
  HostBuffer own_staging_;
  HostBuffer* staging_;  // the snapshot (background saves), one piece (synchronous saves)
  std::thread writer_;
  std::atomic<bool> written_{false};
  std::string error_;
  int64_t bytes_ = 0;
  double write_s_ = 0, blocked_s_ = 0;
  bool finished_ = false;
  SaveResult result_;
};

// A synchronous save (PendingSave without a thread), collective over the mesh's world: every
// rank writes its pieces (layout.h) into DIR/.tmp.step_N/rank_R.h5; rank 0 writes index.h5; the
// directory is synced and renamed to DIR/step_N; `latest` is replaced atomically; checkpoints
// beyond keep_last go. tp_spec: the model spec sharded for this rank's tp coordinate.
SaveResult save(const CheckpointConfig& cfg, const RunState& run, const ModelSpec& spec,
                const ModelSpec& tp_spec, TrainingState& state, Mesh& mesh, DeviceBackend& backend);

// Reads every state tensor this rank holds from `ckpt` (whatever layout it was written in), or
// with `weights_only` the master weights alone (the optimizer's state stays as it is), and lets
// `state` refresh what derives from them. Returns the bytes read.
int64_t load(const Checkpoint& ckpt, const ModelSpec& tp_spec, TrainingState& state,
             DeviceBackend& backend, bool weights_only = false);

}  // namespace llmt::ckpt
