// TensorBoard event files (tensorboard.h): record framing, CRC-32C and the protobuf encoding of
// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
// SessionLog session_log = 7; }, Summary { repeated Value value = 1; } with Value { string tag =
// 1; float simple_value = 2; }, and SessionLog { SessionStatus status = 1; } (START = 1).
#include "train/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace llmt {
namespace fs = std::filesystem;

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protocol buffer wire format: varints, tags (field << 3 | wire type), fixed64/fixed32 values
// little-endian, length-delimited bytes.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void tag(std::string& out, int field, int wire) {
  varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
template <typename T>
void fixed(std::string& out, int field, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& data) {
  tag(out, field, 2);
  varint(out, data.size());
  out += data;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t resumed_step) {
  if (dir.empty()) return;
  fs::create_directories(dir);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  path_ = (fs::path(dir) / detail::concat("events.out.tfevents.", now, ".", host)).string();
  out_.open(path_, std::ios::binary | std::ios::app);
  LLMT_CHECK(out_.is_open(), "log.tensorboard: cannot write ", path_);
  std::string event;
  fixed(event, 1, wall_time());
  bytes_field(event, 3, "brain.Event:2");
  record(event);
  if (resumed_step > 0) {
    std::string start, session;
    tag(session, 1, 0);
    varint(session, 1);  // START
    fixed(start, 1, wall_time());
    tag(start, 2, 0);
    varint(start, static_cast<uint64_t>(resumed_step + 1));
    bytes_field(start, 7, session);
    record(start);
  }
}

void TensorBoardWriter::record(const std::string& data) {
  const uint64_t n = data.size();
  char header[12];
  std::memcpy(header, &n, 8);
  const uint32_t len_crc = masked_crc(header, 8);
  std::memcpy(header + 8, &len_crc, 4);
  const uint32_t data_crc = masked_crc(data.data(), data.size());
  out_.write(header, 12);
  out_.write(data.data(), static_cast<std::streamsize>(data.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
  out_.flush();
}

void TensorBoardWriter::scalars(int64_t step,
                                const std::vector<std::pair<std::string, double>>& values) {
  if (!enabled()) return;
  std::string summary;
  for (const auto& [name, v] : values) {
    std::string value;
    bytes_field(value, 1, name);
    fixed(value, 2, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string event;
  fixed(event, 1, wall_time());
  tag(event, 2, 0);
  varint(event, static_cast<uint64_t>(step));
  bytes_field(event, 5, summary);
  record(event);
}

void TensorBoardWriter::write(const StepMetrics& m) {
  if (!enabled()) return;
  std::vector<std::pair<std::string, double>> v;
  for (const MetricValue& x : metric_record(m)) {
    if (x.kind == MetricValue::Kind::object || x.name == "step") continue;
    std::string tag = x.name;
    std::replace(tag.begin(), tag.end(), '.', '/');
    v.emplace_back(std::move(tag), x.value);
  }
  scalars(m.step, v);
}

}  // namespace llmt
