// The checkpoint files (docs/checkpoint-format.md): one HDF5 file per rank holding the boxes it
// writes (Fletcher32-checksummed chunks), and index.h5 with one virtual dataset per global tensor
// mapping those boxes, plus the run state as attributes. Reading goes to the rank files directly
// (through the index's mappings), so an error names the file and dataset at fault.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoints/layout.h"
#include "checkpoints/manifest.h"

namespace llmt::ckpt {

namespace h5 {
class Id;  // checkpoints/h5.h
}

constexpr const char* kFormat = "llmtrain-checkpoint";
constexpr int64_t kVersion = 1;
constexpr const char* kIndexFile = "index.h5";
// Attribute of every rank-file dataset: XXH64 (seed 0) of the box's float32 values as
// little-endian bytes, row-major, as an int64 (the hash's bits). Fletcher32 covers each chunk's
// stored bytes; this covers what a reader gets, so a chunk the index no longer locates (read
// back as the fill value, without an error) is caught too.
constexpr const char* kChecksumAttr = "xxh64";
int64_t box_checksum(const float* data, int64_t numel);

// Everything besides tensors that resuming needs, and the layout the checkpoint was written in.
struct RunState {
  int64_t step = 0;              // optimizer steps taken (the next step is step + 1)
  int64_t updates = 0;           // AdamW updates applied (steps minus fp16-skipped ones)
  int64_t consumed_samples = 0;  // samples of the train stream read so far
  double loss_scale = 1.0;       // fp16 dynamic loss scale
  int64_t loss_scale_clean_steps = 0;
  int64_t seed = 0;                // train.seed (init, dropout)
  std::string config;              // the resolved config, TOML
  MeshShape mesh;                  // degrees tp, cp, dp, pp
  int64_t virtual_stages = 1;      // pipeline chunks per pp rank
  std::vector<int64_t> pp_layers;  // layers per pipeline stage; empty = even split
  // The V-shaped stage order of pp_schedule "zb-v" or "dualpipev" (absent from the index when
  // false, and from checkpoints written before it)
  bool pp_v_shape = false;
  int64_t zero_stage = 0;
  bool sequence_parallel = false;
  int64_t ep = 1;  // expert parallel degree (absent from checkpoints written before it: 1)
  // parallel.zero_shard_group (hybrid sharding; 0, and absent from the index: plain ZeRO)
  int64_t zero_shard_group = 0;
};
std::string layout_text(const RunState& s);  // "tp=2 cp=1 dp=2 pp=1 zero_stage=1 sp=false"
WriteLayout write_layout(const RunState& s);

// XXH64 of the run state (every RunState field), stored as index.h5's attribute state_xxh64: an
// edited step, updates, consumed_samples or mesh no longer matches it.
int64_t state_checksum(const RunState& s);

// Writes one rank's file: each dataset is a box of a global tensor, f32, chunked (at most 1 Mi
// elements per chunk) with the Fletcher32 filter; attribute "offset" = the box's global start.
// The file's attributes "rank" and "step" say whose and which step's it is (readers check both
// against the file name and the index).
class ShardFileWriter {
 public:
  ShardFileWriter(const std::string& path, int rank, int64_t step);
  ~ShardFileWriter();
  // data: box.count elements, row-major.
  void write(const std::string& dataset, const Box& box, const float* data);
  // Closes the file and syncs it to disk; throws if either fails.
  void close();
  int64_t bytes_written() const { return bytes_; }

 private:
  std::string path_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t bytes_ = 0;
};

// Writes DIR/index.h5 (virtual datasets over the rank files named in `tensors`), syncs it.
void write_index(const std::string& dir, const RunState& state,
                 const std::vector<IndexTensor>& tensors);

// A checkpoint directory opened for reading.
class Checkpoint {
 public:
  // Reads DIR/index.h5: the run state and every tensor's mappings. Throws Error naming the path
  // when it is not a complete checkpoint. With a manifest (manifest.h), every file is first
  // checked against it (sizes; index.h5's XXH64 before it is parsed, each rank file's before it
  // is opened); a checkpoint written before manifests is read unchecked (has_manifest()).
  explicit Checkpoint(const std::string& dir);
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;

  const std::string& dir() const { return dir_; }
  const RunState& state() const { return state_; }
  const std::vector<IndexTensor>& tensors() const { return tensors_; }
  const IndexTensor* find(const std::string& path) const;
  // The states it stores, in index order: kMasterState ("param") and whatever the optimizer of
  // the run that wrote it listed ("exp_avg", "exp_avg_sq" for AdamW).
  const std::vector<std::string>& states() const { return states_; }
  bool has_manifest() const { return manifest_.has_value(); }

  // The box `box` of global tensor `path` into out (box.count elements, row-major), read from
  // the rank files. Throws naming the file and dataset on a missing file, a checksum error or a
  // box not covered by the index.
  void read(const std::string& path, const Box& box, float* out) const;

  // Structural checks (no tensor data read): every tensor's mappings cover each element exactly
  // once, every rank file exists, is the rank its name says and of the index's step, and holds
  // each dataset with the mapped shape and offset. One message per problem.
  std::vector<std::string> check_structure() const;
  // check_structure, then every dataset of every rank file read in full (checksums), in pieces
  // of at most read_bound() bytes.
  std::vector<std::string> verify() const;
  // The most bytes one read holds at once: a box up to this size is read whole the first time
  // it is touched (checked, then served from memory); a larger one is checked in pieces of whole
  // rows this large and read part by part. Default kReadBound.
  static constexpr int64_t kReadBound = int64_t{256} << 20;
  int64_t read_bound() const { return read_bound_; }
  void set_read_bound(int64_t bytes) { read_bound_ = bytes; }

 private:
  // The first time dataset `d` (mapping m) is read: reads it (whole, or in pieces when larger
  // than read_bound_) and compares it with its checksum attribute; returns it when read whole
  // (the caller copies its part from it). Empty once checked, when read in pieces, or when the
  // box has no checksum: the caller reads its part from the file.
  std::vector<float> check_box(int64_t d, const Mapping& m, const std::string& where,
                               const std::string& tensor) const;
  // The rank file `name` (holding part of `tensor`), opened once: throws when it is missing, or
  // its rank or step attribute differs from its name's rank or the index's step.
  int64_t open_rank_file(const std::string& name, const std::string& tensor) const;
  // Mapping m's dataset, opened (its file through open_rank_file) and checked against the index:
  // its shape and offset. Throws naming `where`.
  h5::Id open_box(const Mapping& m, const std::string& tensor, const std::string& where) const;
  // Throws when dataset d's offset attribute is not where mapping m puts its box.
  void check_offset(int64_t d, const Mapping& m, const std::string& where) const;
  std::string dir_;
  std::optional<Manifest> manifest_;
  RunState state_;
  std::vector<IndexTensor> tensors_;
  std::vector<std::string> states_;
  std::map<std::string, size_t> by_path_;
  struct Files;
  std::unique_ptr<Files> files_;  // open rank files, by name
  int64_t read_bound_ = kReadBound;
};

}  // namespace llmt::ckpt
