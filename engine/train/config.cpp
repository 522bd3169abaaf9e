// Strict TOML -> Config. One table (sections()) lists every key of every section with the member
// it fills; reading, printing, did-you-mean suggestions and --set resolution all go through it, so
// adding a key is one line there. A run is: load files (includes first, the including file wins
// key by key) and --set overrides -> read typed values -> fill presets and derived defaults ->
// check every cross-key rule. Each stage reports all of its problems at once.
#include "engine/train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

#include "data/gpt_dataset.h"
#include "engine/core/check.h"
#include "engine/model/model_spec.h"

namespace llmt {
namespace {

namespace fs = std::filesystem;
using detail::concat;

// Accepted spellings of each enum, indexed by the enum's value.
constexpr std::array<std::string_view, 2> kArchNames{"gpt2", "llama"};
constexpr std::array<std::string_view, 2> kNormNames{"layernorm", "rmsnorm"};
constexpr std::array<std::string_view, 2> kActivationNames{"gelu", "swiglu"};
constexpr std::array<std::string_view, 2> kPositionNames{"learned", "rope"};
constexpr std::array<std::string_view, 3> kDecayNames{"cosine", "linear", "constant"};
constexpr std::array<std::string_view, 3> kPrecisionNames{"fp32", "bf16", "fp16"};
constexpr std::array<std::string_view, 3> kRecomputeNames{"none", "selective", "full"};
constexpr std::array<std::string_view, 2> kSourceNames{"synthetic", "indexed"};
constexpr std::array<std::string_view, 3> kDeviceNames{"auto", "cpu", "cuda"};
constexpr std::array<std::string_view, 4> kScheduleNames{"gpipe", "1f1b", "interleaved", "zb-h1"};

// ---- TOML text for values (also used in messages, so numbers read the same everywhere) ----

// Shortest decimal that reads back to exactly `v` (std::to_chars), fixed for exponents in
// [-4, 16) and scientific otherwise (as Python's repr), always with a '.' or an exponent so that
// TOML reads a float.
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

// A float field's text: its shortest float decimal when reading that through double (as the
// TOML reader does) gives the same float back, else the double's, which always does.
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

// A TOML basic string: quotes, backslashes and control characters escaped.
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
  for (size_t i = 0; i < v.size(); ++i) s += concat(i ? ", " : "", v[i]);
  return s + "]";
}
// [[data.sources]] as an array of inline tables.
std::string toml_text(const std::vector<DataSourceConfig>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i)
    s += concat(i ? ", " : "", "{path = ", toml_string(v[i].path),
                ", weight = ", toml_text(v[i].weight), "}");
  return s + "]";
}

template <size_t N>
std::string one_of(const std::array<std::string_view, N>& names) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += concat(i ? ", " : "", toml_string(names[i]));
  return s;
}

// "a string (\"four\")": what a user wrote, for "expected X, found Y".
std::string describe(const toml::node& n) {
  if (auto* v = n.as_string()) return concat("a string (", toml_string(v->get()), ")");
  if (auto* v = n.as_integer()) return concat("an integer (", v->get(), ")");
  if (auto* v = n.as_floating_point()) return concat("a float (", float_text(v->get(), false), ")");
  if (auto* v = n.as_boolean()) return concat("a boolean (", toml_text(v->get()), ")");
  if (n.is_table()) return "a table";
  if (n.is_array()) return "an array";
  std::ostringstream os;
  n.visit([&](const auto& v) { os << v; });
  return concat("a date/time (", os.str(), ")");
}

// ---- typed reads: each returns the problem, or nothing when `out` was set ----

using Problem = std::optional<std::string>;

Problem read_value(const toml::node& n, int64_t& out) {
  if (auto* v = n.as_integer()) {
    out = v->get();
    return {};
  }
  return concat("expected an integer, found ", describe(n));
}

Problem read_value(const toml::node& n, uint64_t& out) {
  if (auto* v = n.as_integer(); v && v->get() >= 0) {
    out = static_cast<uint64_t>(v->get());
    return {};
  }
  return concat("expected a non-negative integer, found ", describe(n));
}

Problem read_value(const toml::node& n, double& out) {
  double v;
  if (auto* i = n.as_integer()) {
    v = static_cast<double>(i->get());
  } else if (auto* f = n.as_floating_point()) {
    v = f->get();
  } else {
    return concat("expected a number, found ", describe(n));
  }
  if (!std::isfinite(v)) return concat("expected a finite number, found ", describe(n));
  out = v;
  return {};
}

Problem read_value(const toml::node& n, float& out) {
  double v = 0;
  if (auto p = read_value(n, v)) return p;
  if (std::fabs(v) > std::numeric_limits<float>::max()) {
    return concat("expected a number within 32-bit float range (3.4e38), found ", describe(n));
  }
  out = static_cast<float>(v);
  return {};
}

Problem read_value(const toml::node& n, bool& out) {
  if (auto* v = n.as_boolean()) {
    out = v->get();
    return {};
  }
  return concat("expected a boolean (true or false), found ", describe(n));
}

Problem read_value(const toml::node& n, std::string& out) {
  if (auto* v = n.as_string()) {
    out = v->get();
    return {};
  }
  return concat("expected a string, found ", describe(n));
}

// An array of integers, e.g. parallel.pp_layers = [3, 5].
Problem read_value(const toml::node& n, std::vector<int64_t>& out) {
  const toml::array* list = n.as_array();
  if (!list) return concat("expected an array of integers, found ", describe(n));
  std::vector<int64_t> values;
  for (const toml::node& item : *list) {
    auto* v = item.as_integer();
    if (!v)
      return concat("entry ", values.size() + 1, ": expected an integer, found ", describe(item));
    values.push_back(v->get());
  }
  out = std::move(values);
  return {};
}

