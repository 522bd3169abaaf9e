// The loader: the global batch of every step is the same for dp = 1, 2, 4 and micro-batch sizes
// 1, 2, 4 (over a GPT dataset and a blend of two), resuming from a consumed count (with another
// dp size) continues the uninterrupted stream, the prefetch thread stops cleanly at any point,
// reports waiting, and passes read errors on.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/check.h"
#include "data/blend.h"
#include "data/gpt_dataset.h"
#include "data/loader.h"
#include "dataset_files.h"

namespace llmt {
namespace {

using test::DatasetFiles;
using test::numbered_docs;

constexpr int64_t kGbs = 16;
constexpr int64_t kSteps = 6;

// Global batch of each step as the dp ranks see it: rank 0's micro-batches, then rank 1's, ...
std::vector<std::vector<int32_t>> global_batches(std::shared_ptr<const SampleSource> src,
                                                 int64_t dp, int64_t mbs, int64_t consumed,
                                                 int64_t steps) {
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int64_t r = 0; r < dp; ++r)
    ranks.push_back(std::make_unique<DataLoader>(src, BatchLayout{kGbs, mbs, r, dp}, consumed,
                                                 consumed + steps * kGbs, 2));
  std::vector<std::vector<int32_t>> out;
  for (int64_t k = 0; k < steps; ++k) {
    std::vector<int32_t>& batch = out.emplace_back();
    for (int64_t r = 0; r < dp; ++r) {
      const BatchLayout layout{kGbs, mbs, r, dp};
      for (int64_t m = 0; m < layout.micro_batches(); ++m) {
        const MicroBatch& mb = ranks[static_cast<size_t>(r)]->next();
        EXPECT_EQ(mb.first_sample, consumed + k * kGbs + r * (kGbs / dp) + m * mbs);
        batch.insert(batch.end(), mb.tokens.begin(), mb.tokens.end());
      }
      EXPECT_EQ(ranks[static_cast<size_t>(r)]->consumed(), consumed + (k + 1) * kGbs);
    }
  }
  return out;
}

class DataLoaderTest : public DatasetFiles {
 protected:
  std::shared_ptr<const SampleSource> gpt(const std::string& name, uint64_t seed) {
    return std::make_shared<GptDataset>(write(name, numbered_docs(std::vector<int64_t>(50, 13))),
                                        Split::train, SplitWeights{1, 0, 0}, seed, 8);
  }
};

TEST_F(DataLoaderTest, GlobalBatchIsTheSameForEveryDpAndMicroBatchSize) {
  const auto one = gpt("a", 1);  // 650 tokens: 81 samples per epoch, so 96 samples span 2 epochs
  const auto blend =
      std::make_shared<Blend>(std::vector<std::shared_ptr<const SampleSource>>{one, gpt("b", 2)},
                              std::vector<double>{3, 1});
  for (const auto& src : {one, std::shared_ptr<const SampleSource>(blend)}) {
    // Reference: global samples [k * GBS, (k + 1) * GBS) straight from the source.
    std::vector<std::vector<int32_t>> ref;
    for (int64_t k = 0; k < kSteps; ++k) {
      ref.emplace_back(static_cast<size_t>(kGbs * src->window()));
      src->fill(ref.back().data(), k * kGbs, kGbs);
    }
    for (int64_t dp : {1, 2, 4}) {
      for (int64_t mbs : {1, 2, 4}) {
        EXPECT_EQ(global_batches(src, dp, mbs, 0, kSteps), ref) << "dp " << dp << " mbs " << mbs;
      }
    }
  }
}

// A run stopped after 3 steps and resumed from consumed = 3 * GBS, with dp 1 -> 2 and another
// micro-batch size, sees exactly the steps 4..6 of an uninterrupted run.
TEST_F(DataLoaderTest, ResumeFromConsumedSamples) {
  const auto src = gpt("a", 9);
  const auto full = global_batches(src, 1, 4, 0, kSteps);
  const auto resumed = global_batches(src, 2, 2, 3 * kGbs, kSteps - 3);
  EXPECT_EQ(resumed, std::vector<std::vector<int32_t>>(full.begin() + 3, full.end()));
}

// A source that takes `delay` per fill and fails at sample `fail_at`.
class Slow final : public SampleSource {
 public:
  Slow(std::chrono::milliseconds delay, int64_t fail_at) : delay_(delay), fail_at_(fail_at) {}
  int64_t window() const override { return 3; }
  void fill(int32_t* out, int64_t first, int64_t n) const override {
    std::this_thread::sleep_for(delay_);
    LLMT_CHECK(first + n <= fail_at_, "sample ", fail_at_, " is unreadable");
    for (int64_t k = 0; k < 3 * n; ++k) out[k] = static_cast<int32_t>(first);
  }

