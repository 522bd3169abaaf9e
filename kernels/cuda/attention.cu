// Causal grouped-query attention, flash-attention style: K/V (forward, dq) or Q/dO (dk, dv)
// tiles staged in shared memory, one thread per query (or key) row holding its head vectors in
// registers, an online softmax in the forward, and a backward that recomputes every probability
// from q, k and the saved log-sum-exp, so no (T,T) matrix ever exists. The head dim is a template
// bound (64, 128, 256); D <= 256. Straightforward CUDA cores, no tensor cores: this is the
// always-available path (docs/gpu.md), not a tuned one.
// Layouts (kernels/ops.h): qkv (B,T,H+2KV,D), out and dout (B,T,H,D), lse (B,H,T).
// With 16-bit operands and a shape cuDNN supports, the entry points below hand the call to cuDNN's
// fused attention instead (attention_cudnn.h): qkv (and out, dout) converted to the 16-bit type in
// a reused device scratch buffer, cuDNN's results converted back to fp32.
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#ifdef LLMTRAIN_HAVE_CUDNN
#include "kernels/cuda/attention_cudnn.h"
#endif

namespace llmt::cuda {
namespace {

constexpr int kRows = 64;  // query (or key) rows per block, one per thread

// Rows of a tile staged in shared memory: 2 x kTile x kD floats = 32 KiB for every kD.
template <int kD>
constexpr int kTile = 4096 / kD;

struct Dims {
  int64_t B, T, H, KV, D;
  float scale;
  __host__ __device__ int64_t ld() const {
    return (H + 2 * KV) * D;
  }  // floats between qkv rows t and t + 1
};

// Loads rows [r0, r0 + kTile<kD>) of a (T, .., D) source whose rows are ld floats apart into
// shared memory, zeros past T and in the columns [D, kD) (so full-width loops add only zeros).
template <int kD>
__device__ void stage(float (*dst)[kD], const float* src, int64_t ld, int64_t r0, const Dims& d) {
  for (int e = threadIdx.x; e < kTile<kD> * kD; e += blockDim.x) {
    const int r = e / kD, c = e % kD;
    dst[r][c] = r0 + r < d.T && c < d.D ? src[(r0 + r) * ld + c] : 0.0f;
  }
}

template <int kD>
__device__ float dot(const float* x, const float* y, int64_t D) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kD; ++c)
    if (c < D) s += x[c] * y[c];
  return s;
}

// grid (ceil(T/kRows), H, B): thread = query t of head h.
template <int kD>
__global__ void forward_kernel(float* out, float* lse, const float* qkv, Dims d) {
  __shared__ float ks[kTile<kD>][kD], vs[kTile<kD>][kD];
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (d.H / d.KV);
  const int64_t q0 = blockIdx.x * int64_t{kRows}, t = q0 + threadIdx.x;
  const float* base = qkv + b * d.T * d.ld();
  float q[kD], acc[kD];
#pragma unroll
  for (int c = 0; c < kD; ++c) {
    q[c] = c < d.D && t < d.T ? base[t * d.ld() + h * d.D + c] * d.scale : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t last = d.T < q0 + kRows ? d.T : q0 + kRows;  // keys this block needs: [0, last)
  for (int64_t k0 = 0; k0 < last; k0 += kTile<kD>) {
    __syncthreads();
    stage<kD>(ks, base + (d.H + g) * d.D, d.ld(), k0, d);
    stage<kD>(vs, base + (d.H + d.KV + g) * d.D, d.ld(), k0, d);
    __syncthreads();
    for (int j = 0; j < kTile<kD> && k0 + j <= t && t < d.T; ++j) {
      const float s = dot<kD>(q, ks[j], d.D);
      if (s > m) {  // rescale what is summed so far to the new max
        const float corr = expf(m - s);
        l *= corr;
#pragma unroll
        for (int c = 0; c < kD; ++c) acc[c] *= corr;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
#pragma unroll
      for (int c = 0; c < kD; ++c) acc[c] += p * vs[j][c];
    }
  }
  if (t >= d.T) return;
  float* o = out + ((b * d.T + t) * d.H + h) * d.D;
#pragma unroll
  for (int c = 0; c < kD; ++c)
    if (c < d.D) o[c] = acc[c] / l;
  lse[(b * d.H + h) * d.T + t] = m + logf(l);
}

// delta (B,H,T) = rowsum(dout * out): the softmax backward's per-row term.
__global__ void delta_kernel(float* delta, const float* dout, const float* out, Dims d) {
  const int64_t row = blockIdx.x;  // (b, t, h)
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < d.D; c += blockDim.x)
    s += dout[row * d.D + c] * out[row * d.D + c];
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t h = row % d.H, bt = row / d.H, b = bt / d.T, t = bt % d.T;
    delta[(b * d.H + h) * d.T + t] = s;
  }
}

