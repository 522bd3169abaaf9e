// bf16 / f16 storage emulation and conversion, with the CPU kernels' codecs: bf16 rounds to
// nearest even on the top 16 bits (NaN stays NaN), f16 is IEEE half through cuda_fp16
// (round to nearest even, subnormals, overflow to inf), as _Float16 on the CPU.
#include <cuda_fp16.h>

#include <memory>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/fp8_math.h"
#include "kernels/int_quant_math.h"

namespace llmt::cuda {
namespace {

struct F32 {
  using Storage = float;
  __device__ static float load(float x) { return x; }
  __device__ static float store(float x) { return x; }
};

struct BF16 {
  using Storage = uint16_t;
  __device__ static float load(uint16_t b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
  }
  __device__ static uint16_t store(float x) {
    const uint32_t b = __float_as_uint(x);
    const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = b + 0x7fffu + ((b >> 16) & 1u);
    return static_cast<uint16_t>((nan ? b | 0x00400000u : rounded) >> 16);
  }
};

struct F16 {
  using Storage = uint16_t;
  __device__ static float load(uint16_t h) { return __half2float(__ushort_as_half(h)); }
  __device__ static uint16_t store(float x) { return __half_as_ushort(__float2half_rn(x)); }
};

template <typename Fmt>
void round_through(float* x, int64_t n) {
  for_each(n, [=] __device__(int64_t i) { x[i] = Fmt::load(Fmt::store(x[i])); });
}

template <typename Src, typename Dst>
void convert_as(void* dst, const void* src, int64_t n) {
  auto* d = static_cast<typename Dst::Storage*>(dst);
  const auto* s = static_cast<const typename Src::Storage*>(src);
  for_each(n, [=] __device__(int64_t i) { d[i] = Dst::store(Src::load(s[i])); });
}

template <typename F>
void with_codec(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(F32{});
    case DType::bf16:
      return f(BF16{});
    case DType::f16:
      return f(F16{});
    case DType::i32:
    case DType::f64:
      break;
  }
  LLMT_CHECK(false, "convert: ", dtype_name(t), " is not a floating-point storage type");
}

}  // namespace

void round_to_bf16(float* x, int64_t n) {
  round_through<BF16>(x, n);
}

void round_to_f16(float* x, int64_t n) {
  round_through<F16>(x, n);
}

namespace {

// One block per tile: its threads stride over the tile's elements, then a block max.
__global__ void fp8_amax_kernel(float* amax, const float* in, int64_t M, int64_t K, int64_t tr,
                                int64_t tc, int64_t TC) {
  const int64_t tile = blockIdx.x, ti = tile / TC, tj = tile % TC;
  const int64_t r0 = ti * tr, c0 = tj * tc;
  const int64_t rows = min(tr, M - r0), cols = min(tc, K - c0);
  uint32_t m = 0;  // the magnitudes' bits, NaN as 0 (kernel_math::abs_bits), as on the CPU
  for (int64_t e = threadIdx.x; e < rows * cols; e += blockDim.x)
    m = max(m, kernel_math::abs_bits(in[(r0 + e / cols) * K + c0 + e % cols]));
  m = block_reduce(m, MaxOp{}, 0u);
  if (threadIdx.x == 0) amax[tile] = kernel_math::bits_float(m);
}

}  // namespace

void fp8_amax(float* amax, const float* in, int64_t M, int64_t K, int64_t tr, int64_t tc) {
  const int64_t TR = (M + tr - 1) / tr, TC = (K + tc - 1) / tc;
  if (TR * TC == 0) return;
  LLMT_CHECK(TR * TC <= 0x7fffffff, "fp8_amax: ", TR * TC, " tiles exceed one CUDA grid");
  fp8_amax_kernel<<<static_cast<unsigned>(TR * TC), kThreads, 0, stream()>>>(amax, in, M, K, tr, tc,
                                                                             TC);
  LLMT_CUDA_LAUNCHED();
}

void fp8_quantize(float* out, const float* in, const float* amax, int64_t M, int64_t K, int64_t tr,
                  int64_t tc, int fmt) {
  const int64_t TC = (K + tc - 1) / tc;
  for_each(M * K, [=] __device__(int64_t e) {
    const int64_t i = e / K, k = e % K;
    out[e] = kernel_math::fp8_quantize_value(in[e], amax[(i / tr) * TC + k / tc], fmt);
  });
}

// One thread per block of values (the codes of a block share their words).
void quantize_int(int32_t* packed, const float* in, int64_t S, int64_t L, int64_t B, int bits) {
  const int64_t nb = (L + B - 1) / B, bw = kernel_math::int_block_words(B, bits);
  for_each(S * nb, [=] __device__(int64_t k) {
    const int64_t row = k / nb, b = k % nb, len = min(B, L - b * B);
    kernel_math::int_quantize_block(packed + k * bw, in + row * L + b * B, len, bw, bits);
  });
}

void dequantize_int(float* out, const int32_t* packed, int64_t S, int64_t L, int64_t B, int bits) {
  const int64_t nb = (L + B - 1) / B, bw = kernel_math::int_block_words(B, bits);
  for_each(S * L, [=] __device__(int64_t e) {
    const int64_t row = e / L, i = e % L, b = i / B;
    const int32_t* w = packed + (row * nb + b) * bw;
    out[e] = kernel_math::int_value(w + 1, i % B, kernel_math::int_bits_float(w[0]), bits);
  });
}

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  with_codec(src_type, [&](auto s) {
    with_codec(dst_type, [&](auto d) { convert_as<decltype(s), decltype(d)>(dst, src, n); });
  });
}

void* op_scratch(int slot, size_t bytes) {
  static std::vector<std::unique_ptr<Scratch>> slots;
  while (slots.size() <= static_cast<size_t>(slot)) slots.push_back(std::make_unique<Scratch>());
  return slots[static_cast<size_t>(slot)]->reserve(bytes);
}

}  // namespace llmt::cuda