// [[data.sources]]: an array of tables, each with exactly `path` and `weight`.
Problem read_value(const toml::node& n, std::vector<DataSourceConfig>& out) {
  const toml::array* list = n.as_array();
  if (!list) return concat("expected an array of tables ([[data.sources]]), found ", describe(n));
  std::vector<DataSourceConfig> entries;
  for (const toml::node& item : *list) {
    const std::string entry = concat("entry ", entries.size() + 1);
    const toml::table* t = item.as_table();
    if (!t) return concat(entry, ": expected a table {path, weight}, found ", describe(item));
    DataSourceConfig e;
    std::set<std::string> seen;
    for (auto&& [k, v] : *t) {
      Problem p;
      if (k.str() == "path") {
        p = read_value(v, e.path);
      } else if (k.str() == "weight") {
        p = read_value(v, e.weight);
      } else {
        return concat(entry, ": unknown key ", k.str(), " (an entry has path and weight)");
      }
      if (p) return concat(entry, " ", k.str(), ": ", *p);
      seen.insert(std::string(k.str()));
    }
    for (const char* key : {"path", "weight"})
      if (!seen.count(key)) return concat(entry, ": missing ", key);
    entries.push_back(std::move(e));
  }
  out = std::move(entries);
  return {};
}

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
  return concat("expected one of ", one_of(names), ", found ", describe(n));
}

// ---- the key table ----

// One key of a section: how to read it from a TOML node into a Config and print it back.
struct Key {
  std::string_view name;
  bool text = false;  // string-valued: a --set value is used verbatim unless it is a TOML string
  std::function<Problem(const toml::node&, Config&)> read;
  std::function<std::string(const Config&)> write;
};

struct Section {
  std::string_view name;
  std::vector<Key> keys;
  const Key* find(std::string_view key) const {
    for (const Key& k : keys) {
      if (k.name == key) return &k;
    }
    return nullptr;
  }
};

// Builds the keys of the section `S Config::*` from pointers to members.
template <typename S>
class SectionBuilder {
 public:
  SectionBuilder(std::string_view name, S Config::*section) : section_(section) {
    out_.name = name;
  }

  template <typename T>
  SectionBuilder& add(std::string_view name, T S::*m) {
    auto sec = section_;
    out_.keys.push_back(
        Key{name, std::is_same_v<T, std::string>,
            [sec, m](const toml::node& n, Config& c) { return read_value(n, c.*sec.*m); },
            [sec, m](const Config& c) { return toml_text(c.*sec.*m); }});
    return *this;
  }

  // An enum, spelled as names[value].
  template <typename E, size_t N>
  SectionBuilder& add(std::string_view name, E S::*m,
                      const std::array<std::string_view, N>& names) {
    auto sec = section_;
    out_.keys.push_back(Key{name, true,
                            [sec, m, &names](const toml::node& n, Config& c) {
                              size_t i = 0;
                              Problem p = read_choice(n, names, i);
                              if (!p) c.*sec.*m = static_cast<E>(i);
                              return p;
                            },
                            [sec, m, &names](const Config& c) {
                              return toml_string(names[static_cast<size_t>(c.*sec.*m)]);
                            }});
    return *this;
  }

  // A string restricted to `names`.
  template <size_t N>
  SectionBuilder& add(std::string_view name, std::string S::*m,
                      const std::array<std::string_view, N>& names) {
    auto sec = section_;
    out_.keys.push_back(Key{name, true,
                            [sec, m, &names](const toml::node& n, Config& c) {
                              size_t i = 0;
                              Problem p = read_choice(n, names, i);
                              if (!p) c.*sec.*m = std::string(names[i]);
                              return p;
                            },
                            [sec, m](const Config& c) { return toml_string(c.*sec.*m); }});
    return *this;
  }

  Section build() { return std::move(out_); }

 private:
  S Config::*section_;
  Section out_;
};