// grid (ceil(T/kRows), H, B): thread = query t of head h; dq = scale * sum_j ds_j k_j with
// p = exp(q.k scale - lse), ds = p (dout.v - delta).
template <int kD>
__global__ void dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                          const float* delta, Dims d) {
  __shared__ float ks[kTile<kD>][kD], vs[kTile<kD>][kD];
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (d.H / d.KV);
  const int64_t q0 = blockIdx.x * int64_t{kRows}, t = q0 + threadIdx.x;
  const float* base = qkv + b * d.T * d.ld();
  const bool valid = t < d.T;
  float q[kD], dq[kD], go[kD];
#pragma unroll
  for (int c = 0; c < kD; ++c) {
    const bool in = c < d.D && valid;
    q[c] = in ? base[t * d.ld() + h * d.D + c] * d.scale : 0.0f;
    go[c] = in ? dout[((b * d.T + t) * d.H + h) * d.D + c] : 0.0f;
    dq[c] = 0.0f;
  }
  const float lse_t = valid ? lse[(b * d.H + h) * d.T + t] : 0.0f;
  const float delta_t = valid ? delta[(b * d.H + h) * d.T + t] : 0.0f;
  const int64_t last = d.T < q0 + kRows ? d.T : q0 + kRows;
  for (int64_t k0 = 0; k0 < last; k0 += kTile<kD>) {
    __syncthreads();
    stage<kD>(ks, base + (d.H + g) * d.D, d.ld(), k0, d);
    stage<kD>(vs, base + (d.H + d.KV + g) * d.D, d.ld(), k0, d);
    __syncthreads();
    for (int j = 0; j < kTile<kD> && k0 + j <= t && valid; ++j) {
      const float p = expf(dot<kD>(q, ks[j], d.D) - lse_t);
      const float ds = p * (dot<kD>(go, vs[j], d.D) - delta_t);
#pragma unroll
      for (int c = 0; c < kD; ++c) dq[c] += ds * ks[j][c];
    }
  }
  if (!valid) return;
  float* o = dqkv + b * d.T * d.ld() + t * d.ld() + h * d.D;
#pragma unroll
  for (int c = 0; c < kD; ++c)
    if (c < d.D) o[c] = dq[c] * d.scale;
}

// grid (ceil(T/kRows), KV, B): thread = key t of kv head g, summing over the group's query heads
// and the queries at or after t: dv = sum p dout, dk = scale * sum ds q.
template <int kD>
__global__ void dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                           const float* delta, Dims d) {
  __shared__ float qs[kTile<kD>][kD], gos[kTile<kD>][kD];
  __shared__ float lse_s[kTile<kD>], delta_s[kTile<kD>];
  const int64_t b = blockIdx.z, g = blockIdx.y, group = d.H / d.KV;
  const int64_t k0 = blockIdx.x * int64_t{kRows}, t = k0 + threadIdx.x;
  const float* base = qkv + b * d.T * d.ld();
  const bool valid = t < d.T;
  float k[kD], v[kD], dk[kD], dv[kD];
#pragma unroll
  for (int c = 0; c < kD; ++c) {
    const bool in = c < d.D && valid;
    k[c] = in ? base[t * d.ld() + (d.H + g) * d.D + c] : 0.0f;
    v[c] = in ? base[t * d.ld() + (d.H + d.KV + g) * d.D + c] : 0.0f;
    dk[c] = dv[c] = 0.0f;
  }
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = k0; i0 < d.T; i0 += kTile<kD>) {  // queries before k0 see no key here
      __syncthreads();
      stage<kD>(qs, base + h * d.D, d.ld(), i0, d);
      stage<kD>(gos, dout + (b * d.T * d.H + h) * d.D, d.H * d.D, i0, d);
      for (int64_t r = threadIdx.x; r < kTile<kD>; r += blockDim.x) {
        lse_s[r] = i0 + r < d.T ? lse[(b * d.H + h) * d.T + i0 + r] : 0.0f;
        delta_s[r] = i0 + r < d.T ? delta[(b * d.H + h) * d.T + i0 + r] : 0.0f;
      }
      __syncthreads();
      if (!valid) continue;
      for (int i = 0; i < kTile<kD> && i0 + i < d.T; ++i) {
        if (i0 + i < t) continue;  // causal: query i0 + i sees key t only when i0 + i >= t
        const float p = expf(dot<kD>(qs[i], k, d.D) * d.scale - lse_s[i]);
        const float ds = p * (dot<kD>(gos[i], v, d.D) - delta_s[i]);
#pragma unroll
        for (int c = 0; c < kD; ++c) {
          dv[c] += p * gos[i][c];
          dk[c] += ds * qs[i][c];
        }
      }
    }
  }
  if (!valid) return;
  float* o = dqkv + b * d.T * d.ld() + t * d.ld();
