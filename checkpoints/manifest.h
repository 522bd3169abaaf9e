// manifest.json (docs/checkpoint-format.md, "Manifest"): the last file a save writes into its
// temporary directory before the rename. It lists every file of the checkpoint with its size and
// XXH64 and the step, and ends with the XXH64 of its own text. Readers check it before any HDF5
// parser sees a byte of a file: a flipped, truncated, swapped or foreign file is refused naming
// the file and what differs, and cannot reach libhdf5 (which a corrupt index can crash).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llmt::ckpt {

constexpr const char* kManifestFile = "manifest.json";

struct ManifestFile {
  std::string name;  // in the checkpoint directory: index.h5, rank_00000.h5, ...
  int64_t bytes = 0;
  uint64_t xxh64 = 0;  // of the whole file, seed 0
};

struct Manifest {
  int64_t step = 0;
  std::vector<ManifestFile> files;
  const ManifestFile* find(const std::string& name) const;
};

// The size and XXH64 of DIR/NAME, read in bounded pieces.
ManifestFile hash_file(const std::string& dir, const std::string& name);

// Writes DIR/manifest.json (its own XXH64 on the last line) through a temporary name, synced.
void write_manifest(const std::string& dir, const Manifest& m);

// Writes the manifest of the checkpoint in DIR written by one process: index.h5 and the rank
// files of ranks 0..world-1, each hashed here (the offline writers: reshard, import).
void write_manifest_of(const std::string& dir, int64_t step, int world);

// DIR/manifest.json, checked against its own checksum and the files' sizes (each listed file
// must exist with its size; the hashes are checked file by file with check_file). nullopt when
// the checkpoint has none (written before manifests existed). Throws Error naming the file and
// what differs.
std::optional<Manifest> read_manifest(const std::string& dir);

// Throws Error unless DIR/NAME is listed by the manifest and has its size and XXH64.
void check_file(const std::string& dir, const Manifest& m, const std::string& name);

}  // namespace llmt::ckpt
