// Samples addressed by global index and the loader that serves them. Every source (synthetic,
// a GPT dataset, a blend) maps global sample i to one token window, so step k always trains on
// global samples [k*GBS, (k+1)*GBS) whatever the data-parallel size or micro-batch size.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/synthetic.h"

namespace llmt {

// A source of token windows. W = window() = seq_len + 1 tokens: inputs are the first seq_len,
// targets the last seq_len. Sample i is a pure function of the source's parameters and i.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t window() const = 0;
  // Fills out (n, W) row-major with samples [first, first + n). Safe to call from any thread.
  virtual void fill(int32_t* out, int64_t first, int64_t n) const = 0;
};

// data.source = "synthetic" behind the SampleSource interface: sample i is the synthetic
// process's sample offset + i (validation reads the same process far past any training run).
class SyntheticSamples final : public SampleSource {
 public:
  SyntheticSamples(uint64_t seed, int64_t vocab_size, int64_t window, int64_t offset = 0)
      : source_(seed, vocab_size), window_(window), offset_(offset) {}
  int64_t window() const override { return window_; }
  void fill(int32_t* out, int64_t first, int64_t n) const override {
    source_.fill(out, offset_ + first, n, window_);
  }

 private:
  SyntheticSource source_;
  int64_t window_;
  int64_t offset_;
};

// Which global samples a rank trains on. A step consumes global_batch_size consecutive global
// samples; data-parallel rank r takes the r-th contiguous block of global_batch_size / dp_size
// of them, cut into micro-batches of micro_batch_size in order. Example: GBS 8, dp 2, MBS 2, the
// step starting at global sample 16: rank 0 gets [16, 17], [18, 19]; rank 1 gets [20, 21],
// [22, 23]. Concatenating every rank's micro-batches in rank order gives the global batch.
struct BatchLayout {
  int64_t global_batch_size = 1;
  int64_t micro_batch_size = 1;
  int64_t dp_rank = 0;
  int64_t dp_size = 1;

  int64_t micro_batches() const { return global_batch_size / (dp_size * micro_batch_size); }
  // Global index of the first sample of this rank's micro-batch `micro` in the step whose
  // first global sample is `step_first`.
  int64_t first_sample(int64_t step_first, int64_t micro) const {
    return step_first + dp_rank * (global_batch_size / dp_size) + micro * micro_batch_size;
  }
};

struct MicroBatch {
  int64_t first_sample = 0;     // global index of row 0
  std::vector<int32_t> tokens;  // (micro_batch_size, W) row-major
};

// Serves this rank's micro-batches of the steps covering global samples [consumed, end), in
// order, from a background thread that fills a ring of `prefetch` micro-batches ahead of the
// trainer. The only state is the count of consumed samples: a DataLoader started at consumed = c
// (with any dp_size) serves exactly what an uninterrupted run serves from sample c on.
class DataLoader {
 public:
  // end - consumed must be a whole number of steps (multiples of global_batch_size).
  DataLoader(std::shared_ptr<const SampleSource> source, const BatchLayout& layout,
             int64_t consumed, int64_t end, int64_t prefetch = 4);
  ~DataLoader();  // stops and joins the prefetch thread, also mid-run
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next micro-batch; valid until the next call. Rethrows a read error of the prefetch
  // thread; throws Error past `end`.
  const MicroBatch& next();
  // Global samples consumed by the steps whose micro-batches have all been handed out.
  int64_t consumed() const;
  // Seconds next() spent blocked waiting for data since the previous call (then reset to 0).
  double take_wait_seconds();

 private:
  void produce();

  std::shared_ptr<const SampleSource> source_;
  BatchLayout layout_;
  int64_t start_;                 // global sample where this loader's first step starts
  int64_t total_ = 0;             // micro-batches to serve: steps * layout_.micro_batches()
  std::vector<MicroBatch> ring_;  // micro-batch m lives in ring_[m % ring_.size()]

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int64_t produced_ = 0;  // micro-batches filled by the thread
  int64_t taken_ = 0;     // micro-batches handed out by next()
  int64_t released_ = 0;  // slots of micro-batches < released_ may be refilled (the trainer
                          // holds the last one handed out, released by the next next())
  bool stop_ = false;
  std::exception_ptr error_;
  double wait_s_ = 0;
  std::thread thread_;  // last: starts after every member above is initialised
};

}  // namespace llmt