#pragma unroll
  for (int c = 0; c < kD; ++c)
    if (c < d.D) {
      o[(d.H + g) * d.D + c] = dk[c] * d.scale;
      o[(d.H + d.KV + g) * d.D + c] = dv[c];
    }
}

// Calls f with the smallest head-dim bound that holds D.
template <typename F>
void with_head_dim(int64_t D, F&& f) {
  LLMT_CHECK(D >= 1 && D <= 256, "attention: head dim ", D,
             " is not supported by the CUDA kernel (1..256)");
  if (D <= 64) return f(std::integral_constant<int, 64>{});
  if (D <= 128) return f(std::integral_constant<int, 128>{});
  f(std::integral_constant<int, 256>{});
}

Dims dims(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  return {B, T, H, KV, D, 1.0f / sqrtf(static_cast<float>(D))};
}

#ifdef LLMTRAIN_HAVE_CUDNN
// One device buffer for the cuDNN path's 16-bit copies and cuDNN's workspace.
void* scratch(size_t bytes) {
  static Scratch s;
  return s.reserve(bytes);
}

// Carves consecutive 256-byte aligned pieces out of the scratch buffer: sizes first, then bases.
struct Pieces {
  static size_t aligned(size_t n) { return (n + 255) / 256 * 256; }
  size_t total = 0;
  size_t add(size_t bytes) {
    const size_t at = total;
    total += aligned(bytes);
    return at;
  }
};

// cuDNN's Stats (our lse) is declared to the backend with the frontend's default 16-byte
// alignment (Tensor_attributes::default_alignment in cudnn_frontend/graph_properties.h, passed as
// the tensor's byte alignment in cudnn_interface.h), but execute() checks pointers only for Q, K,
// V, O, dO, dQ, dK, dV (collect_aligned_operands_node, node/scaled_dot_product_flash_attention.h),
// and the backend does not check what it was promised (node/sdpa_support_surface.h: a misaligned
// Q/K/V/O gives wrong output on sm90, a fault on sm80). ops.h tensors may be views at any 4-byte
// offset (the model's lse is 64-byte aligned), so an lse that is not 16-byte aligned goes through
// a scratch piece.
bool stats_aligned(const float* lse) {
  return reinterpret_cast<uintptr_t>(lse) % 16 == 0;
}
#endif

}  // namespace

