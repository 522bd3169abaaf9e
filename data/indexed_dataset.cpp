// Reads the Megatron indexed dataset by memory map and validates every header field, length,
// pointer and document index against the file sizes before anything is read, so a corrupt or
// truncated dataset fails at open() with the file, the byte offset and expected vs found.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/check.h"

namespace llmt {

static_assert(std::endian::native == std::endian::little, "the .idx/.bin format is little-endian");

int64_t token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::u8:
    case TokenDType::i8:
      return 1;
    case TokenDType::i16:
    case TokenDType::u16:
      return 2;
    case TokenDType::i32:
    case TokenDType::f32:
      return 4;
    case TokenDType::i64:
    case TokenDType::f64:
      return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::u8:
      return "uint8";
    case TokenDType::i8:
      return "int8";
    case TokenDType::i16:
      return "int16";
    case TokenDType::i32:
      return "int32";
    case TokenDType::i64:
      return "int64";
    case TokenDType::f64:
      return "float64";
    case TokenDType::f32:
      return "float32";
    case TokenDType::u16:
      return "uint16";
  }
  return "?";
}

namespace {

// Byte offsets of the header fields (kIndexMagic is at 0).
constexpr int64_t kVersionAt = 9, kDTypeAt = 17, kSeqCountAt = 18, kDocCountAt = 26;
constexpr int64_t kHeaderBytes = kIndexHeaderBytes;

// The arrays start at unaligned offsets (34 is not a multiple of 4), so values are copied out.
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A read-only memory map of a whole file; an empty file maps to nothing.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(detail::concat(path, ": cannot open: ", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      throw Error(detail::concat(path, ": cannot stat: ", std::strerror(err)));
    }
    size_ = st.st_size;
    if (size_ > 0) {
      void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
      int err = errno;
      if (p == MAP_FAILED) {
        ::close(fd);
        throw Error(detail::concat(path, ": cannot mmap: ", std::strerror(err)));
      }
      data_ = static_cast<const uint8_t*>(p);
    }
    fd_ = fd;  // kept to notice the file shrinking under the map (check_intact)
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
    if (fd_ >= 0) ::close(fd_);
  }
  // Throws when the file is now shorter than when it was mapped: reading the lost pages would
  // end the process with SIGBUS. (A truncation between this check and the read still can.)
  void check_intact() const {
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && st.st_size < size_)
      throw Error(detail::concat(path_, ": the file shrank from ", size_, " to ", st.st_size,
                                 " bytes while training (truncated or rewritten in place?); "
                                 "restore it and resume from the last checkpoint"));
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

// Calls f(const T* tokens) with the .bin data typed as the dataset's dtype.
template <typename F>
void with_typed(TokenDType t, const uint8_t* p, F&& f) {
  switch (t) {
    case TokenDType::u8:
      return f(reinterpret_cast<const uint8_t*>(p));
    case TokenDType::i8:
      return f(reinterpret_cast<const int8_t*>(p));
    case TokenDType::i16:
      return f(reinterpret_cast<const int16_t*>(p));
    case TokenDType::i32:
      return f(reinterpret_cast<const int32_t*>(p));
    case TokenDType::i64:
      return f(reinterpret_cast<const int64_t*>(p));
    case TokenDType::f64:
      return f(reinterpret_cast<const double*>(p));
    case TokenDType::f32:
      return f(reinterpret_cast<const float*>(p));
    case TokenDType::u16:
      return f(reinterpret_cast<const uint16_t*>(p));
  }
}

template <typename T>
bool valid_token(T v, int64_t vocab_size) {
  if constexpr (std::is_floating_point_v<T>) {
    return v >= 0 && v < static_cast<T>(vocab_size) && v == std::trunc(v);
  } else {
    return static_cast<int64_t>(v) >= 0 && static_cast<int64_t>(v) < vocab_size;
  }
}

class MappedDataset final : public IndexedDataset {
 public:
  explicit MappedDataset(const std::string& prefix)
      : prefix_(prefix), idx_(prefix + ".idx"), bin_(prefix + ".bin") {
    validate();
  }

  const std::string& prefix() const override { return prefix_; }
  TokenDType dtype() const override { return dtype_; }
  int64_t num_sequences() const override { return num_seq_; }
  int64_t num_documents() const override { return num_doc_idx_ - 1; }
  int64_t num_tokens() const override { return num_tokens_; }

