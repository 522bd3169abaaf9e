// The TOML side of every config: the loader (files with `include = [...]` bases, then
// `--set section.key=value` overrides, later ones replacing earlier ones key by key), unknown
// sections and keys with did-you-mean suggestions, and typed reads that say what was expected
// and what was found. What the sections and keys are is the caller's Schema (train
// lists them); this library knows none of them.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/rules.h"
#include "config/toml_text.h"

namespace llmt {

// Did-you-mean: the edit distance (insertions, deletions, substitutions), and the candidate
// closest to `name` when it is near enough to be a typo of it (at most max(2, |name| / 3) edits).
size_t edit_distance(std::string_view a, std::string_view b);
std::optional<std::string> closest(std::string_view name, const std::vector<std::string>& cands);

// The sections and keys a config may have.
struct Schema {
  struct Key {
    std::string name;
    bool text = false;  // string-valued: a --set value is used verbatim unless it is a TOML string
  };
  struct Section {
    std::string name;
    std::vector<Key> keys;
    const Key* find(std::string_view key) const;
  };
  std::vector<Section> sections;
  const Section* find(std::string_view section) const;
};

// Where a value was written: "file:line:col", or just "--set".
struct Where {
  std::string file;
  uint32_t line = 0;
  uint32_t column = 0;
  std::string str() const;
};

// One key's value after merging; the node lives in a document owned by the Loader.
struct Setting {
  std::string section;
  std::string key;
  const toml::node* node;
  Where at;
  std::string dotted() const { return section + "." + key; }
};

// Reads documents and overrides into one list of settings, later ones replacing earlier ones
// key by key. Unknown sections and keys are collected in `errors` (with a did-you-mean); problems
// that leave nothing sensible to go on (unreadable file, TOML syntax, include cycle) throw
// ConfigError at once.
class Loader {
 public:
  explicit Loader(const Schema& schema) : schema_(schema) {}
  std::vector<Setting> settings;
  std::vector<std::string> errors;

  void load_file(const std::filesystem::path& path, const std::string& what);
  // `name` names the document in messages; includes are relative to its directory.
  void load_text(std::string_view text, const std::string& name);
  // "section.key=value": value in TOML syntax, or taken as a bare string when it is not TOML
  // (or when the key holds text, so that --set train.run_dir=2024-01-01 stays a path).
  void add_override(const std::string& text);
  // Where each setting was written, for Rules.
  std::vector<Rules::Origin> origins() const;

 private:
  struct Frame {
    std::filesystem::path canonical;
    std::string name;
  };
  void load_includes(const toml::node& node, const Where& at, const std::filesystem::path& dir);
  // The keys of `table` into `section`; a sub-table the schema names as a section
  // ("model.moe") into that section.
  void load_table(const Schema::Section& section, const toml::table& table,
                  const std::string& name);
  void set(const Schema::Section& section, std::string_view key, const toml::node& node,
           const Where& at);
  std::string suggest_key(std::string_view section, std::string_view key) const;
  std::string suggest_section(std::string_view name) const;

  const Schema& schema_;
  std::vector<std::unique_ptr<toml::table>> docs_;  // keeps every Setting::node alive
  std::vector<Frame> stack_;                        // documents being loaded, for cycle detection
};

// ---- typed reads: each returns the problem, or nothing when `out` was set ----

using Problem = std::optional<std::string>;

// "a string (\"four\")": what a user wrote, for "expected X, found Y".
std::string describe(const toml::node& n);

Problem read_value(const toml::node& n, int64_t& out);
Problem read_value(const toml::node& n, uint64_t& out);
Problem read_value(const toml::node& n, double& out);  // finite
Problem read_value(const toml::node& n, float& out);   // finite, within float range
Problem read_value(const toml::node& n, bool& out);
Problem read_value(const toml::node& n, std::string& out);
Problem read_value(const toml::node& n, std::vector<int64_t>& out);  // [3, 5]

// "\"a\", \"b\"".
template <size_t N>
std::string one_of(const std::array<std::string_view, N>& names) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += detail::concat(i ? ", " : "", toml_string(names[i]));
  return s;
}

// A string that must be one of `names`: its index.
template <size_t N>
Problem read_choice(const toml::node& n, const std::array<std::string_view, N>& names,
                    size_t& index) {
  if (auto* v = n.as_string()) {
    auto it = std::find(names.begin(), names.end(), v->get());
    if (it != names.end()) {
      index = static_cast<size_t>(it - names.begin());
      return {};
    }
  }
  return detail::concat("expected one of ", one_of(names), ", found ", describe(n));
}

// An array of distinct strings, each one of `names` (N <= 32): bit i of `bits` set for names[i].
template <size_t N>
Problem read_choices(const toml::node& n, const std::array<std::string_view, N>& names,
                     uint32_t& bits) {
  static_assert(N <= 32);
  const toml::array* list = n.as_array();
  if (!list) return detail::concat("expected an array of ", one_of(names), ", found ", describe(n));
  uint32_t out = 0;
  size_t entry = 0;
  for (const toml::node& item : *list) {
    ++entry;
    size_t i = 0;
    if (Problem p = read_choice(item, names, i)) return detail::concat("entry ", entry, ": ", *p);
    if ((out >> i) & 1u)
      return detail::concat("entry ", entry, ": ", toml_string(names[i]), " is listed twice");
    out |= 1u << i;
  }
  bits = out;
  return {};
}

// `bits` as the array read_choices reads: "[\"a\", \"c\"]".
template <size_t N>
std::string choices_text(const std::array<std::string_view, N>& names, uint32_t bits) {
  std::string s = "[";
  bool first = true;
  for (size_t i = 0; i < N; ++i) {
    if (!((bits >> i) & 1u)) continue;
    s += detail::concat(first ? "" : ", ", toml_string(names[i]));
    first = false;
  }
  return s + "]";
}

}  // namespace llmt
