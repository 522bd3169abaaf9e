#include "config/toml_text.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "core/check.h"

namespace llmt {

namespace {
template <typename T>
std::string shortest(T v) {
  char buf[400];
  std::string s(buf, std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific).ptr);
  const size_t e = s.find('e');
  if (e == std::string::npos) return s;  // inf, nan
  const int exponent = std::atoi(s.c_str() + e + 1);
  if (exponent >= -4 && exponent < 16) {
    s.assign(buf, std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed).ptr);
    if (s.find('.') == std::string::npos) s += ".0";
  }
  return s;
}
}  // namespace

std::string float_text(double v, bool single) {
  if (single) {
    const float f = static_cast<float>(v);
    const std::string s = shortest(f);
    double back = 0;
    std::from_chars(s.data(), s.data() + s.size(), back);
    if (static_cast<float>(back) == f) return s;
  }
  return shortest(v);
}

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\u%04X", u);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string toml_text(int64_t v) {
  return std::to_string(v);
}
std::string toml_text(uint64_t v) {
  return std::to_string(v);
}
std::string toml_text(float v) {
  return float_text(v, true);
}
std::string toml_text(double v) {
  return float_text(v, false);
}
std::string toml_text(bool v) {
  return v ? "true" : "false";
}
std::string toml_text(const std::string& v) {
  return toml_string(v);
}
std::string toml_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += detail::concat(i ? ", " : "", v[i]);
  return s + "]";
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += detail::concat(s.empty() ? "" : "\n", l);
  return s;
}

}  // namespace llmt
