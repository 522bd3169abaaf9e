// GPT samples over one indexed dataset (as Megatron's GPTDataset): the documents of a
// train/valid/test split concatenated in a seeded per-epoch order, cut into windows of
// seq_len + 1 tokens that overlap by one, and visited in a seeded per-epoch sample order.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/loader.h"

namespace llmt {

enum class Split : uint8_t { train, valid, test };
std::string_view split_name(Split s);

// Relative sizes of train, valid, test: "98,1,1" -> {98, 1, 1}. Nothing when the text is not
// three comma-separated non-negative numbers with a positive sum.
using SplitWeights = std::array<double, 3>;
std::optional<SplitWeights> parse_split(std::string_view text);

// Document boundaries b of the splits over n documents: split s holds documents
// [b[s], b[s+1]), b[s] = round(n * (w[0] + ... + w[s-1]) / sum(w)), so b[0] = 0 and b[3] = n.
std::array<int64_t, 4> split_boundaries(int64_t n, const SplitWeights& w);

// Epoch e (0-based) concatenates the split's N tokens in document order perm_e (a seeded
// shuffle) and cuts S = (N - 1) / seq_len windows: window j is tokens [j*seq_len,
// j*seq_len + seq_len + 1) of that concatenation (the last < seq_len tokens of an epoch go
// unused, different ones each epoch). Sample i is window sigma_e(i - e*S) of epoch e = i / S,
// sigma_e a second seeded shuffle, so every epoch visits each of its windows exactly once and
// sample i depends only on (dataset, split, weights, seed, seq_len, i). Epochs are indexed when
// first used (O(documents + S), kept for the two most recent), so any number of epochs is served.
class GptDataset final : public SampleSource {
 public:
  // Throws Error when the split has fewer than seq_len + 1 tokens.
  GptDataset(std::shared_ptr<const IndexedDataset> data, Split split, const SplitWeights& weights,
             uint64_t seed, int64_t seq_len);

  int64_t window() const override { return seq_len_ + 1; }
  void fill(int32_t* out, int64_t first, int64_t n) const override;

  int64_t first_document() const { return first_doc_; }  // the split is documents
  int64_t num_documents() const { return static_cast<int64_t>(lengths_.size()); }  // [first, +n)
  int64_t tokens_per_epoch() const { return tokens_; }                             // N
  int64_t samples_per_epoch() const { return samples_; }                           // S
  // Dataset document (sequence) indices of epoch e in concatenation order (perm_e).
  std::vector<int64_t> epoch_documents(int64_t epoch) const;

 private:
  struct Epoch {
    int64_t number = -1;
    std::vector<int64_t> docs;     // (n)   dataset document indices, concatenation order
    std::vector<int64_t> starts;   // (n+1) token offset of docs[p] in the concatenation
    std::vector<int64_t> windows;  // (S)   sigma_e: window of each sample of the epoch
  };
  std::shared_ptr<const Epoch> epoch(int64_t e) const;

  std::shared_ptr<const IndexedDataset> data_;
  Split split_;
  uint64_t seed_;
  int64_t seq_len_;
  int64_t first_doc_ = 0;
  std::vector<int64_t> lengths_;  // (n) tokens of each document of the split, dataset order
  int64_t tokens_ = 0;
  int64_t samples_ = 0;

  mutable std::mutex mutex_;
  mutable std::array<std::shared_ptr<const Epoch>, 2> recent_;  // most recent first
};

}  // namespace llmt
