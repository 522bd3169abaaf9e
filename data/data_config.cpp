// [data]'s TOML forms of [[data.sources]] and its rules, reported through the config's Rules.
#include "data/data_config.h"

#include <filesystem>
#include <set>

#include "data/gpt_dataset.h"

namespace llmt {

namespace fs = std::filesystem;
using detail::concat;

// [[data.sources]] as an array of inline tables.
std::string toml_text(const std::vector<DataSourceConfig>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i)
    s += concat(i ? ", " : "", "{path = ", toml_string(v[i].path),
                ", weight = ", toml_text(v[i].weight), "}");
  return s + "]";
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

namespace {
// "": the dataset PREFIX.idx + PREFIX.bin exists; else which file is missing.
std::string missing_dataset_file(const std::string& prefix) {
  std::error_code ec;
  for (const char* ext : {".idx", ".bin"})
    if (!fs::is_regular_file(prefix + ext, ec)) return prefix + ext;
  return "";
}

}  // namespace

void check_data_config(const DataConfig& d, int64_t eval_interval, Rules& r) {
  const std::optional<SplitWeights> split = parse_split(d.split);
  r.require(split.has_value(), {"data.split"},
            concat("data.split=", toml_string(d.split),
                   " must be three comma-separated non-negative numbers with a positive sum, the "
                   "shares of train,valid,test, e.g. \"98,1,1\""));
  if (d.source != DataSource::indexed) return;
  const std::string where_hint =
      " (a path written in a config file is relative to that file's folder; one given with "
      "--set, to the current directory)";
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
  if (split && eval_interval > 0) {
    r.require((*split)[1] > 0, {"train.eval_interval", "data.split"},
              concat("train.eval_interval=", eval_interval,
                     " needs a validation split, but data.split=", toml_string(d.split),
                     " gives it no documents"));
  }
}

}  // namespace llmt
