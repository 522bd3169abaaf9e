// Typed configuration: one struct per TOML section, so each component takes only its own
// section (AdamW takes OptimizerConfig, not the whole Config). parse_config() reads TOML (with
// `include = [...]` bases and `--set section.key=value` overrides) strictly: an unknown key, a
// wrong type or an impossible value throws llmt::ConfigError naming the dotted key, the file and
// line:column, and the numbers involved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/model_config.h"
#include "engine/optim/optimizer_config.h"

namespace llmt {

enum class Precision : uint8_t { fp32, bf16, fp16 };
enum class DataSource : uint8_t { synthetic };

// [train]
struct TrainConfig {
  int64_t steps = 100;
  int64_t global_batch_size = 8;  // sequences per optimizer step
  int64_t micro_batch_size = 0;   // sequences per forward/backward; 0 = global_batch_size
  Precision precision = Precision::fp32;
  uint64_t seed = 1234;
  std::string run_dir = "runs/default";
  std::string device = "cpu";  // "cpu" | "cuda"
  int64_t threads = 0;         // OpenMP threads per rank; 0 = all cores
};

// [data]
struct DataConfig {
  DataSource source = DataSource::synthetic;
  uint64_t seed = 0;  // synthetic: 0 = train.seed
};

// [log]
struct LogConfig {
  int64_t interval = 1;         // progress line every `interval` steps
  bool progress = true;         // print the progress line
  std::string metrics = "metrics.jsonl";  // relative to train.run_dir; "" disables
  double peak_flops = 0;        // FLOP/s for MFU; 0 = this CPU's fp32 FMA peak estimate
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  OptimizerConfig optimizer;
  DataConfig data;
  LogConfig log;
  std::string source_path;  // the top-level TOML file
};

// Reads `path`, applies includes and `overrides` ("section.key=value", value in TOML syntax or a
// bare string), fills preset defaults, validates. Throws ConfigError.
Config parse_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from TOML text (tests); `name` is used in messages.
Config parse_config_string(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides = {});
// The fully resolved config as TOML (every key, defaults included).
std::string to_toml(const Config& c);

// Derived numbers.
int64_t grad_accum_steps(const Config& c);  // global_batch_size / micro_batch_size
std::string_view precision_name(Precision p);

}  // namespace llmt
