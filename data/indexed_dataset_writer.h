// Streams a Megatron indexed dataset to disk: tokens go to PREFIX.bin.tmp as documents arrive and
// sequence lengths to PREFIX.idx.tmp, so memory stays bounded; finalize() completes the index and
// renames both into place, so a crash or an exception never leaves a half-written dataset.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "data/indexed_dataset.h"

namespace llmt {

class IndexedDatasetWriter {
 public:
  // Tokens are stored as uint16 when vocab_size <= 65536, else int32. Creates the prefix's
  // folder if needed.
  IndexedDatasetWriter(const std::string& prefix, int64_t vocab_size);
  // Without finalize() (an exception on the way), removes the .tmp files.
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document as one sequence (an empty one is a sequence of length 0). Every id must
  // be in [0, vocab_size).
  void add_document(std::span<const int32_t> tokens);
  // Writes the pointers, document indices and header into PREFIX.idx.tmp, syncs both files and
  // renames them to PREFIX.bin and PREFIX.idx (an old PREFIX.idx is removed first, so a crash in
  // between leaves no loadable mismatched pair). Nothing may be added after it.
  void finalize();

  TokenDType dtype() const { return dtype_; }
  int64_t num_documents() const { return num_docs_; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  class File;
  std::string prefix_;
  int64_t vocab_size_;
  TokenDType dtype_;
  std::unique_ptr<File> bin_;  // PREFIX.bin.tmp
  std::unique_ptr<File> idx_;  // PREFIX.idx.tmp: header placeholder, then the lengths so far
  int64_t num_docs_ = 0;
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace llmt
