// AdamW and the reductions the optimizer needs (a sum of squares in double, a non-finite test),
// per tensor and over tensor lists. Lists go through a multi-tensor apply (after apex's
// multi_tensor_apply): each launch carries up to a fixed number of tensors and blocks in its
// kernel arguments, block b working on one chunk of one tensor, so a whole model's parameters
// take a few launches instead of one or two per tensor, and a reduction reads back once per
// list. The AdamW element math is kernels/adamw_math.h, shared with the CPU kernels.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "kernels/adamw_math.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {
namespace {

using kernel_math::AdamWCoeffs;

// ---- multi-tensor apply -----------------------------------------------------------------------

constexpr int64_t kChunk = 16384;  // elements per block (64 per thread)
constexpr int kListBlocks = 320;   // blocks per launch

// What one launch covers: tensors [0, K) of D pointer lists, and for each of its blocks the
// tensor and chunk it works on. Passed by value as a kernel argument (4 KiB at most).
template <int D, int K>
struct TensorList {
  float* ptr[D][K];  // D pointer lists (AdamW: param, grad, m, v); read-only ones cast to float*
  int64_t numel[K];
  float scalar[K];      // one value per tensor (AdamW: its weight-decay factor)
  int64_t first_block;  // this launch's block 0 among the blocks of the whole list
  uint8_t block_tensor[kListBlocks];
  int32_t block_chunk[kListBlocks];
};

// Block b: op(list, k, begin, end) on chunk [begin, end) of tensor k.
template <typename List, typename Op>
__global__ void multi_tensor_kernel(List list, Op op) {
  const int k = list.block_tensor[blockIdx.x];
  const int64_t begin = list.block_chunk[blockIdx.x] * kChunk;
  const int64_t end = begin + kChunk < list.numel[k] ? begin + kChunk : list.numel[k];
  op(list, k, begin, end);
}

// Runs op over every chunk of tensors k < count (lists[d][k], numel[k] elements, scalar[k] or 0
// when scalar is null) in as few launches as the capacity allows: a launch goes when its blocks
// or its tensor slots are full; a tensor cut by a full launch goes on as tensor 0 of the next.
// Empty tensors take no block. Blocks are numbered over the whole list in tensor and chunk order
// (TensorList::first_block + blockIdx.x).
template <int K, int D, typename Op>
void multi_tensor_apply(const std::array<float* const*, D>& lists, const int64_t* numel,
                        const float* scalar, int64_t count, Op op) {
  using List = TensorList<D, K>;
  static_assert(K <= 256, "block_tensor is a uint8_t");
  static_assert(sizeof(List) + sizeof(Op) <= 4096, "kernel arguments over 4 KiB");
  List list{};
  int nt = 0, nb = 0;
  auto launch = [&] {
    multi_tensor_kernel<<<nb, kThreads, 0, stream()>>>(list, op);  // copies `list` now
    LLMT_CUDA_LAUNCHED();
    list.first_block += nb;
    nb = 0;
  };
  for (int64_t k = 0; k < count; ++k) {
    const int64_t n = numel[k];
    if (n == 0) continue;
    for (int d = 0; d < D; ++d) list.ptr[d][nt] = lists[d][k];
    list.numel[nt] = n;
    list.scalar[nt] = scalar ? scalar[k] : 0.0f;
    ++nt;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      list.block_tensor[nb] = static_cast<uint8_t>(nt - 1);
      list.block_chunk[nb] = static_cast<int32_t>(c);
      ++nb;
      const bool last_chunk = c == chunks - 1;
      if (nb < kListBlocks && !(nt == K && last_chunk)) continue;
      launch();
      if (last_chunk) {
        nt = 0;
      } else {
        for (int d = 0; d < D; ++d) list.ptr[d][0] = list.ptr[d][nt - 1];
        list.numel[0] = list.numel[nt - 1];
        list.scalar[0] = list.scalar[nt - 1];
        nt = 1;
      }
    }
  }
  if (nb > 0) launch();
}

// Blocks of a list, as multi_tensor_apply numbers them.
int64_t list_blocks(const int64_t* numel, int64_t count) {
  int64_t blocks = 0;
  for (int64_t k = 0; k < count; ++k) blocks += (numel[k] + kChunk - 1) / kChunk;
  return blocks;
}

