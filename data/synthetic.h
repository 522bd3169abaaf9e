// data.source = "synthetic": seeded token sequences for tests and benchmarks. Sample i is a pure
// function of (seed, i), so any layout or resume sees the same global batch. The sequences follow
// a sparse random bigram process (each token has 4 likely successors, 10% uniform noise), so a
// model can learn them and the loss visibly falls from ln(V) towards ~2.0 nats for large V.
#pragma once

#include <cstdint>
#include <vector>

namespace llmt {

class SyntheticSource {
 public:
  SyntheticSource(uint64_t seed, int64_t vocab_size) : seed_(seed), vocab_(vocab_size) {}
  // Fills `out` (n_samples, window) row-major with samples [first, first + n_samples).
  void fill(int32_t* out, int64_t first, int64_t n_samples, int64_t window) const;

 private:
  uint64_t seed_;
  int64_t vocab_;
};

}  // namespace llmt
