#include "config/loader.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace llmt {

namespace fs = std::filesystem;
using detail::concat;

namespace {

constexpr std::string_view kIncludeKey = "include";

Where where(const std::string& file, const toml::source_region& r) {
  return {file, r.begin.line, r.begin.column};
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

}  // namespace

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

const Schema::Key* Schema::Section::find(std::string_view key) const {
  for (const Key& k : keys)
    if (k.name == key) return &k;
  return nullptr;
}

const Schema::Section* Schema::find(std::string_view section) const {
  for (const Section& s : sections)
    if (s.name == section) return &s;
  return nullptr;
}

std::string Where::str() const {
  return line ? concat(file, ":", line, ":", column) : file;
}

// " — did you mean model.n_layers?" for an unknown key in `section` ("" = top level): a near
// spelling in the same section first, else the same key in another section.
std::string Loader::suggest_key(std::string_view section, std::string_view key) const {
  std::vector<std::string> same;
  if (section.empty()) {
    same.emplace_back(kIncludeKey);
  } else if (const Schema::Section* s = schema_.find(section)) {
    for (const Schema::Key& k : s->keys) same.push_back(concat(section, ".", k.name));
  }
  std::optional<std::string> hit = closest(concat(section, section.empty() ? "" : ".", key), same);
  if (!hit) {
    for (const Schema::Section& s : schema_.sections) {
      if (s.name != section && s.find(key)) {
        hit = concat(s.name, ".", key);
        break;
      }
    }
  }
  return hit ? concat(" — did you mean ", *hit, "?") : "";
}

std::string Loader::suggest_section(std::string_view name) const {
  std::vector<std::string> names;
  for (const Schema::Section& s : schema_.sections) names.emplace_back(s.name);
  auto hit = closest(name, names);
  return hit ? concat(" — did you mean [", *hit, "]?") : "";
}

std::vector<Rules::Origin> Loader::origins() const {
  std::vector<Rules::Origin> out;
  for (const Setting& s : settings) out.push_back({s.dotted(), s.at.str()});
  return out;
}

void Loader::load_file(const fs::path& path, const std::string& what) {
  load_text(read_file(path, what), path.lexically_normal().string());
}

void Loader::load_text(std::string_view text, const std::string& name) {
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
    const Schema::Section* section = schema_.find(key.str());
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
    load_table(*section, *table, name);
  }
  stack_.pop_back();
}

void Loader::load_table(const Schema::Section& section, const toml::table& table,
                        const std::string& name) {
  for (auto&& [k, v] : table) {
    // A sub-table that is a section of its own ([model.moe] inside [model]).
    const Schema::Section* sub =
        v.is_table() ? schema_.find(section.name + "." + std::string(k.str())) : nullptr;
    if (sub)
      load_table(*sub, *v.as_table(), name);
    else
      set(section, k.str(), v, where(name, k.source()));
  }
}

void Loader::add_override(const std::string& text) {
  const Where at{"--set"};
  const size_t eq = text.find('=');
  const size_t dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    errors.push_back(concat("--set ", toml_string(text),
                            ": expected section.key=value, e.g. --set train.steps=10"));
    return;
  }
  // The longest dotted prefix that names a section: "model.moe.top_k=2" is [model.moe] top_k.
  size_t split = dot;
  for (size_t d = text.find('.', dot + 1); d != std::string::npos && d < eq;
       d = text.find('.', d + 1))
    if (schema_.find(text.substr(0, d))) split = d;
  const std::string section_name = text.substr(0, split);
  const std::string key = text.substr(split + 1, eq - split - 1);
  const std::string value = text.substr(eq + 1);
  const Schema::Section* section = schema_.find(section_name);
  if (!section) {
    errors.push_back(concat("unknown section [", section_name, "] at ", at.str(),
                            suggest_section(section_name)));
    return;
  }
  const Schema::Key* k = section->find(key);
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

void Loader::load_includes(const toml::node& node, const Where& at, const fs::path& dir) {
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

void Loader::set(const Schema::Section& section, std::string_view key, const toml::node& node,
                 const Where& at) {
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

}  // namespace llmt
