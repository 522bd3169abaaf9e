// The prefetching loader: one producer thread, a ring of micro-batch buffers, and a condition
// variable for both directions (producer waits for a free slot, consumer for a filled one).
#include "data/loader.h"

#include <chrono>

#include "core/check.h"

namespace llmt {

DataLoader::DataLoader(std::shared_ptr<const SampleSource> source, const BatchLayout& layout,
                       int64_t consumed, int64_t end, int64_t prefetch)
    : source_(std::move(source)), layout_(layout), start_(consumed) {
  const BatchLayout& l = layout_;
  LLMT_CHECK(l.global_batch_size >= 1 && l.micro_batch_size >= 1 && l.dp_size >= 1 &&
                 l.global_batch_size % (l.dp_size * l.micro_batch_size) == 0,
             "global_batch_size=", l.global_batch_size, " is not a multiple of dp_size=", l.dp_size,
             " x micro_batch_size=", l.micro_batch_size);
  LLMT_CHECK(l.dp_rank >= 0 && l.dp_rank < l.dp_size, "dp_rank=", l.dp_rank,
             " outside [0, dp_size=", l.dp_size, ")");
  LLMT_CHECK(consumed >= 0 && end >= consumed && (end - consumed) % l.global_batch_size == 0,
             "samples [", consumed, ", ", end,
             ") are not whole steps of global_batch_size=", l.global_batch_size);
  LLMT_CHECK(prefetch >= 1, "prefetch=", prefetch, " must be >= 1");
  total_ = (end - consumed) / l.global_batch_size * l.micro_batches();
  // One slot more than `prefetch`: the trainer holds the last micro-batch it was given.
  ring_.resize(static_cast<size_t>(prefetch + 1));
  for (MicroBatch& mb : ring_)
    mb.tokens.resize(static_cast<size_t>(l.micro_batch_size * source_->window()));
  thread_ = std::thread([this] { produce(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DataLoader::produce() {
  const int64_t slots = static_cast<int64_t>(ring_.size());
  const int64_t per_step = layout_.micro_batches();
  try {
    for (int64_t m = 0; m < total_; ++m) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || m - released_ < slots; });
        if (stop_) return;
      }
      // Slot m % slots is neither held by the trainer nor queued: fill it unlocked.
      MicroBatch& mb = ring_[static_cast<size_t>(m % slots)];
      const int64_t step_first = start_ + m / per_step * layout_.global_batch_size;
      mb.first_sample = layout_.first_sample(step_first, m % per_step);
      source_->fill(mb.tokens.data(), mb.first_sample, layout_.micro_batch_size);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        produced_ = m + 1;
      }
      cv_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

const MicroBatch& DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  LLMT_CHECK(taken_ < total_, "the loader served all ", total_,
             " micro-batches of global samples [", start_, ", ",
             start_ + total_ / layout_.micro_batches() * layout_.global_batch_size, ")");
  released_ = taken_;  // the micro-batch handed out last time is done with
  cv_.notify_all();
  if (produced_ <= taken_ && !error_) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, [&] { return produced_ > taken_ || error_; });
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (produced_ <= taken_) std::rethrow_exception(error_);
  return ring_[static_cast<size_t>(taken_++ % static_cast<int64_t>(ring_.size()))];
}

int64_t DataLoader::consumed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return start_ + taken_ / layout_.micro_batches() * layout_.global_batch_size;
}

double DataLoader::take_wait_seconds() {
  std::lock_guard<std::mutex> lock(mutex_);
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

}  // namespace llmt
