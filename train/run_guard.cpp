#include "train/run_guard.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "checkpoints/checkpoint.h"
#include "checkpoints/store.h"
#include "core/check.h"

namespace llmt {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "section.key" -> value of the identity lines.
std::map<std::string, std::string> identity_map(const std::string& identity) {
  std::map<std::string, std::string> m;
  std::istringstream in(identity);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return m;
}

// "model.d_model 128 -> 256, data.path a -> b": what `now` changes of `before`, but for the
// keys in `ignored`.
std::string differences(const std::string& before, const std::string& now,
                        const std::set<std::string>& ignored = {}) {
  auto a = identity_map(before), b = identity_map(now);
  for (const std::string& k : ignored) {
    a.erase(k);
    b.erase(k);
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end())
      out.push_back(k + " " + v + " -> (absent)");
    else if (it->second != v)
      out.push_back(k + " " + v + " -> " + it->second);
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) out.push_back(k + " (absent) -> " + v);
  std::string s;
  const size_t shown = std::min<size_t>(out.size(), 6);
  for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + out[i];
  if (out.size() > shown) s += detail::concat(" and ", out.size() - shown, " more");
  return s;
}

// The config file a resolved config came from, and its model in a few words.
std::string describe(const std::string& resolved_toml) {
  std::string source = "?";
  const std::string tag = "# source: \"";
  const size_t at = resolved_toml.find(tag);
  if (at != std::string::npos) {
    const size_t end = resolved_toml.find('"', at + tag.size());
    source = resolved_toml.substr(at + tag.size(), end - at - tag.size());
  }
  const auto m = identity_map(run_identity(resolved_toml, false));
  auto get = [&](const char* k) {
    auto it = m.find(k);
    if (it == m.end()) return std::string("?");
    std::string v = it->second;
    v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
    return v;
  };
  return source + " (" + get("model.arch") + ", " + get("model.n_layers") + " layers, d_model " +
         get("model.d_model") + ", vocab " + get("model.vocab_size") + ")";
}

int64_t count_lines(const fs::path& p) {
  std::ifstream in(p);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

// The checkpoint directories (step_NNNNNNNN) in `dir`, in step order.
std::vector<std::string> step_dirs(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return names;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0)
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());  // zero-padded: name order is step order
  return names;
}

// The resolved config stored in checkpoint `dir`, if it can be read.
std::optional<std::string> checkpoint_config(const fs::path& dir) {
  try {
    return ckpt::Checkpoint(dir.string()).state().config;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// checkpoint.dir of a resolved config ("" when it has none).
// The value of SECTION.KEY in a resolved config (a string's quotes dropped), "" when absent.
std::string value_of(const std::string& resolved_toml, const std::string& want_section,
                     const std::string& key) {
  std::istringstream in(resolved_toml);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '[') section = line.substr(1, line.find(']') - 1);
    if (section == want_section && line.rfind(key + " = ", 0) == 0) {
      std::string v = line.substr(key.size() + 3);
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      return v;
    }
  }
  return "";
}

// Whether the checkpoints of the run recorded in RECORDED (its resolved config) are the ones in
// CK_DIR: the same checkpoint.dir, or a run directory moved or copied whole, its checkpoint.dir at
// the same place under its run_dir then as CK_DIR is under RUN_DIR now.
bool same_checkpoints(const std::string& recorded, const fs::path& run_dir,
                      const std::string& ck_dir) {
  const std::string then_ck = value_of(recorded, "checkpoint", "dir");
  if (then_ck == ck_dir) return true;
  const std::string then_run = value_of(recorded, "train", "run_dir");
  if (then_ck.empty() || then_run.empty() || ck_dir.empty()) return false;
  const fs::path a = fs::path(then_ck).lexically_normal().lexically_relative(
      fs::path(then_run).lexically_normal());
  const fs::path b =
      fs::path(ck_dir).lexically_normal().lexically_relative(run_dir.lexically_normal());
  return !a.empty() && a == b && *a.begin() != "..";
}

}  // namespace