// Every section and key, in the order to_toml prints them.
const std::vector<Section>& sections() {
  static const std::vector<Section> table = [] {
    using M = ModelConfig;
    using T = TrainConfig;
    using O = OptimizerConfig;
    using D = DataConfig;
    using L = LogConfig;
    using C = CheckpointConfig;
    using P = ParallelConfig;
    std::vector<Section> s;
    s.push_back(SectionBuilder<M>("model", &Config::model)
                    .add("arch", &M::arch, kArchNames)
                    .add("vocab_size", &M::vocab_size)
                    .add("n_layers", &M::n_layers)
                    .add("d_model", &M::d_model)
                    .add("n_heads", &M::n_heads)
                    .add("n_kv_heads", &M::n_kv_heads)
                    .add("d_ff", &M::d_ff)
                    .add("seq_len", &M::seq_len)
                    .add("norm", &M::norm, kNormNames)
                    .add("activation", &M::activation, kActivationNames)
                    .add("position", &M::position, kPositionNames)
                    .add("bias", &M::bias)
                    .add("tie_embeddings", &M::tie_embeddings)
                    .add("norm_eps", &M::norm_eps)
                    .add("rope_theta", &M::rope_theta)
                    .add("dropout", &M::dropout)
                    .add("init_std", &M::init_std)
                    .build());
    s.push_back(SectionBuilder<T>("train", &Config::train)
                    .add("steps", &T::steps)
                    .add("global_batch_size", &T::global_batch_size)
                    .add("micro_batch_size", &T::micro_batch_size)
                    .add("precision", &T::precision, kPrecisionNames)
                    .add("seed", &T::seed)
                    .add("run_dir", &T::run_dir)
                    .add("device", &T::device, kDeviceNames)
                    .add("threads", &T::threads)
                    .add("eval_interval", &T::eval_interval)
                    .add("eval_iters", &T::eval_iters)
                    .add("recompute", &T::recompute, kRecomputeNames)
                    .add("recompute_layers", &T::recompute_layers)
                    .build());
    s.push_back(SectionBuilder<O>("optimizer", &Config::optimizer)
                    .add("lr", &O::lr)
                    .add("min_lr", &O::min_lr)
                    .add("warmup_steps", &O::warmup_steps)
                    .add("decay", &O::decay, kDecayNames)
                    .add("decay_steps", &O::decay_steps)
                    .add("beta1", &O::beta1)
                    .add("beta2", &O::beta2)
                    .add("eps", &O::eps)
                    .add("weight_decay", &O::weight_decay)
                    .add("grad_clip", &O::grad_clip)
                    .add("initial_loss_scale", &O::initial_loss_scale)
                    .add("loss_scale_window", &O::loss_scale_window)
                    .build());
    s.push_back(SectionBuilder<P>("parallel", &Config::parallel)
                    .add("tp", &P::tp)
                    .add("cp", &P::cp)
                    .add("dp", &P::dp)
                    .add("pp", &P::pp)
                    .add("pp_schedule", &P::pp_schedule, kScheduleNames)
                    .add("virtual_stages", &P::virtual_stages)
                    .add("pp_layers", &P::pp_layers)
                    .add("zero_stage", &P::zero_stage)
                    .add("sequence_parallel", &P::sequence_parallel)
                    .add("bucket_mb", &P::bucket_mb)
                    .build());
    s.push_back(SectionBuilder<D>("data", &Config::data)
                    .add("source", &D::source, kSourceNames)
                    .add("seed", &D::seed)
                    .add("path", &D::path)
                    .add("sources", &D::sources)
                    .add("split", &D::split)
                    .add("tokenizer", &D::tokenizer)
                    .build());
    s.push_back(SectionBuilder<C>("checkpoint", &Config::checkpoint)
                    .add("dir", &C::dir)
                    .add("interval", &C::interval)
                    .add("keep_last", &C::keep_last)
                    .add("load", &C::load)
                    .add("async", &C::async)
                    .build());
    s.push_back(SectionBuilder<L>("log", &Config::log)
                    .add("interval", &L::interval)
                    .add("progress", &L::progress)
                    .add("metrics", &L::metrics)
                    .add("peak_flops", &L::peak_flops)
                    .build());
    return s;
  }();
  return table;
}

