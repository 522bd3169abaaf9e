// Values as TOML text: what `config show` prints and what every config message quotes, so a
// number reads the same in both (the shortest decimal that reads back to the same value).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llmt {

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string toml_string(std::string_view s);
// Shortest decimal that reads back to exactly v, fixed for exponents in [-4, 16) and scientific
// otherwise (as Python's repr), always with a '.' or an exponent so that TOML reads a float.
// single: the shortest float decimal when reading that through double gives the float back.
std::string float_text(double v, bool single);

std::string toml_text(int64_t v);
std::string toml_text(uint64_t v);
std::string toml_text(float v);
std::string toml_text(double v);
std::string toml_text(bool v);
std::string toml_text(const std::string& v);
std::string toml_text(const std::vector<int64_t>& v);  // "[3, 5]"

// Lines joined with '\n'.
std::string join_lines(const std::vector<std::string>& lines);

}  // namespace llmt
