// The TensorBoard writer's pieces that TensorBoard itself cannot isolate: CRC-32C against its
// published check value, and the exact bytes of a record (framing and protobuf encoding) for one
// scalar. tests/e2e/check_tensorboard.py reads whole runs back with TensorBoard.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "train/tensorboard.h"

namespace llmt {
namespace {

TEST(TensorBoard, Crc32cCheckValue) {
  // RFC 3720 (iSCSI) appendix B.4 and the CRC catalogue's check value for "123456789".
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  const std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);  // RFC 3720 B.4: 32 bytes of 0
}

TEST(TensorBoard, ScalarRecordBytes) {
  const std::string dir = ::testing::TempDir() + "/tb_record";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.scalars(3, {{"a", 1.0}});
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Two records: file_version, then the scalar. Skip the first by its length.
  uint64_t n0 = 0;
  std::memcpy(&n0, bytes.data(), 8);
  const std::string second = bytes.substr(12 + n0 + 4);
  uint64_t n = 0;
  std::memcpy(&n, second.data(), 8);
  const std::string event = second.substr(12, n);
  // Event: wall_time (field 1, fixed64: 9 bytes), step (field 2 varint: 0x10 0x03), summary
  // (field 5, length 10): value (field 1, length 8): tag "a" (0x0a 0x01 'a'), simple_value 1.0f
  // (field 2 fixed32: 0x15 00 00 80 3f).
  ASSERT_EQ(n, 9u + 2u + 12u);
  EXPECT_EQ(static_cast<unsigned char>(event[0]), 0x09);
  const std::string rest = event.substr(9);
  const std::string want("\x10\x03\x2a\x0a\x0a\x08\x0a\x01\x61\x15\x00\x00\x80\x3f", 14);
  EXPECT_EQ(rest, want);
  // The record's CRCs: masked crc32c of the length and of the data.
  auto masked = [](const void* p, size_t k) {
    const uint32_t c = crc32c(p, k);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
  };
  uint32_t len_crc = 0, data_crc = 0;
  std::memcpy(&len_crc, second.data() + 8, 4);
  std::memcpy(&data_crc, second.data() + 12 + n, 4);
  EXPECT_EQ(len_crc, masked(second.data(), 8));
  EXPECT_EQ(data_crc, masked(event.data(), event.size()));
}

}  // namespace
}  // namespace llmt