// ---- AdamW -------------------------------------------------------------------------------------

constexpr int kAdamWTensors = 24;  // tensor slots per launch: 4 pointers + size + decay each

struct AdamWChunk {
  AdamWCoeffs c;
  template <typename List>
  __device__ void operator()(const List& list, int k, int64_t begin, int64_t end) const {
    float* p = list.ptr[0][k];
    const float* g = list.ptr[1][k];
    float* m = list.ptr[2][k];
    float* v = list.ptr[3][k];
    const float decay = list.scalar[k];
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      kernel_math::adamw_element(p[i], m[i], v[i], g[i], decay, c);
  }
};

// ---- reductions --------------------------------------------------------------------------------

constexpr int kSumTensors = 96;  // tensor slots per launch of a reduction

struct Square {
  __device__ double operator()(float x) const {
    const double d = x;
    return d * d;
  }
};
struct NonFinite {
  __device__ double operator()(float x) const {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u ? 1.0 : 0.0;
  }
};

// partial[block] = the sum of elem(x) over the block's chunk.
template <typename Elem>
struct SumChunk {
  double* partial;
  Elem elem;
  template <typename List>
  __device__ void operator()(const List& list, int k, int64_t begin, int64_t end) const {
    const float* x = list.ptr[0][k];
    double s = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) s += elem(x[i]);
    s = block_sum(s);
    if (threadIdx.x == 0) partial[list.first_block + blockIdx.x] = s;
  }
};

// *out = the sum of partial[0, count), each thread over a fixed stride, then the block's tree:
// the same order on every run.
__global__ void final_sum_kernel(double* out, const double* partial, int64_t count) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

// Device scratch for a result and `count` partial sums, grown as lists need.
double* sum_scratch(int64_t count) {
  static Scratch s;
  return static_cast<double*>(s.reserve(static_cast<size_t>(count + 1) * sizeof(double)));
}

// The sum of elem(x) over every element of the list: one partial per block, the partials added
// by one block in a fixed order, one blocking read-back. Deterministic for a given list of
// sizes (chunks and their order do not depend on the device).
template <typename Elem>
double list_sum(const float* const* x, const int64_t* numel, int64_t count, Elem elem) {
  const int64_t blocks = list_blocks(numel, count);
  if (blocks == 0) return 0.0;
  double* scratch = sum_scratch(blocks);
  multi_tensor_apply<kSumTensors, 1>({const_cast<float* const*>(x)}, numel, nullptr, count,
                                     SumChunk<Elem>{scratch + 1, elem});
  final_sum_kernel<<<1, kThreads, 0, stream()>>>(scratch, scratch + 1, blocks);
  LLMT_CUDA_LAUNCHED();
  return read_back(scratch);
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale) {
  const AdamWCoeffs c = kernel_math::adamw_coeffs(lr, beta1, beta2, eps, step, grad_scale);
  const float decay = kernel_math::adamw_decay(lr, weight_decay);
  for_each(n, [=] __device__(int64_t i) {
    kernel_math::adamw_element(param[i], m[i], v[i], grad[i], decay, c);
  });
}

void adamw_update_multi(float* const* param, const float* const* grad, float* const* m,
                        float* const* v, const int64_t* numel, const float* weight_decay,
                        int64_t count, float lr, float beta1, float beta2, float eps, int64_t step,
                        float grad_scale) {
  std::vector<float> decay(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k)
    decay[static_cast<size_t>(k)] = kernel_math::adamw_decay(lr, weight_decay[k]);
  multi_tensor_apply<kAdamWTensors, 4>(
      {param, const_cast<float* const*>(grad), m, v}, numel, decay.data(), count,
      AdamWChunk{kernel_math::adamw_coeffs(lr, beta1, beta2, eps, step, grad_scale)});
}

double sum_squares(const float* x, int64_t n) {
  return sum_squares_multi(&x, &n, 1);
}

bool has_nonfinite(const float* x, int64_t n) {
  return has_nonfinite_multi(&x, &n, 1);
}

double sum_squares_multi(const float* const* x, const int64_t* numel, int64_t count) {
  return list_sum(x, numel, count, Square{});
}

bool has_nonfinite_multi(const float* const* x, const int64_t* numel, int64_t count) {
  return list_sum(x, numel, count, NonFinite{}) > 0.0;
}

}  // namespace llmt::cuda
