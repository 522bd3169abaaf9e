// Parameter initialisation from the counter-based generator, element for element the CPU
// kernel's: x[i] = std * normal(key(seed, stream, global index)), whatever the grid.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {

void init_normal(float* x, int64_t n, float std, uint64_t seed, uint64_t stream_id,
                 int64_t global_offset, int64_t W, int64_t row_stride) {
  for_each(n, [=] __device__(int64_t i) {
    const int64_t g = global_offset + i / W * row_stride + i % W;
    x[i] = std * rng_normal(rng::key(seed, stream_id, static_cast<uint64_t>(g)));
  });
}

}  // namespace llmt::cuda
