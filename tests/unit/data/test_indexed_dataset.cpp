// The indexed dataset: write -> read round trips (uint16 and int32), the exact bytes of the
// format, files Megatron-LM writes (several sequences per document, documents without any), and
// one case per corruption, each asserting the exact error text.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "data/indexed_dataset_writer.h"
#include "tests/unit/data/dataset_files.h"

namespace llmt {
namespace {

using test::DatasetFiles;
using test::Docs;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  uint8_t raw[sizeof v];
  std::memcpy(raw, &v, sizeof v);
  b.insert(b.end(), raw, raw + sizeof v);
}

// Overwrites sizeof(T) bytes of `path` at `offset` with v (little-endian).
template <typename T>
void patch(const std::string& path, int64_t offset, T v) {
  std::vector<uint8_t> b = read_bytes(path);
  ASSERT_LE(offset + static_cast<int64_t>(sizeof v), static_cast<int64_t>(b.size()));
  std::memcpy(b.data() + offset, &v, sizeof v);
  write_bytes(path, b);
}

// An .idx as Megatron-LM writes it, from lengths and document indices.
std::vector<uint8_t> megatron_idx(uint8_t code, int64_t item, const std::vector<int32_t>& lengths,
                                  const std::vector<int64_t>& doc_idx) {
  std::vector<uint8_t> b(kIndexMagic, kIndexMagic + 9);
  put<uint64_t>(b, 1);
  put<uint8_t>(b, code);
  put<uint64_t>(b, lengths.size());
  put<uint64_t>(b, doc_idx.size());
  for (int32_t n : lengths) put(b, n);
  int64_t ptr = 0;
  for (int32_t n : lengths) {
    put(b, ptr);
    ptr += n * item;
  }
  for (int64_t d : doc_idx) put(b, d);
  return b;
}

std::vector<int32_t> read_all(const IndexedDataset& ds, int64_t i) {
  std::vector<int32_t> out(ds.sequence_length(i));
  ds.read(i, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

using IndexedDatasetTest = DatasetFiles;

TEST_F(IndexedDatasetTest, RoundTripUint16) {
  const Docs docs = {{1, 2, 3}, {}, {65535, 0, 7, 9}, {42}};
  auto ds = write("u16", docs, 65536);
  EXPECT_EQ(ds->dtype(), TokenDType::u16);
  EXPECT_EQ(ds->num_sequences(), 4);
  EXPECT_EQ(ds->num_documents(), 4);
  EXPECT_EQ(ds->num_tokens(), 8);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(read_all(*ds, i), docs[i]) << "sequence " << i;
    EXPECT_EQ(ds->document_start(i), i);
  }
  EXPECT_EQ(ds->document_start(4), 4);
  int32_t part[2];
  ds->read(2, 1, 2, part);
  EXPECT_EQ(part[0], 0);
  EXPECT_EQ(part[1], 7);
  ds->verify_tokens(65536);
}

TEST_F(IndexedDatasetTest, RoundTripInt32) {
  const Docs docs = {{65536, 99999, 0}, {70000}, {}};
  auto ds = write("i32", docs, 100000);
  EXPECT_EQ(ds->dtype(), TokenDType::i32);
  EXPECT_EQ(ds->num_tokens(), 4);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(read_all(*ds, i), docs[i]);
  EXPECT_EQ(std::filesystem::file_size(dir_ / "i32.bin"), 16u);
}

TEST_F(IndexedDatasetTest, EmptyDataset) {
  auto ds = write("empty", {}, 100);
  EXPECT_EQ(ds->num_sequences(), 0);
  EXPECT_EQ(ds->num_documents(), 0);
  EXPECT_EQ(ds->num_tokens(), 0);
  ds->verify_tokens(100);
}

// The bytes Megatron-LM's _IndexWriter produces for the same documents.
TEST_F(IndexedDatasetTest, ExactBytes) {
  write("bytes", {{1, 2, 3}, {4}}, 100);
  EXPECT_EQ(read_bytes((dir_ / "bytes.idx").string()), megatron_idx(8, 2, {3, 1}, {0, 1, 2}));
  EXPECT_EQ(read_bytes((dir_ / "bytes.bin").string()),
            (std::vector<uint8_t>{1, 0, 2, 0, 3, 0, 4, 0}));
}

TEST_F(IndexedDatasetTest, MegatronSentenceSplitFile) {
  // Document 0: sequences 0-1; document 1: none (Megatron writes no sequence for an empty
  // document); document 2: sequence 2.
  const std::string prefix = (dir_ / "meg").string();
  write_bytes(prefix + ".idx", megatron_idx(4, 4, {2, 1, 3}, {0, 2, 2, 3}));
  std::vector<uint8_t> bin;
  for (int32_t t : {10, 11, 12, 20, 21, 22}) put(bin, t);
  write_bytes(prefix + ".bin", bin);
  auto ds = IndexedDataset::open(prefix);
  EXPECT_EQ(ds->dtype(), TokenDType::i32);
  EXPECT_EQ(ds->num_sequences(), 3);
  EXPECT_EQ(ds->num_documents(), 3);
  EXPECT_EQ(ds->document_start(1), 2);
  EXPECT_EQ(ds->document_start(2), 2);
  EXPECT_EQ(read_all(*ds, 2), (std::vector<int32_t>{20, 21, 22}));
}

TEST_F(IndexedDatasetTest, WriterRejectsIdsOutsideTheVocabulary) {
  const std::string prefix = (dir_ / "w").string();
  IndexedDatasetWriter w(prefix, 100);
  w.add_document(std::vector<int32_t>{1, 2});
  try {
    w.add_document(std::vector<int32_t>{5, 100});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              prefix + ": document 1, token 1: id 100 is outside the vocabulary [0, 100)");
  }
}

TEST_F(IndexedDatasetTest, UnfinishedWriteLeavesTheOldDatasetAndNoTempFiles) {
  write("d", {{1, 2, 3}}, 100);
  const std::string prefix = (dir_ / "d").string();
  {
    IndexedDatasetWriter w(prefix, 100);
    w.add_document(std::vector<int32_t>{7, 7, 7, 7, 7});
    EXPECT_TRUE(std::filesystem::exists(prefix + ".bin.tmp"));
  }  // destroyed without finalize(), as when an exception unwinds prepare()
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin.tmp"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".idx.tmp"));
  auto ds = IndexedDataset::open(prefix);
  EXPECT_EQ(read_all(*ds, 0), (std::vector<int32_t>{1, 2, 3}));
}

// Several chunks of the parallel scan; the first bad token is reported wherever it lies.
TEST_F(IndexedDatasetTest, VerifyFindsTheFirstBadTokenAcrossChunks) {
  Docs docs(3, std::vector<int32_t>(700000, 3));
  docs[2][12345] = 9;
  docs[2][500000] = 8;
  auto ds = write("big", docs, 65536);
  ds->verify_tokens(10);
  try {
    ds->verify_tokens(9);
    FAIL() << "no error";
  } catch (const Error& e) {
    const int64_t byte = (1400000 + 12345) * 2;
    EXPECT_EQ(std::string(e.what()),
              detail::concat(ds->prefix(), ".bin: byte ", byte,
                             " (sequence 2, token 12345): token id: expected 0 <= id < 9 (the "
                             "vocabulary size), found 9"));
  }
}

// Corruptions of a dataset of 3 sequences {1,2,3}, {4,5}, {6} (uint16): .idx = 34-byte header,
// lengths at 34, pointers at 46, document indices at 70, 102 bytes in all; .bin = 12 bytes.
class CorruptDataset : public DatasetFiles {
 protected:
  void SetUp() override {
    DatasetFiles::SetUp();
    write("c", {{1, 2, 3}, {4, 5}, {6}}, 100);
    prefix_ = (dir_ / "c").string();
    idx_ = prefix_ + ".idx";
    bin_ = prefix_ + ".bin";
  }
  std::string open_error() {
    try {
      IndexedDataset::open(prefix_);
    } catch (const Error& e) {
      return e.what();
    }
    return "(opened without error)";
  }
  std::string prefix_, idx_, bin_;
};

TEST_F(CorruptDataset, TruncatedBin) {
  std::filesystem::resize_file(bin_, 10);
  EXPECT_EQ(open_error(),
            bin_ + ": size 10 bytes, but the index needs 12 (6 tokens x 2 bytes) (truncated?)");
}

TEST_F(CorruptDataset, TrailingBytesInBin) {
  std::filesystem::resize_file(bin_, 14);
  EXPECT_EQ(
      open_error(),
      bin_ + ": size 14 bytes, but the index needs 12 (6 tokens x 2 bytes) (trailing bytes?)");
}

TEST_F(CorruptDataset, MissingBin) {
  std::filesystem::remove(bin_);
  EXPECT_EQ(open_error(), bin_ + ": cannot open: No such file or directory");
}

TEST_F(CorruptDataset, TruncatedIdx) {
  std::filesystem::resize_file(idx_, 100);
  EXPECT_EQ(open_error(), idx_ +
                              ": size 100 bytes, but the header's counts (3 sequences, 4 "
                              "document indices) need 102 (truncated?)");
}

TEST_F(CorruptDataset, IdxShorterThanTheHeader) {
  std::filesystem::resize_file(idx_, 20);
  EXPECT_EQ(open_error(), idx_ + ": size 20 bytes, but the header needs 34 (truncated?)");
}

TEST_F(CorruptDataset, BadMagic) {
  patch(idx_, 0, std::array<char, 9>{'G', 'A', 'R', 'B', 'A', 'G', 'E', '\0', '\x01'});
  EXPECT_EQ(open_error(), idx_ +
                              ": byte 0: bad magic: expected MMIDIDX\\x00\\x00, found "
                              "'GARBAGE\\x00\\x01' (not a Megatron indexed dataset index)");
}

TEST_F(CorruptDataset, UnknownVersion) {
  patch<uint64_t>(idx_, 9, 2);
  EXPECT_EQ(open_error(), idx_ + ": byte 9: unknown version: expected 1, found 2");
}

TEST_F(CorruptDataset, UnknownDTypeCode) {
  patch<uint8_t>(idx_, 17, 9);
  EXPECT_EQ(open_error(), idx_ +
                              ": byte 17: unknown dtype code: expected 1-8 (1 uint8, 2 int8, "
                              "3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), "
                              "found 9");
}

TEST_F(CorruptDataset, SequenceCountBeyondTheFile) {
  patch<uint64_t>(idx_, 18, uint64_t{1} << 62);
  EXPECT_EQ(open_error(), idx_ +
                              ": size 102 bytes, but the header's counts (4611686018427387904 "
                              "sequences, 4 document indices) need more than the file holds "
                              "(truncated?)");
}

TEST_F(CorruptDataset, NoDocumentIndices) {
  patch<uint64_t>(idx_, 26, 0);
  EXPECT_EQ(open_error(),
            idx_ + ": byte 26: document index count: expected >= 1 (the leading 0), found 0");
}

TEST_F(CorruptDataset, NegativeSequenceLength) {
  patch<int32_t>(idx_, 34 + 4 * 1, -5);
  EXPECT_EQ(open_error(), idx_ + ": byte 38: sequence 1 length: expected >= 0, found -5");
}

TEST_F(CorruptDataset, PointerPastTheEnd) {
  patch<int64_t>(idx_, 46 + 8 * 2, 1000);
  EXPECT_EQ(open_error(), idx_ +
                              ": byte 62: sequence 2 pointer: expected 10, found 1000, which "
                              "with its 1 tokens lies outside " +
                              bin_ + " (12 bytes)");
}

TEST_F(CorruptDataset, PointerInconsistentWithLengths) {
  patch<int64_t>(idx_, 46 + 8 * 1, 4);
  EXPECT_EQ(open_error(), idx_ +
                              ": byte 54: sequence 1 pointer: expected 6 (where the previous "
                              "one ends), found 4");
}

TEST_F(CorruptDataset, FirstDocumentIndexNotZero) {
  patch<int64_t>(idx_, 70, 1);
  EXPECT_EQ(open_error(), idx_ + ": byte 70: document index 0: expected 0, found 1");
}

TEST_F(CorruptDataset, DocumentIndexOutOfOrder) {
  patch<int64_t>(idx_, 70 + 8 * 2, 0);
  EXPECT_EQ(open_error(), idx_ +
                              ": byte 86: document index 2: expected >= 1 (document indices "
                              "are non-decreasing), found 0");
}

TEST_F(CorruptDataset, LastDocumentIndexNotTheSequenceCount) {
  patch<int64_t>(idx_, 70 + 8 * 3, 2);
  EXPECT_EQ(open_error(), idx_ +
                              ": byte 94: document index 3 (the last): expected 3 (the "
                              "sequence count), found 2");
}

TEST_F(CorruptDataset, TokenIdAtLeastTheVocabularySize) {
  auto ds = IndexedDataset::open(prefix_);
  try {
    ds->verify_tokens(5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), bin_ +
                                         ": byte 8 (sequence 1, token 1): token id: expected "
                                         "0 <= id < 5 (the vocabulary size), found 5");
  }
}

}  // namespace
}  // namespace llmt
