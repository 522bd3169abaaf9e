// GPT samples: split parsing and boundaries, windows equal to the epoch's concatenated documents
// at multiples of seq_len, every window of an epoch exactly once, determinism in (seed, index),
// and the index build time for a million documents.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "core/check.h"
#include "data/gpt_dataset.h"
#include "dataset_files.h"

namespace llmt {
namespace {

using test::DatasetFiles;
using test::numbered_docs;

std::vector<int32_t> samples(const SampleSource& src, int64_t first, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(n * src.window()));
  src.fill(out.data(), first, n);
  return out;
}

std::vector<int64_t> random_lengths(int64_t n, int64_t max_len, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  for (auto& l : lengths) l = std::uniform_int_distribution<int64_t>(0, max_len)(gen);
  return lengths;
}

TEST(GptSplit, Parse) {
  EXPECT_EQ(parse_split("98,1,1"), (SplitWeights{98, 1, 1}));
  EXPECT_EQ(parse_split(" 0.5, 0 ,2.5"), (SplitWeights{0.5, 0, 2.5}));
  EXPECT_EQ(parse_split("1,0,0"), (SplitWeights{1, 0, 0}));
  for (const char* bad : {"", "98", "98,2", "1,2,3,4", "a,1,1", "-1,1,1", "0,0,0", "1,,1",
                          "1e400,1,1", "1,1,1,", "nan,1,1", "1;1;1"}) {
    EXPECT_FALSE(parse_split(bad).has_value()) << bad;
  }
}

TEST(GptSplit, Boundaries) {
  EXPECT_EQ(split_boundaries(1000, {98, 1, 1}), (std::array<int64_t, 4>{0, 980, 990, 1000}));
  EXPECT_EQ(split_boundaries(10, {8, 1, 1}), (std::array<int64_t, 4>{0, 8, 9, 10}));
  EXPECT_EQ(split_boundaries(3, {98, 1, 1}), (std::array<int64_t, 4>{0, 3, 3, 3}));
  EXPECT_EQ(split_boundaries(7, {0, 1, 0}), (std::array<int64_t, 4>{0, 0, 7, 7}));
  // round(10 * 1/3) = 3, round(10 * 2/3) = 7.
  EXPECT_EQ(split_boundaries(10, {1, 1, 1}), (std::array<int64_t, 4>{0, 3, 7, 10}));
}

using GptDatasetTest = DatasetFiles;

// Every sample of epochs 0..2 is the concatenation of that epoch's document order cut at a
// multiple of seq_len, and each epoch uses each of its S = (N - 1) / seq_len windows once.
TEST_F(GptDatasetTest, WindowsAreTheEpochsConcatenatedDocuments) {
  const std::vector<int64_t> lengths = random_lengths(60, 40, 7);  // includes empty documents
  const auto data = write("d", numbered_docs(lengths));
  const int64_t T = 16;
  GptDataset ds(data, Split::train, {1, 0, 0}, 42, T);
  const int64_t N = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  ASSERT_EQ(ds.tokens_per_epoch(), N);
  ASSERT_EQ(ds.samples_per_epoch(), (N - 1) / T);
  ASSERT_EQ(ds.window(), T + 1);
  const int64_t S = ds.samples_per_epoch();
  std::vector<int64_t> first_tokens;  // dataset order of documents -> first token value
  std::vector<int64_t> previous;
  for (int64_t e = 0; e < 3; ++e) {
    const std::vector<int64_t> order = ds.epoch_documents(e);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(lengths.size());
    std::iota(all.begin(), all.end(), int64_t{0});
    ASSERT_EQ(sorted, all) << "epoch " << e << " is a permutation of the documents";
    EXPECT_NE(order, previous) << "epoch " << e << " reshuffles the documents";
    previous = order;
    std::vector<int32_t> concat;
    std::map<int32_t, int64_t> position;  // token value -> position in the concatenation
    for (int64_t d : order) {
      const int64_t first = std::accumulate(lengths.begin(), lengths.begin() + d, int64_t{0});
      for (int64_t t = 0; t < lengths[static_cast<size_t>(d)]; ++t) {
        position[static_cast<int32_t>(first + t)] = static_cast<int64_t>(concat.size());
        concat.push_back(static_cast<int32_t>(first + t));
      }
    }
    const std::vector<int32_t> got = samples(ds, e * S, S);
    std::vector<int64_t> windows;
    for (int64_t j = 0; j < S; ++j) {
      const int64_t pos = position.at(got[static_cast<size_t>(j * (T + 1))]);
      ASSERT_EQ(pos % T, 0) << "sample " << e * S + j;
      ASSERT_LE(pos + T + 1, N);
      EXPECT_TRUE(
          std::equal(concat.begin() + pos, concat.begin() + pos + T + 1, got.begin() + j * (T + 1)))
          << "sample " << e * S + j << " = concatenation [" << pos << ", " << pos + T + 1 << ")";
      windows.push_back(pos / T);
    }
    std::vector<int64_t> sorted_windows = windows;
    std::sort(sorted_windows.begin(), sorted_windows.end());
    std::vector<int64_t> every(static_cast<size_t>(S));
    std::iota(every.begin(), every.end(), int64_t{0});
    EXPECT_EQ(sorted_windows, every) << "epoch " << e << " visits every window once";
    EXPECT_FALSE(std::is_sorted(windows.begin(), windows.end())) << "samples are shuffled";
  }
}

// Hand-checked: documents of 3, 0, 5, 2 tokens, seq_len 2, one epoch = 10 tokens, 4 windows.
TEST_F(GptDatasetTest, SmallCaseByHand) {
  const auto data = write("d", numbered_docs({3, 0, 5, 2}));
  GptDataset ds(data, Split::train, {1, 0, 0}, 5, 2);
  EXPECT_EQ(ds.samples_per_epoch(), 4);
  const std::vector<int64_t> order = ds.epoch_documents(0);
  const std::vector<std::vector<int32_t>> doc_tokens = {{0, 1, 2}, {}, {3, 4, 5, 6, 7}, {8, 9}};
  std::vector<int32_t> concat;
  for (int64_t d : order)
    concat.insert(concat.end(), doc_tokens[static_cast<size_t>(d)].begin(),
                  doc_tokens[static_cast<size_t>(d)].end());
  std::set<std::vector<int32_t>> expected, got;
  for (int64_t j = 0; j < 4; ++j)
    expected.insert(std::vector<int32_t>(concat.begin() + 2 * j, concat.begin() + 2 * j + 3));
  const std::vector<int32_t> s = samples(ds, 0, 4);
  for (int64_t j = 0; j < 4; ++j)
    got.insert(std::vector<int32_t>(s.begin() + 3 * j, s.begin() + 3 * j + 3));
  EXPECT_EQ(got, expected);
}

TEST_F(GptDatasetTest, SplitsHoldTheirDocumentsOnly) {
  const std::vector<int64_t> lengths(100, 10);  // document d holds tokens [10d, 10d + 10)
  const auto data = write("d", numbered_docs(lengths));
  const SplitWeights w{80, 15, 5};
  const int64_t T = 8;
  const std::array<int64_t, 4> b{0, 80, 95, 100};
  for (Split s : {Split::train, Split::valid, Split::test}) {
    GptDataset ds(data, s, w, 3, T);
    const size_t k = static_cast<size_t>(s);
    EXPECT_EQ(ds.first_document(), b[k]);
    EXPECT_EQ(ds.num_documents(), b[k + 1] - b[k]);
    EXPECT_EQ(ds.tokens_per_epoch(), 10 * (b[k + 1] - b[k]));
    EXPECT_EQ(ds.samples_per_epoch(), (10 * (b[k + 1] - b[k]) - 1) / T);
    const std::vector<int32_t> toks = samples(ds, 0, 3 * ds.samples_per_epoch());
    const auto [lo, hi] = std::minmax_element(toks.begin(), toks.end());
    EXPECT_GE(*lo, 10 * b[k]) << split_name(s);
    EXPECT_LT(*hi, 10 * b[k + 1]) << split_name(s);
  }
}

TEST_F(GptDatasetTest, TooSmallSplitNamesTheNumbers) {
  const auto data = write("small", numbered_docs(std::vector<int64_t>(100, 3)));
  try {
    GptDataset ds(data, Split::valid, {98, 1, 1}, 1, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              (dir_ / "small").string() +
                  ": the valid split (documents [98, 99) of 100 with split weights 98,1,1) holds 3 "
                  "tokens, fewer than seq_len + 1 = 5: no sample fits; use more data or give this "
                  "split a larger weight");
  }
}

// Sample i depends on (dataset, split, weights, seed, seq_len, i) only: not on how samples are
// grouped into calls, on which epochs were read before, or on the object.
TEST_F(GptDatasetTest, SampleIsAPureFunctionOfItsIndex) {
  const auto data = write("d", numbered_docs(random_lengths(40, 30, 3)));
  GptDataset a(data, Split::train, {9, 1, 0}, 11, 7);
  const int64_t S = a.samples_per_epoch();
  const std::vector<int32_t> all = samples(a, 0, 5 * S);
  GptDataset b(data, Split::train, {9, 1, 0}, 11, 7);
  const int64_t W = b.window();
  for (int64_t i : {4 * S + 2, int64_t{0}, 2 * S - 1, 3 * S, S + 5}) {  // epochs out of order
    EXPECT_TRUE(
        std::equal(all.begin() + i * W, all.begin() + (i + 1) * W, samples(b, i, 1).begin()))
        << "sample " << i;
  }
  const std::vector<int32_t> across = samples(b, S - 3, 6);  // spans the epoch 0/1 boundary
  EXPECT_TRUE(std::equal(across.begin(), across.end(), all.begin() + (S - 3) * W));
  GptDataset c(data, Split::train, {9, 1, 0}, 12, 7);
  EXPECT_NE(samples(c, 0, S), std::vector<int32_t>(all.begin(), all.begin() + S * W));
}

// The index of a million documents (one epoch: shuffle, prefix sums, sample shuffle) builds in
// well under a second.
TEST_F(GptDatasetTest, MillionDocumentIndexIsFast) {
  const int64_t n = 1'000'000;
  {
    IndexedDatasetWriter w((dir_ / "big").string(), 1000);
    std::vector<int32_t> doc;
    for (int64_t d = 0; d < n; ++d) {
      doc.assign(static_cast<size_t>(1 + d % 40), static_cast<int32_t>(d % 1000));
      w.add_document(doc);
    }
    w.finalize();
  }
  const std::shared_ptr<const IndexedDataset> data = IndexedDataset::open((dir_ / "big").string());
  const auto t0 = std::chrono::steady_clock::now();
  GptDataset ds(data, Split::train, {98, 1, 1}, 1, 128);
  std::vector<int32_t> one(static_cast<size_t>(ds.window()));
  ds.fill(one.data(), 0, 1);  // builds epoch 0
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ds.num_documents(), 980'000);
  std::printf("index of %lld documents, %lld samples: %.3f s\n",
              static_cast<long long>(ds.num_documents()),
              static_cast<long long>(ds.samples_per_epoch()), s);
  // A guard against a quadratic index (minutes), not a speed target: ten times the 0.5 s of an
  // unloaded sanitizer build, which a loaded one once just missed (0.509 s).
  EXPECT_LT(s, 5.0);
}

}  // namespace
}  // namespace llmt
