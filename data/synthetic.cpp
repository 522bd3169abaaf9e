// The synthetic bigram process (see synthetic.h); one counter-based draw per token.
#include "data/synthetic.h"

#include "core/rng.h"

namespace llmt {

namespace {
constexpr int kSuccessors = 4;
constexpr uint64_t kNoisePercent = 10;
}  // namespace

void SyntheticSource::fill(int32_t* out, int64_t first, int64_t n_samples, int64_t window) const {
  const uint64_t V = static_cast<uint64_t>(vocab_);
  const uint64_t table_stream = rng::hash_name("synthetic.successors");
  const uint64_t sample_stream = rng::hash_name("synthetic.samples");
  for (int64_t s = 0; s < n_samples; ++s) {
    int32_t* row = out + s * window;
    const uint64_t base = static_cast<uint64_t>(first + s) * static_cast<uint64_t>(window + 1);
    uint64_t tok = rng::key(seed_, sample_stream, base) % V;
    for (int64_t t = 0; t < window; ++t) {
      row[t] = static_cast<int32_t>(tok);
      uint64_t r = rng::key(seed_, sample_stream, base + 1 + static_cast<uint64_t>(t));
      if (r % 100 < kNoisePercent) {
        tok = (r >> 8) % V;
      } else {
        uint64_t j = (r >> 8) % kSuccessors;
        tok = rng::key(seed_, table_stream, tok * kSuccessors + j) % V;
      }
    }
  }
}

}  // namespace llmt