const Section* find_section(std::string_view name) {
  for (const Section& s : sections()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

constexpr std::string_view kIncludeKey = "include";

// ---- did-you-mean ----

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The closest candidate, if close enough to be a typo of `name`.
std::optional<std::string> closest(std::string_view name, const std::vector<std::string>& cands) {
  const size_t limit = std::max<size_t>(2, name.size() / 3);
  std::optional<std::string> best;
  size_t best_d = limit + 1;
  for (const std::string& c : cands) {
    const size_t d = edit_distance(name, c);
    if (d < best_d && d < std::max(name.size(), c.size())) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

// " — did you mean model.n_layers?" for an unknown key in `section` ("" = top level): a near
// spelling in the same section first, else the same key in another section.
std::string suggest_key(std::string_view section, std::string_view key) {
  std::vector<std::string> same;
  if (section.empty()) {
    same.emplace_back(kIncludeKey);
  } else if (const Section* s = find_section(section)) {
    for (const Key& k : s->keys) same.push_back(concat(section, ".", k.name));
  }
  std::optional<std::string> hit = closest(concat(section, section.empty() ? "" : ".", key), same);
  if (!hit) {
    for (const Section& s : sections()) {
      if (s.name != section && s.find(key)) {
        hit = concat(s.name, ".", key);
        break;
      }
    }
  }
  return hit ? concat(" — did you mean ", *hit, "?") : "";
}

std::string suggest_section(std::string_view name) {
  std::vector<std::string> names;
  for (const Section& s : sections()) names.emplace_back(s.name);
  auto hit = closest(name, names);
  return hit ? concat(" — did you mean [", *hit, "]?") : "";
}

// ---- loading and merging ----

// Where a value was written: "file:line:col", or just "--set".
struct Where {
  std::string file;
  uint32_t line = 0;
  uint32_t column = 0;
  std::string str() const { return line ? concat(file, ":", line, ":", column) : file; }
};

Where where(const std::string& file, const toml::source_region& r) {
  return {file, r.begin.line, r.begin.column};
}

// One key's value after merging; the node lives in a document owned by the Loader.
struct Setting {
  std::string section;
  std::string key;
  const toml::node* node;
  Where at;
  std::string dotted() const { return concat(section, ".", key); }
};

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += concat(s.empty() ? "" : "\n", l);
  return s;
}

std::string read_file(const fs::path& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw ConfigError(concat(what, ": ", path.string(), " is a directory"));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(
        concat(what, ": cannot open ", path.string(), " (", std::strerror(errno), ")"));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Reads documents and overrides into one list of settings, later ones replacing earlier ones
// key by key. Unknown sections and keys are collected in `errors`; problems that leave nothing
// sensible to go on (unreadable file, TOML syntax, include cycle) throw at once.
class Loader {
 public:
  std::vector<Setting> settings;
  std::vector<std::string> errors;

  void load_file(const fs::path& path, const std::string& what) {
    load_text(read_file(path, what), path.lexically_normal().string());
  }

  // `name` names the document in messages; includes are relative to its directory.
  void load_text(std::string_view text, const std::string& name) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(fs::absolute(name, ec), ec);
    std::unique_ptr<toml::table> doc;
    try {
      doc = std::make_unique<toml::table>(toml::parse(text, std::string_view(name)));
    } catch (const toml::parse_error& e) {
      throw ConfigError(
          concat("invalid TOML at ", where(name, e.source()).str(), ": ", e.description()));
    }
    const toml::table& top = *docs_.emplace_back(std::move(doc));
    stack_.push_back({canonical, name});

    if (auto it = top.find(std::string(kIncludeKey)); it != top.end()) {
      load_includes(it->second, where(name, it->first.source()), fs::path(name).parent_path());
    }
    for (auto&& [key, node] : top) {
      if (key.str() == kIncludeKey) continue;
      const Where at = where(name, key.source());
      const Section* section = find_section(key.str());
      if (!section) {
        errors.push_back(node.is_table() ? concat("unknown section [", key.str(), "] at ", at.str(),
                                                  suggest_section(key.str()))
                                         : concat("unknown key ", key.str(), " at ", at.str(),
                                                  suggest_key("", key.str())));
        continue;
      }
      const toml::table* table = node.as_table();
      if (!table) {
        errors.push_back(concat(key.str(), " at ", at.str(), ": expected a table [", key.str(),
                                "], found ", describe(node)));
        continue;
      }
      for (auto&& [k, v] : *table) {
        set(*section, k.str(), v, where(name, k.source()));
      }
    }
    stack_.pop_back();
  }

  // "section.key=value": value in TOML syntax, or taken as a bare string when it is not TOML
  // (or when the key holds text, so that --set train.run_dir=2024-01-01 stays a path).
  void add_override(const std::string& text) {
    const Where at{"--set"};
    const size_t eq = text.find('=');
    const size_t dot = text.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
      errors.push_back(concat("--set ", toml_string(text),
                              ": expected section.key=value, e.g. --set train.steps=10"));
      return;
    }
    const std::string section_name = text.substr(0, dot);
    const std::string key = text.substr(dot + 1, eq - dot - 1);
    const std::string value = text.substr(eq + 1);
    const Section* section = find_section(section_name);
    if (!section) {
      errors.push_back(concat("unknown section [", section_name, "] at ", at.str(),
                              suggest_section(section_name)));
      return;
    }
    const Key* k = section->find(key);
    std::unique_ptr<toml::table> doc;
    try {
      doc = std::make_unique<toml::table>(toml::parse("v = " + value));
      const toml::node* v = doc->get("v");
      if (doc->size() != 1 || !v || (k && k->text && !v->is_string())) doc.reset();
    } catch (const toml::parse_error&) {
      doc.reset();
    }
    if (!doc) doc = std::make_unique<toml::table>(toml::table{{"v", value}});
    const toml::table& t = *docs_.emplace_back(std::move(doc));
    set(*section, key, *t.get("v"), at);
  }

 private:
  void load_includes(const toml::node& node, const Where& at, const fs::path& dir) {
    const toml::array* list = node.as_array();
    if (!list) {
      errors.push_back(concat("include at ", at.str(), ": expected an array of file names, found ",
                              describe(node)));
      return;
    }
    for (const toml::node& item : *list) {
      const Where item_at = where(at.file, item.source());
      const toml::value<std::string>* file = item.as_string();
      if (!file) {
        errors.push_back(concat("include at ", item_at.str(),
                                ": expected a file name (string), found ", describe(item)));
        continue;
      }
      const fs::path path = (dir / file->get()).lexically_normal();
      const std::string what = concat("include ", toml_string(file->get()), " at ", item_at.str());
      std::error_code ec;
      const fs::path canonical = fs::weakly_canonical(fs::absolute(path, ec), ec);
      auto cycle = std::find_if(stack_.begin(), stack_.end(),
                                [&](const Frame& f) { return f.canonical == canonical; });
      if (cycle != stack_.end()) {
        std::string chain;
        for (auto f = cycle; f != stack_.end(); ++f) chain += concat(f->name, " -> ");
        throw ConfigError(concat("include cycle: ", chain, path.string(), " (", what, ")"));
      }
      load_file(path, what);
    }
  }

  void set(const Section& section, std::string_view key, const toml::node& node, const Where& at) {
    if (!section.find(key)) {
      errors.push_back(concat("unknown key ", section.name, ".", key, " at ", at.str(),
                              suggest_key(section.name, key)));
      return;
    }
    Setting s{std::string(section.name), std::string(key), &node, at};
    auto it = std::find_if(settings.begin(), settings.end(), [&](const Setting& o) {
      return o.section == s.section && o.key == s.key;
    });
    if (it != settings.end()) {
      *it = std::move(s);
    } else {
      settings.push_back(std::move(s));
    }
  }

  struct Frame {
    fs::path canonical;
    std::string name;
  };
  std::vector<std::unique_ptr<toml::table>> docs_;  // keeps every Setting::node alive
  std::vector<Frame> stack_;                        // documents being loaded, for cycle detection
};

// ---- presets, derived defaults, rules ----

// Fills what the arch preset decides (unless given explicitly) and the 0 = "same as" defaults.
void resolve(Config& c, const std::set<std::string>& given) {
  ModelConfig& m = c.model;
  const ModelConfig preset = model_preset(m.arch);
  if (!given.count("model.norm")) m.norm = preset.norm;
  if (!given.count("model.activation")) m.activation = preset.activation;
  if (!given.count("model.position")) m.position = preset.position;
  if (!given.count("model.bias")) m.bias = preset.bias;
  if (!given.count("model.tie_embeddings")) m.tie_embeddings = preset.tie_embeddings;
  if (m.d_ff == 0 && m.d_model >= 1) m.d_ff = preset_d_ff(m.arch, m.d_model);
  if (m.n_kv_heads == 0) m.n_kv_heads = m.n_heads;
  if (c.train.micro_batch_size == 0) c.train.micro_batch_size = c.train.global_batch_size;
  if (c.optimizer.decay_steps == 0) c.optimizer.decay_steps = c.train.steps;
  if (c.data.seed == 0) c.data.seed = c.train.seed;
}

// Checks cross-key rules on the resolved config. Each message names the keys with their values
// and ends with where the explicitly given ones were set. Rules on a value derived from another
// key are skipped when that key is already reported, so one mistake gives one message.
class Rules {
 public:
  explicit Rules(const std::vector<Setting>& settings) : settings_(settings) {}
  std::vector<std::string> errors;

  void require(bool ok, std::initializer_list<std::string_view> keys, const std::string& msg) {
    require(ok, std::vector<std::string_view>(keys), msg);
  }
  void require(bool ok, const std::vector<std::string>& keys, const std::string& msg) {
    require(ok, std::vector<std::string_view>(keys.begin(), keys.end()), msg);
  }
  void require(bool ok, const std::vector<std::string_view>& keys, const std::string& msg) {
    if (ok) return;
    std::string origin;
    for (std::string_view k : keys) {
      for (const Setting& s : settings_) {
        if (s.dotted() == k) origin += concat(origin.empty() ? " (" : ", ", k, " at ", s.at.str());
      }
    }
    errors.push_back(msg + (origin.empty() ? "" : origin + ")"));
  }
  template <typename T>
  void at_least(std::string_view key, T v, T min, std::string_view hint = "") {
    require(v >= min, {key}, concat(key, "=", toml_text(v), " must be >= ", toml_text(min), hint));
  }
  template <typename T>
  void positive(std::string_view key, T v) {
    require(v > 0, {key}, concat(key, "=", toml_text(v), " must be > 0"));
  }
  void unit_interval(std::string_view key, float v) {
    require(v >= 0 && v < 1, {key}, concat(key, "=", toml_text(v), " must be in [0, 1)"));
  }

 private:
  const std::vector<Setting>& settings_;
};

// "": the dataset PREFIX.idx + PREFIX.bin exists; else which file is missing.
std::string missing_dataset_file(const std::string& prefix) {
  std::error_code ec;
  for (const char* ext : {".idx", ".bin"})
    if (!fs::is_regular_file(prefix + ext, ec)) return prefix + ext;
  return "";
}

// The split's syntax is checked whatever the source; the files only when they are used.
void check_data(const Config& c, Rules& r) {
  const DataConfig& d = c.data;
  const std::optional<SplitWeights> split = parse_split(d.split);
  r.require(split.has_value(), {"data.split"},
            concat("data.split=", toml_string(d.split),
                   " must be three comma-separated non-negative numbers with a positive sum, the "
                   "shares of train,valid,test, e.g. \"98,1,1\""));
  if (d.source != DataSource::indexed) return;
  const std::string where_hint = " (a path in a config file is relative to that file's folder)";
  r.require(!d.path.empty() || !d.sources.empty(), {"data.source"},
            "data.source=\"indexed\" needs data.path (one dataset prefix) or [[data.sources]] "
            "entries {path, weight} (a blend)");
  if (!d.path.empty() && !d.sources.empty()) {
    r.require(false, {"data.path", "data.sources"},
              "data.path and [[data.sources]] are both set: give one dataset in data.path or a "
              "blend in [[data.sources]]");
    return;
  }
  if (!d.path.empty()) {
    const std::string missing = missing_dataset_file(d.path);
    r.require(missing.empty(), {"data.path"},
              concat("data.path=", toml_string(d.path), ": ", missing, " not found", where_hint));
  }
  for (size_t i = 0; i < d.sources.size(); ++i) {
    const DataSourceConfig& e = d.sources[i];
    const std::string entry = concat("data.sources entry ", i + 1);
    r.require(e.weight > 0, {"data.sources"},
              concat(entry, ": weight=", toml_text(e.weight), " must be > 0"));
    const std::string missing = missing_dataset_file(e.path);
    r.require(
        missing.empty(), {"data.sources"},
        concat(entry, ": path=", toml_string(e.path), ": ", missing, " not found", where_hint));
  }
  if (!d.tokenizer.empty()) {
    std::error_code ec;
    r.require(fs::is_regular_file(d.tokenizer, ec), {"data.tokenizer"},
              concat("data.tokenizer=", toml_string(d.tokenizer), ": file not found", where_hint));
  }
  if (split && c.train.eval_interval > 0) {
    r.require((*split)[1] > 0, {"train.eval_interval", "data.split"},
              concat("train.eval_interval=", c.train.eval_interval,
                     " needs a validation split, but data.split=", toml_string(d.split),
                     " gives it no documents"));
  }
}

void check_rules(const Config& c, const Config& raw, Rules& r) {
  const ModelConfig& m = c.model;
  r.at_least<int64_t>("model.vocab_size", m.vocab_size, 2);
  r.at_least<int64_t>("model.n_layers", m.n_layers, 1);
  r.at_least<int64_t>("model.d_model", m.d_model, 1);
  r.at_least<int64_t>("model.n_heads", m.n_heads, 1);
  if (raw.model.n_kv_heads != 0) {
    r.at_least<int64_t>("model.n_kv_heads", m.n_kv_heads, 1, ", or 0 for model.n_heads");
  }
  if (m.d_model >= 1) r.at_least<int64_t>("model.d_ff", m.d_ff, 1, ", or 0 for the arch default");
  r.at_least<int64_t>("model.seq_len", m.seq_len, 1);
  if (m.d_model >= 1 && m.n_heads >= 1) {
    r.require(m.d_model % m.n_heads == 0, {"model.d_model", "model.n_heads"},
              concat("model.d_model=", m.d_model, " is not divisible by model.n_heads=", m.n_heads,
                     ": the head dim is d_model/n_heads"));
    if (m.d_model % m.n_heads == 0 && m.position == PositionKind::rope) {
      const int64_t head_dim = m.d_model / m.n_heads;
      r.require(
          head_dim % 2 == 0, {"model.position", "model.arch", "model.d_model", "model.n_heads"},
          concat("model.position=\"rope\" needs an even head dim, but model.d_model=", m.d_model,
                 " / model.n_heads=", m.n_heads, " = ", head_dim));
    }
  }
  if (m.n_heads >= 1 && m.n_kv_heads >= 1) {
    r.require(m.n_heads % m.n_kv_heads == 0, {"model.n_heads", "model.n_kv_heads"},
              concat("model.n_heads=", m.n_heads, " is not divisible by model.n_kv_heads=",
                     m.n_kv_heads, ": each kv head serves n_heads/n_kv_heads query heads"));
  }
  r.positive("model.norm_eps", m.norm_eps);
  r.positive("model.rope_theta", m.rope_theta);
  r.unit_interval("model.dropout", m.dropout);
  r.at_least("model.init_std", m.init_std, 0.0f);

  const TrainConfig& t = c.train;
  r.at_least<int64_t>("train.steps", t.steps, 1);
  r.at_least<int64_t>("train.global_batch_size", t.global_batch_size, 1);
  if (raw.train.micro_batch_size != 0) {
    r.at_least<int64_t>("train.micro_batch_size", t.micro_batch_size, 1,
                        ", or 0 for train.global_batch_size");
  }
  if (t.global_batch_size >= 1 && t.micro_batch_size >= 1) {
    r.require(t.global_batch_size % t.micro_batch_size == 0,
              {"train.global_batch_size", "train.micro_batch_size"},
              concat("train.global_batch_size=", t.global_batch_size,
                     " is not divisible by train.micro_batch_size=", t.micro_batch_size,
                     ": a step is a whole number of micro-batches"));
  }
  r.require(!t.run_dir.empty(), {"train.run_dir"}, "train.run_dir must not be empty");
  r.at_least<int64_t>("train.threads", t.threads, 0);
  r.at_least<int64_t>("train.recompute_layers", t.recompute_layers, 0, ", or 0 for every layer");
  if (m.n_layers >= 1) {
    r.require(t.recompute_layers <= m.n_layers, {"train.recompute_layers", "model.n_layers"},
              concat("train.recompute_layers=", t.recompute_layers, " exceeds model.n_layers=",
                     m.n_layers, "; use 0 to recompute every layer"));
  }
  if (t.recompute_layers > 0) {
    r.require(t.recompute != Recompute::none, {"train.recompute_layers", "train.recompute"},
              concat("train.recompute_layers=", t.recompute_layers,
                     " chooses layers to recompute, but train.recompute=\"none\"; set "
                     "train.recompute to \"selective\" or \"full\", or recompute_layers to 0"));
  }

  const OptimizerConfig& o = c.optimizer;
  r.positive("optimizer.lr", o.lr);
  r.at_least("optimizer.min_lr", o.min_lr, 0.0f);
  if (o.lr > 0 && o.min_lr >= 0) {
    r.require(o.min_lr <= o.lr, {"optimizer.min_lr", "optimizer.lr"},
              concat("optimizer.min_lr=", toml_text(o.min_lr),
                     " is above optimizer.lr=", toml_text(o.lr)));
  }
  r.at_least<int64_t>("optimizer.warmup_steps", o.warmup_steps, 0);
  const bool decay_derived = raw.optimizer.decay_steps == 0;
  if (!decay_derived) {
    r.at_least<int64_t>("optimizer.decay_steps", o.decay_steps, 1, ", or 0 for train.steps");
  }
  if (o.warmup_steps >= 0 && o.decay_steps >= 1) {
    r.require(o.warmup_steps <= o.decay_steps,
              {"optimizer.warmup_steps", decay_derived ? "train.steps" : "optimizer.decay_steps"},
              concat("optimizer.warmup_steps=", o.warmup_steps, " exceeds optimizer.decay_steps=",
                     o.decay_steps, decay_derived ? " = train.steps" : ""));
  }
  r.unit_interval("optimizer.beta1", o.beta1);
  r.unit_interval("optimizer.beta2", o.beta2);
  r.positive("optimizer.eps", o.eps);
  r.at_least("optimizer.weight_decay", o.weight_decay, 0.0f);
  r.at_least("optimizer.grad_clip", o.grad_clip, 0.0f);
  if (t.precision == Precision::fp16) {
    r.require(o.initial_loss_scale > 0, {"optimizer.initial_loss_scale", "train.precision"},
              concat("optimizer.initial_loss_scale=", toml_text(o.initial_loss_scale),
                     " must be > 0 with train.precision=\"fp16\""));
    r.require(o.loss_scale_window >= 1, {"optimizer.loss_scale_window", "train.precision"},
              concat("optimizer.loss_scale_window=", o.loss_scale_window,
                     " must be >= 1 with train.precision=\"fp16\""));
  }

  const ParallelConfig& p = c.parallel;
  r.at_least<int64_t>("parallel.tp", p.tp, 1);
  r.at_least<int64_t>("parallel.cp", p.cp, 1);
  r.at_least<int64_t>("parallel.pp", p.pp, 1);
  r.require(p.dp == -1 || p.dp >= 1, {"parallel.dp"},
            concat("parallel.dp=", p.dp, " must be >= 1, or -1 for the rest of the world size"));
  r.require(
      p.cp == 1 || p.cp < 1, {"parallel.cp"},
      concat("parallel.cp=", p.cp, ": context parallelism is not implemented yet; use cp = 1"));
  if (p.pp > 1) {
    // What the pipeline executor (engine/pipeline/executor.h) does not run yet.
    r.require(p.pp_schedule != PipeSchedule::zb_h1 || p.zero_stage <= 2,
              {"parallel.pp_schedule", "parallel.zero_stage"},
              concat("parallel.pp_schedule=\"zb-h1\" with parallel.zero_stage=", p.zero_stage,
                     ": ZeRO-3 gathers a layer's weights only around its hooks, which the split "
                     "backward runs with the weight part; use zero_stage <= 2 or \"1f1b\""));
  }
  r.at_least<int64_t>("parallel.virtual_stages", p.virtual_stages, 1);
  if (p.virtual_stages >= 1) {
    const bool interleaved = p.pp_schedule == PipeSchedule::interleaved;
    r.require(interleaved || p.virtual_stages == 1,
              {"parallel.virtual_stages", "parallel.pp_schedule"},
              concat("parallel.virtual_stages=", p.virtual_stages,
                     " needs parallel.pp_schedule=\"interleaved\"; the other schedules run one "
                     "model chunk per rank"));
    r.require(!interleaved || p.virtual_stages >= 2,
              {"parallel.virtual_stages", "parallel.pp_schedule"},
              concat("parallel.pp_schedule=\"interleaved\" needs parallel.virtual_stages >= 2, "
                     "found ",
                     p.virtual_stages));
  }
  if (p.pp >= 1 && p.virtual_stages >= 1 && m.n_layers >= 1) {
    const int64_t stages = p.pp * p.virtual_stages;
    if (p.pp_layers.empty()) {
      r.require(m.n_layers % stages == 0, {"model.n_layers", "parallel.pp"},
                concat("model.n_layers=", m.n_layers, " does not split evenly into pp(", p.pp,
                       ")*virtual_stages(", p.virtual_stages, ")=", stages,
                       " stages; set parallel.pp_layers to list the layers of each stage"));
    } else {
      int64_t sum = 0;
      bool negative = false;
      for (int64_t n : p.pp_layers) {
        sum += n;
        negative = negative || n < 0;
      }
      r.require(
          static_cast<int64_t>(p.pp_layers.size()) == stages && sum == m.n_layers && !negative,
          {"parallel.pp_layers"},
          concat("parallel.pp_layers=", toml_text(p.pp_layers), " must have pp(", p.pp,
                 ")*virtual_stages(", p.virtual_stages, ")=", stages,
                 " non-negative entries summing to model.n_layers=", m.n_layers));
    }
  }
  r.require(p.zero_stage >= 0 && p.zero_stage <= 3, {"parallel.zero_stage"},
            concat("parallel.zero_stage=", p.zero_stage, " must be 0 (DDP), 1, 2 or 3"));
  r.positive("parallel.bucket_mb", p.bucket_mb);
  if (p.tp >= 1)
    for (const LayoutRuleError& e : tensor_parallel_errors(m, p.tp, p.sequence_parallel))
      r.require(false, e.keys, e.message);

  r.at_least<int64_t>("train.eval_interval", t.eval_interval, 0, " (0 = no validation)");
  if (t.eval_interval > 0) r.at_least<int64_t>("train.eval_iters", t.eval_iters, 1);
  check_data(c, r);

  const CheckpointConfig& ck = c.checkpoint;
  r.at_least<int64_t>("checkpoint.interval", ck.interval, 0, " (0 = save only at the end)");
  r.at_least<int64_t>("checkpoint.keep_last", ck.keep_last, 0, " (0 = keep all)");
  r.require(!ck.load.empty(), {"checkpoint.load"},
            "checkpoint.load must be \"none\", \"latest\", \"auto\" or a checkpoint path");
  r.require(
      !(ck.dir.empty() && (ck.load == "latest" || ck.load == "auto")),
      {"checkpoint.load", "checkpoint.dir"},
      concat("checkpoint.load=\"", ck.load, "\" resumes from checkpoint.dir, which is not set"));
  r.require(!(ck.dir.empty() && (ck.interval > 0 || ck.keep_last > 0)),
            {"checkpoint.interval", "checkpoint.keep_last", "checkpoint.dir"},
            "checkpoint.interval and checkpoint.keep_last need checkpoint.dir");

  r.at_least<int64_t>("log.interval", c.log.interval, 1);
  r.at_least("log.peak_flops", c.log.peak_flops, 0.0);
}

// Data paths written in a config file are relative to that file's folder, as includes are;
// --set ones (no line number) to the current directory.
void resolve_data_paths(Config& c, const std::vector<Setting>& settings) {
  for (const Setting& s : settings) {
    if (s.section != "data" || s.at.line == 0) continue;
    const fs::path dir = fs::path(s.at.file).parent_path();
    auto resolve = [&](std::string& path) {
      if (!path.empty() && fs::path(path).is_relative())
        path = (dir / path).lexically_normal().string();
    };
    if (s.key == "path") resolve(c.data.path);
    if (s.key == "tokenizer") resolve(c.data.tokenizer);
    if (s.key == "sources")
      for (DataSourceConfig& e : c.data.sources) resolve(e.path);
  }
}

Config build(Loader& loader, const std::vector<std::string>& overrides, const std::string& source) {
  for (const std::string& o : overrides) loader.add_override(o);
  Config c;
  c.source_path = source;
  std::vector<std::string> errors = std::move(loader.errors);
  std::set<std::string> given;
  for (const Setting& s : loader.settings) {
    given.insert(s.dotted());
    const Key* key = find_section(s.section)->find(s.key);
    if (Problem p = key->read(*s.node, c))
      errors.push_back(concat(s.dotted(), " at ", s.at.str(), ": ", *p));
  }
  if (!errors.empty()) throw ConfigError(join_lines(errors));
  resolve_data_paths(c, loader.settings);

  const Config raw = c;
  resolve(c, given);
  Rules rules(loader.settings);
  check_rules(c, raw, rules);
  if (!rules.errors.empty()) throw ConfigError(join_lines(rules.errors));
  return c;
}

}  // namespace

Config parse_config(const std::string& path, const std::vector<std::string>& overrides) {
  Loader loader;
  loader.load_file(path, "config file");
  return build(loader, overrides, path);
}

Config parse_config_string(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides) {
  Loader loader;
  loader.load_text(text, name);
  return build(loader, overrides, name);
}

std::string to_toml(const Config& c) {
  std::string out =
      "# llmtrain config, fully resolved: every key, presets and defaults filled in.\n";
  if (!c.source_path.empty()) out += concat("# source: ", toml_string(c.source_path), "\n");
  for (const Section& s : sections()) {
    out += concat("\n[", s.name, "]\n");
    for (const Key& k : s.keys) out += concat(k.name, " = ", k.write(c), "\n");
  }
  return out;
}

MeshShape mesh_shape(const ParallelConfig& p, int world) {
  MeshShape s;
  const int64_t rest = p.tp * p.cp * p.pp;
  const int64_t dp = p.dp == -1 ? (rest > 0 && world % rest == 0 ? world / rest : 0) : p.dp;
  s.degree = {static_cast<int>(p.tp), static_cast<int>(p.cp), static_cast<int>(dp),
              static_cast<int>(p.pp)};
  return s;
}

void validate_layout(const Config& c, int world) {
  const ParallelConfig& p = c.parallel;
  std::vector<std::string> errors;
  const int64_t rest = p.tp * p.cp * p.pp;
  if (p.dp == -1 && world % rest != 0) {
    errors.push_back(concat("parallel.dp=-1: world size ", world, " is not divisible by tp(", p.tp,
                            ")*cp(", p.cp, ")*pp(", p.pp, ")=", rest));
  } else {
    const MeshShape s = mesh_shape(p, world);
    if (s.world() != world)
      errors.push_back(concat("tp(", p.tp, ")*cp(", p.cp, ")*dp(", s.size(Axis::dp), ")*pp(", p.pp,
                              ")=", s.world(), " != world size ", world,
                              ": set [parallel] degrees whose product is the number of ranks, or "
                              "dp = -1"));
    const int64_t dp = s.size(Axis::dp);
    const int64_t gbs = c.train.global_batch_size, mbs = c.train.micro_batch_size;
    if (dp >= 1 && gbs % (dp * mbs) != 0)
      errors.push_back(concat("train.global_batch_size=", gbs, " is not divisible by dp(", dp,
                              ")*train.micro_batch_size(", mbs, ")=", dp * mbs,
                              ": each dp rank runs a whole number of micro-batches"));
    else if (dp >= 1 && p.pp > 1 && p.pp_schedule == PipeSchedule::interleaved &&
             (gbs / (dp * mbs)) % p.pp != 0)
      errors.push_back(concat("parallel.pp_schedule=\"interleaved\" needs the micro-batches per ",
                              "step, train.global_batch_size(", gbs, ")/(dp(", dp,
                              ")*train.micro_batch_size(", mbs, "))=", gbs / (dp * mbs),
                              ", to be divisible by parallel.pp=", p.pp));
  }
  if (!errors.empty()) throw ConfigError(join_lines(errors));
}

std::string rank_map(const MeshShape& shape) {
  std::string out = "# rank   tp cp dp pp\n";
  for (int r = 0; r < shape.world(); ++r) {
    const auto c = shape.coords(r);
    char line[64];
    std::snprintf(line, sizeof line, "%6d  %3d %2d %2d %2d\n", r, c[0], c[1], c[2], c[3]);
    out += line;
  }
  return out;
}

int64_t grad_accum_steps(const Config& c) {
  const int64_t micro =
      c.train.micro_batch_size > 0 ? c.train.micro_batch_size : c.train.global_batch_size;
  return c.train.global_batch_size / micro;
}

std::string_view precision_name(Precision p) {
  return kPrecisionNames[static_cast<size_t>(p)];
}

}  // namespace llmt