  int64_t sequence_length(int64_t i) const override {
    LLMT_CHECK(i >= 0 && i < num_seq_, prefix_, ": sequence ", i, " of ", num_seq_);
    return load<int32_t>(idx_.data() + lengths_at(i));
  }

  int64_t document_start(int64_t d) const override {
    LLMT_CHECK(d >= 0 && d < num_doc_idx_, prefix_, ": document ", d, " of ", num_doc_idx_ - 1);
    return load<int64_t>(idx_.data() + doc_index_at(d));
  }

  void read(int64_t i, int64_t offset, int64_t n, int32_t* out) const override {
    const int64_t len = sequence_length(i);
    LLMT_CHECK(offset >= 0 && n >= 0 && offset + n <= len, prefix_, ": tokens [", offset, ", ",
               offset + n, ") of sequence ", i, " (", len, " tokens)");
    bin_.check_intact();
    const uint8_t* p = bin_.data() + pointer(i) + offset * item_;
    with_typed(dtype_, p, [&](const auto* src) {
      for (int64_t k = 0; k < n; ++k) out[k] = static_cast<int32_t>(src[k]);
    });
  }

  void verify_tokens(int64_t vocab_size) const override {
    LLMT_CHECK(vocab_size > 0, "vocab_size=", vocab_size);
    // Chunks of 1M tokens checked in parallel; the first bad token (lowest position) is reported.
    constexpr int64_t kChunk = 1 << 20;
    const int64_t n_chunks = (num_tokens_ + kChunk - 1) / kChunk;
    int64_t first_bad = num_tokens_;
    with_typed(dtype_, bin_.data(), [&](const auto* tok) {
#pragma omp parallel for schedule(dynamic, 1) reduction(min : first_bad)
      for (int64_t c = 0; c < n_chunks; ++c) {
        const int64_t end = std::min(num_tokens_, (c + 1) * kChunk);
        for (int64_t k = c * kChunk; k < end; ++k) {
          if (!valid_token(tok[k], vocab_size)) {
            first_bad = std::min(first_bad, k);
            break;
          }
        }
      }
      if (first_bad == num_tokens_) return;
      const int64_t byte = first_bad * item_;
      const int64_t seq = sequence_at_byte(byte);
      throw Error(detail::concat(bin_.path(), ": byte ", byte, " (sequence ", seq, ", token ",
                                 (byte - pointer(seq)) / item_, "): token id: expected 0 <= id < ",
                                 vocab_size, " (the vocabulary size), found ", +tok[first_bad]));
    });
  }

 private:
  int64_t lengths_at(int64_t i) const {
    return kHeaderBytes + 4 * i;
  }
  int64_t pointers_at(int64_t i) const {
    return kHeaderBytes + 4 * num_seq_ + 8 * i;
  }
  int64_t doc_index_at(int64_t d) const {
    return kHeaderBytes + 12 * num_seq_ + 8 * d;
  }
  int64_t pointer(int64_t i) const {
    return load<int64_t>(idx_.data() + pointers_at(i));
  }

  // The non-empty sequence holding byte `byte` of the .bin (pointers are validated ascending).
  int64_t sequence_at_byte(int64_t byte) const {
    int64_t lo = 0, hi = num_seq_;  // first sequence whose pointer is > byte, in [lo, hi]
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      if (pointer(mid) <= byte)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo - 1;
  }

  template <typename... Args>
  [[noreturn]] void fail_idx(int64_t byte, const Args&... what) const {
    throw Error(detail::concat(idx_.path(), ": byte ", byte, ": ", what...));
  }