std::string run_identity(const std::string& resolved_toml, bool with_data) {
  std::istringstream in(resolved_toml);
  std::string section, out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const bool model = section == "model" || section.rfind("model.", 0) == 0;
    if (model || (with_data && section == "data")) out += section + "." + line + "\n";
  }
  return out;
}

void check_run_dirs(const Config& cfg, bool resuming, bool overwrite) {
  const fs::path run_dir(cfg.train.run_dir);
  const std::string ck_dir = cfg.checkpoint.dir;
  const fs::path metrics = cfg.log.metrics.empty() ? fs::path() : run_dir / cfg.log.metrics;
  std::error_code ec;
  const int64_t metric_lines =
      !metrics.empty() && fs::is_regular_file(metrics, ec) ? count_lines(metrics) : 0;
  const std::vector<std::string> steps = step_dirs(ck_dir);
  const bool latest = !ck_dir.empty() && fs::exists(fs::path(ck_dir) / "latest", ec);
  if (metric_lines == 0 && steps.empty() && !latest) return;  // nothing of an earlier run

  // What the earlier run left, and who it was: its recorded config, else its newest checkpoint's.
  std::vector<std::string> left;
  if (metric_lines > 0)
    left.push_back(detail::concat(metrics.string(), " (", metric_lines, " steps)"));
  if (!steps.empty())
    left.push_back(detail::concat(steps.size(), " checkpoint", steps.size() > 1 ? "s" : "", " (",
                                  steps.front(), steps.size() > 1 ? " ... " + steps.back() : "",
                                  ") in ", ck_dir));
  else if (latest)
    left.push_back("a `latest` file in " + ck_dir);
  std::string left_text;
  for (size_t i = 0; i < left.size(); ++i) left_text += (i ? " and " : "") + left[i];
  std::vector<std::string> earlier;  // resolved configs of the earlier run(s)
  if (fs::is_regular_file(run_dir / kRunConfigFile, ec))
    earlier.push_back(read_file(run_dir / kRunConfigFile));
  if (!steps.empty())
    if (auto c = checkpoint_config(fs::path(ck_dir) / steps.back()); c && !c->empty())
      earlier.push_back(*c);
  const std::string mine = to_toml(cfg);
  const std::string who =
      earlier.empty() ? std::string("a run that recorded no config") : describe(earlier.front());
  const std::string ways =
      " Resume it (checkpoint.load = \"latest\", the same model), write this run elsewhere "
      "(--set train.run_dir=... and checkpoint.dir=...), or start over with --overwrite (it "
      "truncates the metrics and deletes those checkpoints).";

  if (overwrite) {
    if (resuming)
      throw ConfigError("--overwrite starts a run over, but checkpoint.load = \"" +
                        cfg.checkpoint.load + "\" resumes one: use one or the other");
    for (const std::string& s : steps) fs::remove_all(fs::path(ck_dir) / s);
    fs::remove(fs::path(ck_dir) / "latest", ec);
    return;
  }
  // Resuming or restarting the same run: the same model (and, on a restart, the same data).
  const bool restart = !resuming && cfg.checkpoint.load == "auto";
  if (resuming && metric_lines > 0 && fs::is_regular_file(run_dir / kRunConfigFile, ec)) {
    // The metrics continue only the run that wrote the checkpoints resumed here.
    const std::string config = read_file(run_dir / kRunConfigFile);
    const std::string recorded = value_of(config, "checkpoint", "dir");
    if (!same_checkpoints(config, run_dir, ck_dir))
      throw ConfigError("train.run_dir " + run_dir.string() + " holds " + metrics.string() +
                        " of a run that saved its checkpoints in " +
                        (recorded.empty() ? std::string("no checkpoint.dir") : recorded) +
                        "; this run resumes from checkpoint.dir " + ck_dir +
                        " and would truncate those metrics. Give it the train.run_dir of the run "
                        "that saved " +
                        ck_dir + ", or a new one (--set train.run_dir=...).");
  }
  if (resuming || restart) {
    for (const std::string& before : earlier) {
      const std::string diff =
          differences(run_identity(before, restart), run_identity(mine, restart));
      if (!diff.empty())
        throw ConfigError(
            "train.run_dir " + run_dir.string() +
            (ck_dir.empty() ? " holds " : " and checkpoint.dir " + ck_dir + " hold ") + left_text +
            " of " + describe(before) + "; this run, " + describe(mine) + ", " +
            (resuming ? "resumes" : "restarts") + " it with another " +
            (restart ? "model or data" : "model") + ": " + diff + "." + ways);
    }
    return;
  }
  throw ConfigError("train.run_dir " + run_dir.string() +
                    (ck_dir.empty() ? " holds" : " and checkpoint.dir " + ck_dir + " hold") +
                    " an earlier run: " + left_text + ", of " + who + ". This run (" +
                    describe(mine) + ", checkpoint.load = \"" + cfg.checkpoint.load +
                    "\") would overwrite them." + ways);
}

