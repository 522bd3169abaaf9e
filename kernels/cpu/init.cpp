// Parameter initialisation from the counter-based generator: x[i] depends only on (seed, stream,
// global_offset + i), so a shard initialised on its own equals the same slice of the whole
// tensor, and any split over threads gives the same bits. A column shard (W of every row's
// row_stride elements) takes its rows' global indices the same way.
#include "core/rng.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {

void init_normal(float* x, int64_t n, float std, uint64_t seed, uint64_t stream,
                 int64_t global_offset, int64_t W, int64_t row_stride) {
  constexpr int64_t kNormalCost = 16;  // a log, a cos and a sqrt in double per element
  parallel_for(n, kGrainElems / kNormalCost, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = global_offset + i / W * row_stride + i % W;
      x[i] = std * rng::normal(rng::key(seed, stream, static_cast<uint64_t>(g)));
    }
  });
}

}  // namespace llmt::cpu
