#include "config/json.h"

#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace llmt {

namespace {

void append_utf8(std::string& out, uint32_t cp) {
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

bool is_number(std::string_view w) {
  return !w.empty() && ((w[0] >= '0' && w[0] <= '9') ||
                        (w[0] == '-' && w.size() > 1 && w[1] >= '0' && w[1] <= '9'));
}

}  // namespace

const Json* Json::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

void JsonScanner::fail(const std::string& what) const {
  const size_t nl = s_.rfind('\n', pos_ == 0 ? 0 : pos_ - 1);
  if (nl == std::string_view::npos || nl >= pos_)
    throw Error(detail::concat(where_, ": col ", pos_ + 1, ": ", what));
  size_t line = 1;
  for (size_t i = 0; i < pos_; ++i) line += s_[i] == '\n' ? 1 : 0;
  throw Error(detail::concat(where_, ": line ", line, " col ", pos_ - nl, ": ", what));
}

void JsonScanner::skip_ws() {
  while (pos_ < s_.size() &&
         (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
    ++pos_;
}

char JsonScanner::peek() {
  skip_ws();
  if (pos_ >= s_.size()) fail("unexpected end of line (a JSONL record is one line)");
  return s_[pos_];
}

void JsonScanner::expect(char c) {
  if (peek() != c) fail(detail::concat("expected '", c, "', found '", s_[pos_], "'"));
  ++pos_;
}

bool JsonScanner::at_end() {
  skip_ws();
  return pos_ >= s_.size();
}

void JsonScanner::string(std::string* out) {
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
      case '\\':
      case '/':
        plain = e;
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

std::string_view JsonScanner::word() {
  const size_t start = pos_;
  while (pos_ < s_.size() && std::strchr(",}] \t\r\n", s_[pos_]) == nullptr) ++pos_;
  const std::string_view w = s_.substr(start, pos_ - start);
  if (w == "true" || w == "false" || w == "null" || is_number(w)) return w;
  pos_ = start;
  fail(detail::concat("not a JSON value: '", w.substr(0, 20), "'"));
}

const char* JsonScanner::skip_value() {
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
  const std::string_view w = word();
  if (w == "true" || w == "false") return "a boolean";
  if (w == "null") return "null";
  return "a number";
}

Json JsonScanner::value(int depth) {
  if (depth > 64) fail("nested more than 64 deep");
  Json v;
  const char c = peek();
  if (c == '"') {
    v.kind = Json::Kind::string;
    string(&v.string);
  } else if (c == '{' || c == '[') {
    const bool object = c == '{';
    v.kind = object ? Json::Kind::object : Json::Kind::array;
    ++pos_;
    if (peek() == (object ? '}' : ']')) {
      ++pos_;
      return v;
    }
    while (true) {
      if (object) {
        std::string key;
        string(&key);
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
      } else {
        v.items.push_back(value(depth + 1));
      }
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(object ? '}' : ']');
      return v;
    }
  } else {
    const size_t start = pos_;
    const std::string_view w = word();
    if (w == "true" || w == "false") {
      v.kind = Json::Kind::boolean;
      v.boolean = w == "true";
    } else if (w != "null") {
      v.kind = Json::Kind::number;
      const std::string text(w);
      char* end = nullptr;
      v.number = std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size() || text.find_first_of("xXnN") != std::string::npos) {
        pos_ = start;
        fail("not a JSON number: '" + text.substr(0, 20) + "'");
      }
    }
  }
  return v;
}

uint32_t JsonScanner::hex4() {
  if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const char h = s_[pos_++];
    v <<= 4;
    if (h >= '0' && h <= '9')
      v |= static_cast<uint32_t>(h - '0');
    else if (h >= 'a' && h <= 'f')
      v |= static_cast<uint32_t>(h - 'a' + 10);
    else if (h >= 'A' && h <= 'F')
      v |= static_cast<uint32_t>(h - 'A' + 10);
    else
      fail("bad hex digit in \\u escape");
  }
  return v;
}

Json parse_json(std::string_view text, const std::string& where) {
  JsonScanner js(text, where);
  Json v = js.value();
  if (!js.at_end()) js.fail("text after the JSON value");
  return v;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x",
                    static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace llmt