  void validate() {
    const uint8_t* p = idx_.data();
    const int64_t size = idx_.size();
    if (size >= 9 && std::memcmp(p, kIndexMagic, 9) != 0)
      fail_idx(0, "bad magic: expected MMIDIDX\\x00\\x00, found '",
               detail::escaped(std::string_view(reinterpret_cast<const char*>(p), 9)),
               "' (not a Megatron indexed dataset index)");
    if (size < kHeaderBytes)
      throw Error(detail::concat(idx_.path(), ": size ", size, " bytes, but the header needs ",
                                 kHeaderBytes, " (truncated?)"));
    const uint64_t version = load<uint64_t>(p + kVersionAt);
    if (version != 1) fail_idx(kVersionAt, "unknown version: expected 1, found ", version);
    const uint8_t code = p[kDTypeAt];
    if (code < 1 || code > 8)
      fail_idx(kDTypeAt, "unknown dtype code: expected 1-8 (1 uint8, 2 int8, 3 int16, 4 int32, ",
               "5 int64, 6 float64, 7 float32, 8 uint16), found ", +code);
    dtype_ = static_cast<TokenDType>(code);
    item_ = token_dtype_size(dtype_);

    // Counts bounded by the file size first, so the size arithmetic below cannot overflow.
    const uint64_t seq_count = load<uint64_t>(p + kSeqCountAt);
    const uint64_t doc_count = load<uint64_t>(p + kDocCountAt);
    if (doc_count == 0)
      fail_idx(kDocCountAt, "document index count: expected >= 1 (the leading 0), found 0");
    const uint64_t limit = static_cast<uint64_t>(size);
    const bool too_big = seq_count > limit / 12 || doc_count > limit / 8;
    const uint64_t need = too_big ? 0 : kHeaderBytes + 12 * seq_count + 8 * doc_count;
    if (too_big || need != limit) {
      std::string need_text = too_big ? "more than the file holds" : std::to_string(need);
      const char* hint = too_big || need > limit ? " (truncated?)" : " (trailing bytes?)";
      throw Error(detail::concat(idx_.path(), ": size ", size, " bytes, but the header's counts (",
                                 seq_count, " sequences, ", doc_count, " document indices) need ",
                                 need_text, hint));
    }
    num_seq_ = static_cast<int64_t>(seq_count);
    num_doc_idx_ = static_cast<int64_t>(doc_count);

    num_tokens_ = 0;
    for (int64_t i = 0; i < num_seq_; ++i) {
      const int32_t len = load<int32_t>(p + lengths_at(i));
      if (len < 0) fail_idx(lengths_at(i), "sequence ", i, " length: expected >= 0, found ", len);
      num_tokens_ += len;
    }

    const int64_t bin_need = num_tokens_ * item_;
    if (bin_.size() != bin_need)
      throw Error(detail::concat(bin_.path(), ": size ", bin_.size(),
                                 " bytes, but the index needs ", bin_need, " (", num_tokens_,
                                 " tokens x ", item_, " bytes)",
                                 bin_.size() < bin_need ? " (truncated?)" : " (trailing bytes?)"));

    // Sequences lie back to back from byte 0 (what Megatron's writer produces).
    int64_t expected = 0;
    for (int64_t i = 0; i < num_seq_; ++i) {
      const int64_t ptr = load<int64_t>(p + pointers_at(i));
      const int64_t len = load<int32_t>(p + lengths_at(i));
      if (ptr < 0 || ptr > bin_.size() - len * item_)
        fail_idx(pointers_at(i), "sequence ", i, " pointer: expected ", expected, ", found ", ptr,
                 ", which with its ", len, " tokens lies outside ", bin_.path(), " (", bin_.size(),
                 " bytes)");
      if (ptr != expected)
        fail_idx(
            pointers_at(i), "sequence ", i, " pointer: expected ", expected,
            i == 0 ? " (the first sequence starts the .bin)" : " (where the previous one ends)",
            ", found ", ptr);
      expected += len * item_;
    }

    int64_t prev = 0;
    for (int64_t d = 0; d < num_doc_idx_; ++d) {
      const int64_t v = load<int64_t>(p + doc_index_at(d));
      if (d == 0 && v != 0) fail_idx(doc_index_at(0), "document index 0: expected 0, found ", v);
      if (v < prev)
        fail_idx(doc_index_at(d), "document index ", d, ": expected >= ", prev,
                 " (document indices are non-decreasing), found ", v);
      prev = v;
    }
    if (prev != num_seq_)
      fail_idx(doc_index_at(num_doc_idx_ - 1), "document index ", num_doc_idx_ - 1,
               " (the last): expected ", num_seq_, " (the sequence count), found ", prev);
  }

  std::string prefix_;
  MappedFile idx_;
  MappedFile bin_;
  TokenDType dtype_ = TokenDType::u16;
  int64_t item_ = 2;         // bytes per token
  int64_t num_seq_ = 0;      // S
  int64_t num_doc_idx_ = 0;  // D = documents + 1
  int64_t num_tokens_ = 0;
};

}  // namespace

std::unique_ptr<IndexedDataset> IndexedDataset::open(const std::string& prefix) {
  return std::make_unique<MappedDataset>(prefix);
}

}  // namespace llmt
