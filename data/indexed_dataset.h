// The Megatron indexed dataset (PREFIX.bin + PREFIX.idx, "MMIDIDX" header; REFERENCE.md):
// read by memory map and validated completely before training, written by streaming. Data
// prepared by Megatron-LM loads unchanged, and what we write loads there.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace llmt {

enum class TokenDType : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };

// Read-only view of one dataset. Every offset, count and length is checked against the file
// sizes at open(); a corrupt file throws llmt::Error naming the file, the byte offset, what was
// expected and what was found.
class IndexedDataset {
 public:
  // prefix: path without .bin/.idx. vocab_size > 0 additionally bounds every token id when
  // verify_tokens() is called.
  static std::unique_ptr<IndexedDataset> open(const std::string& prefix);
  virtual ~IndexedDataset() = default;

  virtual const std::string& prefix() const = 0;
  virtual TokenDType dtype() const = 0;
  virtual int64_t num_sequences() const = 0;  // Megatron "sequences" (one per document here)
  virtual int64_t num_documents() const = 0;  // document_indices.size() - 1
  virtual int64_t num_tokens() const = 0;
  virtual int64_t sequence_length(int64_t i) const = 0;
  // Copies tokens [offset, offset + n) of sequence i into out as int32.
  virtual void read(int64_t i, int64_t offset, int64_t n, int32_t* out) const = 0;
  // Reads everything; throws naming the sequence, position and byte offset of the first token
  // id >= vocab_size (or < 0).
  virtual void verify_tokens(int64_t vocab_size) const = 0;
};

}  // namespace llmt
