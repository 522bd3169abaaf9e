// Test datasets on disk: a fresh temporary folder per test, and documents written through
// IndexedDatasetWriter and opened again, so the sample tests run on the real reader.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/indexed_dataset_writer.h"

namespace llmt::test {

using Docs = std::vector<std::vector<int32_t>>;

// Documents of the given lengths whose tokens are their position in the dataset (0, 1, 2, ...):
// every token is unique, so a window's first token says where it was cut.
inline Docs numbered_docs(const std::vector<int64_t>& lengths) {
  Docs docs;
  int32_t next = 0;
  for (int64_t len : lengths) {
    std::vector<int32_t>& d = docs.emplace_back();
    for (int64_t t = 0; t < len; ++t) d.push_back(next++);
  }
  return docs;
}

class DatasetFiles : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("llmt_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `docs` as DIR/name.{bin,idx} and opens it.
  std::shared_ptr<const IndexedDataset> write(const std::string& name, const Docs& docs,
                                              int64_t vocab_size = int64_t{1} << 24) {
    const std::string prefix = (dir_ / name).string();
    IndexedDatasetWriter w(prefix, vocab_size);
    for (const auto& d : docs) w.add_document(d);
    w.finalize();
    return IndexedDataset::open(prefix);
  }

  std::filesystem::path dir_;
};

}  // namespace llmt::test
