// Rules: how each component checks its own config section (check_*_config, next to its
// *_config.h) after the values are read and the defaults filled. Every message names the keys
// with their values and ends with where the explicitly given ones were set; all problems of a
// config are collected and reported at once.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "config/toml_text.h"
#include "core/check.h"

namespace llmt {

class Rules {
 public:
  // Where a key was set: dotted key ("model.n_layers") and "file:line:col" or "--set".
  struct Origin {
    std::string key, at;
  };
  explicit Rules(std::vector<Origin> origins = {}) : origins_(std::move(origins)) {}
  std::vector<std::string> errors;

  // Unless ok: msg, then " (key at file:line:col, ...)" for each of `keys` that was set.
  void require(bool ok, std::initializer_list<std::string_view> keys, const std::string& msg) {
    require(ok, std::vector<std::string_view>(keys), msg);
  }
  void require(bool ok, const std::vector<std::string>& keys, const std::string& msg) {
    require(ok, std::vector<std::string_view>(keys.begin(), keys.end()), msg);
  }
  void require(bool ok, const std::vector<std::string_view>& keys, const std::string& msg);

  template <typename T>
  void at_least(std::string_view key, T v, T min, std::string_view hint = "") {
    require(v >= min, {key},
            detail::concat(key, "=", toml_text(v), " must be >= ", toml_text(min), hint));
  }
  template <typename T>
  void positive(std::string_view key, T v) {
    require(v > 0, {key}, detail::concat(key, "=", toml_text(v), " must be > 0"));
  }
  void unit_interval(std::string_view key, float v) {
    require(v >= 0 && v < 1, {key}, detail::concat(key, "=", toml_text(v), " must be in [0, 1)"));
  }

 private:
  std::vector<Origin> origins_;
};

}  // namespace llmt
