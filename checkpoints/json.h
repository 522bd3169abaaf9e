// A small JSON reader for what checkpoint import reads: Hugging Face config.json, a safetensors
// header and model.safetensors.index.json. RFC 8259 values; numbers as double (and exactly as
// int64 when they are integers of at most 2^53); object members in file order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace llmt::ckpt {

struct Json {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> items;                            // array
  std::vector<std::pair<std::string, Json>> members;  // object

  bool is_null() const { return kind == Kind::null; }
  // The member `key` of an object, or nullptr (also for a non-object).
  const Json* find(std::string_view key) const;
};

// Parses `text`; throws Error naming `what` and the byte offset of the first problem.
Json parse_json(std::string_view text, const std::string& what);

}  // namespace llmt::ckpt
