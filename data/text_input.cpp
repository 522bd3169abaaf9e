// Plain-text and JSONL document readers. The JSON scanner is the small subset JSONL corpora need:
// one object per line, the wanted top-level string field decoded (all escapes, surrogate pairs),
// every other value skipped without being decoded.
#include "data/text_input.h"

#include <cstring>

#include "core/check.h"

namespace llmt {

TextFormat text_format_of(const std::string& path) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return path.size() >= n && path.compare(path.size() - n, n, s) == 0;
  };
  return ends_with(".jsonl") || ends_with(".json") ? TextFormat::jsonl : TextFormat::text;
}

DocumentReader::DocumentReader(const std::string& path, const TextInputOptions& opts)
    : path_(path), opts_(opts), format_(text_format_of(path)), in_(path, std::ios::binary) {
  if (!in_) throw Error(detail::concat(path, ": cannot open: ", std::strerror(errno)));
}

bool DocumentReader::next_line() {
  if (!std::getline(in_, line_)) {
    if (in_.bad()) throw Error(detail::concat(path_, ": read failed after line ", line_no_));
    return false;
  }
  ++line_no_;
  bytes_read_ += static_cast<int64_t>(line_.size()) + (in_.eof() ? 0 : 1);
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  return true;
}

namespace {
bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\f\v") == std::string::npos;
}
}  // namespace

bool DocumentReader::next(std::string& doc) {
  doc.clear();
  if (format_ == TextFormat::jsonl) {
    while (next_line()) {
      if (blank(line_)) continue;
      doc = json_string_field(line_, opts_.json_key, detail::concat(path_, ":", line_no_));
      return true;
    }
    return false;
  }
  while (next_line()) {
    if (blank(line_)) {
      if (opts_.line_docs || doc.empty()) continue;
      return true;  // the blank line that ends a block
    }
    if (opts_.line_docs) {
      doc = line_;
      return true;
    }
    if (!doc.empty()) doc += '\n';
    doc += line_;
  }
  return !doc.empty();
}

namespace {

// A cursor over one JSON text; errors name `where` and the column.
class JsonScanner {
 public:
  JsonScanner(std::string_view s, const std::string& where) : s_(s), where_(where) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(detail::concat(where_, ": col ", pos_ + 1, ": ", what));
  }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of line (a JSONL record is one line)");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(detail::concat("expected '", c, "', found '", s_[pos_], "'"));
    ++pos_;
  }
  bool at_end() {
    skip_ws();
    return pos_ >= s_.size();
  }

  // A string at the cursor, decoded to UTF-8 (into `out` when given, else only skipped).
  void string(std::string* out) {
    expect('"');
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return;
      if (c != '\\') {
        if (out) *out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated string");
      const char e = s_[pos_++];
      char plain = 0;
      switch (e) {
        case '"':
          plain = '"';
          break;
        case '\\':
          plain = '\\';
          break;
        case '/':
          plain = '/';
          break;
        case 'b':
          plain = '\b';
          break;
        case 'f':
          plain = '\f';
          break;
        case 'n':
          plain = '\n';
          break;
        case 'r':
          plain = '\r';
          break;
        case 't':
          plain = '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired UTF-16 surrogate in \\u escape");
            pos_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired UTF-16 surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired UTF-16 surrogate in \\u escape");
          }
          if (out) append_utf8(*out, cp);
          continue;
        }
        default:
          fail(detail::concat("bad escape '\\", e, "'"));
      }
      if (out) *out += plain;
    }
  }

  // Any value at the cursor, skipped; returns its JSON type name for messages.
  const char* skip_value() {
    const char c = peek();
    if (c == '"') {
      string(nullptr);
      return "a string";
    }
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      if (peek() == close) {
        ++pos_;
        return c == '{' ? "an object" : "an array";
      }
      while (true) {
        if (c == '{') {
          string(nullptr);
          expect(':');
        }
        skip_value();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(close);
        return c == '{' ? "an object" : "an array";
      }
    }
    const size_t start = pos_;
    while (pos_ < s_.size() && std::strchr(",}] \t\r\n", s_[pos_]) == nullptr) ++pos_;
    const std::string_view word = s_.substr(start, pos_ - start);
    if (word == "true" || word == "false") return "a boolean";
    if (word == "null") return "null";
    if (!word.empty() && (word[0] == '-' || (word[0] >= '0' && word[0] <= '9'))) return "a number";
    pos_ = start;
    fail(detail::concat("not a JSON value: '", word.substr(0, 20), "'"));
  }

 private:
  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= h - '0';
      else if (h >= 'a' && h <= 'f')
        v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F')
        v |= h - 'A' + 10;
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }
  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view s_;
  const std::string& where_;
  size_t pos_ = 0;
};

}  // namespace

std::string json_string_field(std::string_view line, std::string_view key,
                              const std::string& where) {
  JsonScanner js(line, where);
  js.expect('{');
  std::string name, value, keys;
  bool found = false;
  if (js.peek() == '}') {
    js.expect('}');
  } else {
    while (true) {
      name.clear();
      js.string(&name);
      js.expect(':');
      if (name == key && !found) {
        if (js.peek() != '"')
          throw Error(detail::concat(where, ": field \"", key, "\" is ", js.skip_value(),
                                     ", expected a string"));
        js.string(&value);
        found = true;
      } else {
        js.skip_value();
      }
      keys += detail::concat(keys.empty() ? "" : ", ", name);
      if (js.peek() == ',') {
        js.expect(',');
        continue;
      }
      js.expect('}');
      break;
    }
  }
  if (!js.at_end()) js.fail("text after the JSON object (one object per line)");
  if (!found)
    throw Error(detail::concat(where, ": no \"", key, "\" field (fields: ",
                               keys.empty() ? "none" : keys, "); choose one with --json-key"));
  return value;
}

}  // namespace llmt