std::string attention_path(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType operands) {
  if (operands == DType::f32) return "flash: operands f32";
#ifdef LLMTRAIN_HAVE_CUDNN
  const std::string why = cudnn_sdpa::unsupported({B, T, H, KV, D, operands});
  return why.empty() ? "cudnn" : "flash: " + why;
#else
  return "flash: this build has no cuDNN (cmake/cudnn.cmake)";
#endif
}

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType operands) {
  if (B * T == 0) return;
#ifdef LLMTRAIN_HAVE_CUDNN
  if (attention_path(B, T, H, KV, D, operands) == "cudnn") {
    const cudnn_sdpa::Shape s{B, T, H, KV, D, operands};
    const int64_t n_qkv = B * T * (H + 2 * KV) * D, n_o = B * T * H * D;
    const size_t es = dtype_size(operands);
    Pieces at;
    const size_t qkv16 = at.add(n_qkv * es), o16 = at.add(n_o * es);
    const size_t ws = at.add(cudnn_sdpa::workspace_bytes(s));
    const size_t lse_bytes = static_cast<size_t>(B * H * T) * sizeof(float);
    const bool direct = stats_aligned(lse);
    const size_t st = direct ? 0 : at.add(lse_bytes);
    char* base = static_cast<char*>(scratch(at.total));
    float* stats = direct ? lse : reinterpret_cast<float*>(base + st);
    convert(base + qkv16, operands, qkv, DType::f32, n_qkv);  // exact: values are operands'
    cudnn_sdpa::forward(base + o16, stats, base + qkv16, base + ws, s);
    convert(out, DType::f32, base + o16, operands, n_o);
    if (!direct)
      LLMT_CUDA_CHECK(cudaMemcpyAsync(lse, stats, lse_bytes, cudaMemcpyDeviceToDevice, stream()));
    return;
  }
#endif
  const Dims d = dims(B, T, H, KV, D);
  const dim3 grid(static_cast<unsigned>((T + kRows - 1) / kRows), static_cast<unsigned>(H),
                  static_cast<unsigned>(B));
  with_head_dim(D, [&](auto kd) {
    forward_kernel<kd.value><<<grid, kRows, 0, stream()>>>(out, lse, qkv, d);
    LLMT_CUDA_LAUNCHED();
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DType operands) {
  if (B * T == 0) return;
#ifdef LLMTRAIN_HAVE_CUDNN
  if (attention_path(B, T, H, KV, D, operands) == "cudnn") {  // as the forward decided
    const cudnn_sdpa::Shape s{B, T, H, KV, D, operands};
    const int64_t n_qkv = B * T * (H + 2 * KV) * D, n_o = B * T * H * D;
    const size_t es = dtype_size(operands);
    Pieces at;
    const size_t qkv16 = at.add(n_qkv * es), o16 = at.add(n_o * es), do16 = at.add(n_o * es);
    const size_t dqkv16 = at.add(n_qkv * es), ws = at.add(cudnn_sdpa::workspace_bytes(s));
    const size_t lse_bytes = static_cast<size_t>(B * H * T) * sizeof(float);
    const bool direct = stats_aligned(lse);
    const size_t st = direct ? 0 : at.add(lse_bytes);
    char* base = static_cast<char*>(scratch(at.total));
    const float* stats = lse;
    if (!direct) {
      LLMT_CUDA_CHECK(
          cudaMemcpyAsync(base + st, lse, lse_bytes, cudaMemcpyDeviceToDevice, stream()));
      stats = reinterpret_cast<const float*>(base + st);
    }
    convert(base + qkv16, operands, qkv, DType::f32, n_qkv);
    convert(base + o16, operands, out, DType::f32, n_o);
    convert(base + do16, operands, dout, DType::f32, n_o);
    cudnn_sdpa::backward(base + dqkv16, base + do16, base + qkv16, base + o16, stats, base + ws, s);
    convert(dqkv, DType::f32, base + dqkv16, operands, n_qkv);
    return;
  }
#endif
  const Dims d = dims(B, T, H, KV, D);
  float* delta = nullptr;  // (B,H,T), stream-ordered scratch
  LLMT_CUDA_CHECK(
      cudaMallocAsync(reinterpret_cast<void**>(&delta), B * H * T * sizeof(float), stream()));
  delta_kernel<<<static_cast<unsigned>(B * T * H), 64, 0, stream()>>>(delta, dout, out, d);
  LLMT_CUDA_LAUNCHED();
  const unsigned tiles = static_cast<unsigned>((T + kRows - 1) / kRows);
  with_head_dim(D, [&](auto kd) {
    dq_kernel<kd.value><<<dim3(tiles, H, B), kRows, 0, stream()>>>(dqkv, dout, qkv, lse, delta, d);
    LLMT_CUDA_LAUNCHED();
    dkv_kernel<kd.value>
        <<<dim3(tiles, KV, B), kRows, 0, stream()>>>(dqkv, dout, qkv, lse, delta, d);
    LLMT_CUDA_LAUNCHED();
  });
  LLMT_CUDA_CHECK(cudaFreeAsync(delta, stream()));
}

}  // namespace llmt::cuda
