// The streaming writer of the Megatron indexed dataset. Megatron-LM keeps every sequence length
// in memory until the end; here they stream into the .idx.tmp file behind a header placeholder
// and are read back once at finalize() to derive the pointers, so memory is O(1) in the corpus.
#include "data/indexed_dataset_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/check.h"

namespace llmt {

// A file written through a 1 MiB buffer, with positioned reads and writes for finalize().
class IndexedDatasetWriter::File {
 public:
  explicit File(std::string path) : path_(std::move(path)), buf_(1 << 20) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create");
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& path() const { return path_; }

  void append(const void* p, size_t n) {
    const auto* src = static_cast<const uint8_t*>(p);
    while (n > 0) {
      if (used_ == buf_.size()) flush();
      size_t k = std::min(n, buf_.size() - used_);
      std::memcpy(buf_.data() + used_, src, k);
      used_ += k;
      src += k;
      n -= k;
    }
  }

  void flush() {
    for (size_t done = 0; done < used_;) {
      ssize_t k = ::write(fd_, buf_.data() + done, used_ - done);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) fail("write failed");
      done += static_cast<size_t>(k);
    }
    used_ = 0;
  }

  void read_at(void* p, size_t n, int64_t at) {
    if (::pread(fd_, p, n, at) != static_cast<ssize_t>(n)) fail("read-back failed");
  }

  void write_at(const void* p, size_t n, int64_t at) {
    if (::pwrite(fd_, p, n, at) != static_cast<ssize_t>(n)) fail("write failed");
  }

  void sync_and_close() {
    flush();
    if (::fsync(fd_) != 0) fail("fsync failed");
    if (::close(fd_) != 0) fail("close failed");
    fd_ = -1;
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw Error(detail::concat(path_, ": ", what, ": ", std::strerror(errno)));
  }

  std::string path_;
  int fd_ = -1;
  std::vector<uint8_t> buf_;
  size_t used_ = 0;
};

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, int64_t vocab_size)
    : prefix_(prefix),
      vocab_size_(vocab_size),
      dtype_(vocab_size <= 65536 ? TokenDType::u16 : TokenDType::i32) {
  LLMT_CHECK(vocab_size > 0, "vocab_size=", vocab_size);
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw Error(detail::concat(parent.string(), ": cannot create folder: ", ec.message()));
  bin_ = std::make_unique<File>(prefix + ".bin.tmp");
  idx_ = std::make_unique<File>(prefix + ".idx.tmp");
  const uint8_t placeholder[kIndexHeaderBytes] = {};
  idx_->append(placeholder, sizeof placeholder);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (finalized_) return;
  bin_.reset();
  idx_.reset();
  std::remove((prefix_ + ".bin.tmp").c_str());
  std::remove((prefix_ + ".idx.tmp").c_str());
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  LLMT_CHECK(!finalized_, prefix_, ": add_document after finalize");
  LLMT_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), prefix_, ": document ", num_docs_,
             " has ", tokens.size(), " tokens; a sequence holds at most 2^31-1");
  for (size_t k = 0; k < tokens.size(); ++k) {
    if (tokens[k] < 0 || tokens[k] >= vocab_size_)
      throw Error(detail::concat(prefix_, ": document ", num_docs_, ", token ", k, ": id ",
                                 tokens[k], " is outside the vocabulary [0, ", vocab_size_, ")"));
  }
  if (dtype_ == TokenDType::u16) {
    uint16_t narrow[4096];
    for (size_t k = 0; k < tokens.size(); k += std::size(narrow)) {
      const size_t n = std::min(std::size(narrow), tokens.size() - k);
      for (size_t j = 0; j < n; ++j) narrow[j] = static_cast<uint16_t>(tokens[k + j]);
      bin_->append(narrow, n * sizeof(uint16_t));
    }
  } else {
    bin_->append(tokens.data(), tokens.size_bytes());
  }
  const int32_t len = static_cast<int32_t>(tokens.size());
  idx_->append(&len, sizeof len);
  ++num_docs_;
  num_tokens_ += len;
}

void IndexedDatasetWriter::finalize() {
  LLMT_CHECK(!finalized_, prefix_, ": finalize twice");
  bin_->sync_and_close();

  // Pointers: byte offsets of each sequence, back to back from 0; read the lengths back in blocks.
  const int64_t S = num_docs_, item = token_dtype_size(dtype_);
  idx_->flush();
  std::vector<int32_t> lengths(1 << 16);
  std::vector<int64_t> values(lengths.size());
  int64_t ptr = 0;
  for (int64_t first = 0; first < S; first += static_cast<int64_t>(lengths.size())) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(lengths.size()), S - first);
    idx_->read_at(lengths.data(), n * sizeof(int32_t), kIndexHeaderBytes + 4 * first);
    for (int64_t k = 0; k < n; ++k) {
      values[k] = ptr;
      ptr += lengths[k] * item;
    }
    idx_->append(values.data(), n * sizeof(int64_t));
  }
  // Document indices: one sequence per document, so document d starts at sequence d; D = S + 1.
  for (int64_t first = 0; first <= S; first += static_cast<int64_t>(values.size())) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(values.size()), S + 1 - first);
    for (int64_t k = 0; k < n; ++k) values[k] = first + k;
    idx_->append(values.data(), n * sizeof(int64_t));
  }
  idx_->flush();

  uint8_t header[kIndexHeaderBytes];
  const uint64_t version = 1, seq_count = S, doc_count = S + 1;
  const uint8_t code = static_cast<uint8_t>(dtype_);
  std::memcpy(header, kIndexMagic, 9);
  std::memcpy(header + 9, &version, 8);
  std::memcpy(header + 17, &code, 1);
  std::memcpy(header + 18, &seq_count, 8);
  std::memcpy(header + 26, &doc_count, 8);
  idx_->write_at(header, sizeof header, 0);
  idx_->sync_and_close();

  const std::string bin_path = prefix_ + ".bin", idx_path = prefix_ + ".idx";
  std::error_code ec;
  std::filesystem::remove(idx_path, ec);
  if (!ec) std::filesystem::rename(bin_->path(), bin_path, ec);
  if (!ec) std::filesystem::rename(idx_->path(), idx_path, ec);
  if (ec)
    throw Error(
        detail::concat(prefix_, ": cannot move the finished files into place: ", ec.message()));
  finalized_ = true;
}

}  // namespace llmt
