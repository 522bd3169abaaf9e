// AdamW as one elementwise pass (the CPU kernel's rearranged update), and the reductions the
// optimizer needs: a sum of squares in double and a non-finite test, each read back to the host.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale) {
  const auto t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  const auto step_size = static_cast<float>(lr / bc1);
  const auto inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - lr * weight_decay;
  for_each(n, [=] __device__(int64_t i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  });
}

namespace {

// sum of f(i) over [0, n) in double: per-block sums, then one block adds those in order
// (deterministic for a given n).
constexpr int kSumBlocks = 1024;

template <typename F>
__global__ void partial_sums_kernel(double* partial, int64_t n, F f) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    s += f(i);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void final_sum_kernel(double* out, const double* partial, int count) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

template <typename F>
double device_sum(int64_t n, F f) {
  static double* scratch = [] {
    double* p = nullptr;
    LLMT_CUDA_CHECK(cudaMalloc(&p, (kSumBlocks + 1) * sizeof(double)));
    return p;
  }();
  if (n <= 0) return 0.0;
  const int blocks = static_cast<int>(std::min<int64_t>(kSumBlocks, (n + kThreads - 1) / kThreads));
  partial_sums_kernel<<<blocks, kThreads, 0, stream()>>>(scratch + 1, n, f);
  LLMT_CUDA_LAUNCHED();
  final_sum_kernel<<<1, kThreads, 0, stream()>>>(scratch, scratch + 1, blocks);
  LLMT_CUDA_LAUNCHED();
  return read_back(scratch);
}

}  // namespace

double sum_squares(const float* x, int64_t n) {
  return device_sum(n, [=] __device__(int64_t i) {
    const double d = x[i];
    return d * d;
  });
}

bool has_nonfinite(const float* x, int64_t n) {
  return device_sum(n, [=] __device__(int64_t i) {
           return (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u ? 1.0 : 0.0;
         }) > 0.0;
}

}  // namespace llmt::cuda