namespace {
// The [model] keys that shape nothing in `m`: d_ff when every layer is a mixture of experts,
// d_ff_shared without shared experts, the MoE keys without experts, rope_theta with learned
// positions. (A Mixtral import leaves them at other values than the run that trained it.)
std::set<std::string> unused_model_keys(const ModelConfig& m) {
  std::set<std::string> out;
  if (!m.moe.enabled()) {
    for (const char* k : {"num_experts", "top_k", "d_ff_expert", "router", "normalize", "balance",
                          "aux_loss_coef", "bias_update_rate", "z_loss_coef", "capacity_factor",
                          "shared_experts", "d_ff_shared", "first_dense_layers", "every"})
      out.insert(std::string("model.moe.") + k);
  } else {
    if (m.moe.first_dense_layers == 0 && m.moe.every == 1) out.insert("model.d_ff");
    if (m.moe.shared_experts == 0) out.insert("model.moe.d_ff_shared");
  }
  if (m.position == PositionKind::learned) out.insert("model.rope_theta");
  return out;
}
}  // namespace

std::string finetune_model_differences(const std::string& other_toml, const Config& cfg) {
  // (rope_scaling: a context extension starts from a checkpoint trained without it.)
  std::set<std::string> ignored = {"model.dropout",
                                   "model.init_std",
                                   "model.seq_len",
                                   "model.rope_scaling.rope_type",
                                   "model.rope_scaling.factor",
                                   "model.rope_scaling.original_max_position_embeddings",
                                   "model.rope_scaling.low_freq_factor",
                                   "model.rope_scaling.high_freq_factor",
                                   "model.rope_scaling.beta_fast",
                                   "model.rope_scaling.beta_slow",
                                   "model.rope_scaling.mscale",
                                   "model.rope_scaling.mscale_all_dim",
                                   "model.rope_scaling.attention_factor",
                                   "model.moe.aux_loss_coef",
                                   "model.moe.z_loss_coef",
                                   "model.moe.capacity_factor",
                                   "model.moe.bias_update_rate"};
  // Keys that shape nothing in either model.
  const std::set<std::string> mine = unused_model_keys(cfg.model);
  for (const std::string& k :
       unused_model_keys(parse_config_string(other_toml, "the checkpoint's config").model))
    if (mine.count(k)) ignored.insert(k);
  return differences(run_identity(other_toml, false), run_identity(to_toml(cfg), false), ignored);
}

void record_run_config(const Config& cfg) {
  const fs::path path = fs::path(cfg.train.run_dir) / kRunConfigFile;
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  out << to_toml(cfg);
  if (!out) throw Error("cannot write " + path.string());
}

}  // namespace llmt
