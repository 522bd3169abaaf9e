// The one JSON reader of the project (and its string writer, json_string): JSONL corpora (data
// prepare reads one string field of each line, skipping the rest undecoded: JsonScanner) and the
// JSON files checkpoint import reads (Hugging Face config.json, safetensors headers, the shard
// index), decoded whole (parse_json). RFC 8259: every escape, surrogate pairs to UTF-8, numbers as
// double (exact for integers up to 2^53), object members in file order; no NaN or Infinity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace llmt {

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

// A cursor over one JSON text. Errors (Error) name `where` and the column, with the line when
// the text has several: "f.jsonl:3: col 13: bad escape '\q'".
class JsonScanner {
 public:
  JsonScanner(std::string_view s, const std::string& where) : s_(s), where_(where) {}

  [[noreturn]] void fail(const std::string& what) const;
  void skip_ws();
  // The next non-space character (fails at the end of the text).
  char peek();
  void expect(char c);
  bool at_end();
  // A string at the cursor, decoded to UTF-8 (into `out` when given, else only skipped).
  void string(std::string* out);
  // Any value at the cursor, skipped; returns its JSON type name for messages ("a number").
  const char* skip_value();
  // Any value at the cursor, decoded (objects and arrays at most 64 deep).
  Json value(int depth = 0);

 private:
  uint32_t hex4();
  // The literal (true, false, null, a number) at the cursor, consumed.
  std::string_view word();

  std::string_view s_;
  const std::string& where_;
  size_t pos_ = 0;
};

// The whole of `text` as one value; throws Error naming `where` and the position.
Json parse_json(std::string_view text, const std::string& where);

// A JSON string literal of s (RFC 8259): quotes, backslashes and control characters escaped,
// other bytes as they are. For strings that may hold any of those (layouts with their TOML
// quotes, tokenizer pieces, profile names).
std::string json_string(std::string_view s);

}  // namespace llmt
