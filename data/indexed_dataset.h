// The Megatron indexed dataset (PREFIX.bin + PREFIX.idx, "MMIDIDX" header; docs/data.md):
// read by memory map and validated completely before training, written by streaming. Data
// prepared by Megatron-LM loads unchanged, and what we write loads there.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace llmt {

enum class TokenDType : uint8_t {
  u8 = 1,
  i8 = 2,
  i16 = 3,
  i32 = 4,
  i64 = 5,
  f64 = 6,
  f32 = 7,
  u16 = 8
};

// The .idx layout: magic (9 bytes) | u64 version = 1 | u8 dtype code | u64 sequence count S |
// u64 document index count D | i32 lengths[S] | i64 byte pointers[S] | i64 document indices[D].
inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr int64_t kIndexHeaderBytes = 34;

// Bytes per token of `t`, and its name as numpy spells it ("uint16").
int64_t token_dtype_size(TokenDType t);
const char* token_dtype_name(TokenDType t);

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
  // First sequence of document d, d in [0, num_documents()]; document d holds sequences
  // [document_start(d), document_start(d + 1)), possibly none (Megatron writes no sequence for a
  // document that tokenizes to nothing). document_start(num_documents()) == num_sequences().
  virtual int64_t document_start(int64_t d) const = 0;
  // Copies tokens [offset, offset + n) of sequence i into out as int32.
  virtual void read(int64_t i, int64_t offset, int64_t n, int32_t* out) const = 0;
  // Reads everything; throws naming the sequence, position and byte offset of the first token
  // id >= vocab_size (or < 0).
  virtual void verify_tokens(int64_t vocab_size) const = 0;
};

}  // namespace llmt
