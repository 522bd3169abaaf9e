// [data] section: where the training tokens come from (docs/data.md). Lives with the data code;
// train parses it. Paths written in a config file are relative to that file's folder (as
// includes are) and are stored resolved; paths given with --set are relative to the current
// directory. With source = "synthetic" the dataset keys are not used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/loader.h"

namespace llmt {

enum class DataSource : uint8_t { synthetic, indexed };

// One [[data.sources]] entry: a dataset of a blend.
struct DataSourceConfig {
  std::string path;   // dataset prefix (PREFIX.bin + PREFIX.idx)
  double weight = 0;  // share of the samples, relative to the other entries' weights
};

// [data]
struct DataConfig {
  DataSource source = DataSource::synthetic;
  uint64_t seed = 0;                      // samples and shuffles; 0 = train.seed
  std::string path;                       // indexed: one dataset prefix
  std::vector<DataSourceConfig> sources;  // indexed: a blend, instead of path
  std::string split = "98,1,1";           // indexed: train,valid,test shares of the documents
  std::string tokenizer;                  // optional SentencePiece model the data was made with
};

// [[data.sources]] as TOML: an array of inline tables.
std::string toml_text(const std::vector<DataSourceConfig>& v);
// [[data.sources]]: an array of tables, each with exactly `path` and `weight`.
Problem read_value(const toml::node& n, std::vector<DataSourceConfig>& out);

// [data]'s rules: the split's syntax whatever the source; with source = "indexed" the dataset
// files (and the tokenizer file) exist; a validation split when eval_interval > 0.
void check_data_config(const DataConfig& d, int64_t eval_interval, Rules& r);

}  // namespace llmt