 private:
  std::chrono::milliseconds delay_;
  int64_t fail_at_;
};

TEST(DataLoader, ReportsTheTimeItWaited) {
  using namespace std::chrono_literals;
  DataLoader slow(std::make_shared<Slow>(30ms, 1'000'000), BatchLayout{4, 2, 0, 1}, 0, 8, 2);
  slow.next();
  slow.next();
  const double waited = slow.take_wait_seconds();
  EXPECT_GE(waited, 0.045) << "two fills of 30 ms, the first two waited for in full";
  EXPECT_LT(waited, 1.0);
  EXPECT_EQ(slow.take_wait_seconds(), 0.0) << "reset after taking";
  // With the data ready ahead of time the trainer waits nothing.
  DataLoader fast(std::make_shared<Slow>(0ms, 1'000'000), BatchLayout{4, 2, 0, 1}, 0, 8, 4);
  std::this_thread::sleep_for(50ms);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(fast.next().tokens[0], 2 * i);
  EXPECT_LT(fast.take_wait_seconds(), 0.005);
  EXPECT_EQ(fast.consumed(), 8);
  try {
    fast.next();
    FAIL() << "no error past the end";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("served all 4 micro-batches of global samples [0, 8)"),
              std::string::npos)
        << e.what();
  }
}

// Destroying a loader never hangs: before anything was taken, with the ring full, mid-fill.
TEST(DataLoader, StopsCleanlyAtAnyPoint) {
  using namespace std::chrono_literals;
  const auto t0 = std::chrono::steady_clock::now();
  { DataLoader idle(std::make_shared<Slow>(0ms, 1'000'000), BatchLayout{8, 1, 0, 1}, 0, 8000, 3); }
  {
    DataLoader full(std::make_shared<Slow>(0ms, 1'000'000), BatchLayout{8, 1, 0, 1}, 0, 8000, 3);
    full.next();
    std::this_thread::sleep_for(20ms);  // the thread now waits for a free slot
  }
  {
    DataLoader busy(std::make_shared<Slow>(50ms, 1'000'000), BatchLayout{8, 1, 0, 1}, 0, 8000, 3);
    std::this_thread::sleep_for(10ms);  // the thread is inside fill()
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

TEST(DataLoader, PassesReadErrorsOn) {
  using namespace std::chrono_literals;
  DataLoader l(std::make_shared<Slow>(0ms, 5), BatchLayout{2, 1, 0, 1}, 0, 8, 2);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(l.next().tokens[0], i);
  try {
    l.next();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 5 is unreadable"), std::string::npos) << e.what();
  }
}

TEST(DataLoader, RejectsLayoutsThatDoNotDivide) {
  const auto src = std::make_shared<SyntheticSamples>(1, 50, 5);
  EXPECT_THROW(DataLoader(src, BatchLayout{12, 4, 0, 2}, 0, 12), Error);  // 12 % (2 * 4) != 0
  EXPECT_THROW(DataLoader(src, BatchLayout{8, 2, 2, 2}, 0, 8), Error);    // rank 2 of 2
  EXPECT_THROW(DataLoader(src, BatchLayout{8, 2, 0, 1}, 0, 12), Error);   // 1.5 steps
}

}  // namespace
}  // namespace llmt
