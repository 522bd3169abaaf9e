// Causal grouped-query attention, flash-attention style: K/V (forward, dq) or Q/dO (dk, dv)
// tiles staged in shared memory, one thread per query (or key) row holding its head vectors in
// registers, an online softmax in the forward, and a backward that recomputes every probability
// from q, k and the saved log-sum-exp, so no (T,T) matrix ever exists. The head dim is a template
// bound (64, 128, 256); D <= 256. Straightforward CUDA cores, no tensor cores: this is the
// always-available path (docs/gpu.md), not a tuned one.
// Layouts (kernels/ops.h): qkv (B,T,H+2KV,D), out and dout (B,T,H,D), lse (B,H,T). The kernels
// take q, k and v as strided views (Args), so context parallelism's blocks (attention_block_*:
// queries of one tensor against K/V of another, masked by global position, accumulating their
// gradients) are the same kernels; attention_merge and copy_heads are elementwise.
// With 16-bit operands and a shape cuDNN supports, the entry points below hand the call to cuDNN's
// fused attention instead (attention_cudnn.h): qkv (and out, dout) converted to the 16-bit type in
// a reused device scratch buffer, cuDNN's results converted back to fp32.
#include <cstdint>
#include <string>

#include "kernels/attention_args.h"
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

// One call: the operands (kernels/attention_args.h, the scale among them), the outputs or
// gradients.
struct Args : AttnOperands, AttnGradViews {
  float *out = nullptr, *lse = nullptr;                             // forward: (B,Tq,H,D), (B,H,Tq)
  const float *dout = nullptr, *out_c = nullptr, *lse_c = nullptr;  // backward: the final output's
  const float* delta = nullptr;                                     // backward: (B,H,Tq)
  __device__ bool visible(int64_t i, int64_t j) const {
    return q_pos ? k_pos[j] <= q_pos[i] : j <= i;
  }
};

Args make_args(const AttnOperands& in, float scale, const AttnGradViews& grads = {}) {
  Args a;
  static_cast<AttnOperands&>(a) = in;
  static_cast<AttnGradViews&>(a) = grads;
  a.scale = scale;
  return a;
}

// Loads rows [r0, r0 + kTile<kD>) of a source whose rows are ld floats apart into shared memory,
// zeros at rows >= T and in the columns [D, kD) (so full-width loops add only zeros).
template <int kD>
__device__ void stage(float (*dst)[kD], const float* src, int64_t ld, int64_t r0, int64_t T,
                      int64_t D) {
  for (int e = threadIdx.x; e < kTile<kD> * kD; e += blockDim.x) {
    const int r = e / kD, c = e % kD;
    dst[r][c] = r0 + r < T && c < D ? src[(r0 + r) * ld + c] : 0.0f;
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

// grid (ceil(Tq/kRows), H, B): thread = query t of head h. Without positions the block stops at
// its last query's key; with them it visits every key tile and masks.
template <int kD>
__global__ void forward_kernel(Args a) {
  __shared__ float ks[kTile<kD>][kD], vs[kTile<kD>][kD];
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (a.H / a.KV);
  const int64_t q0 = blockIdx.x * int64_t{kRows}, t = q0 + threadIdx.x;
  const bool valid = t < a.Tq;
  const float* kb = a.k + b * a.kv_bs + g * a.D;
  const float* vb = a.v + b * a.kv_bs + g * a.D;
  float q[kD], acc[kD];
#pragma unroll
  for (int c = 0; c < kD; ++c) {
    q[c] = c < a.D && valid ? a.q[b * a.q_bs + t * a.q_ld + h * a.D + c] * a.scale : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t causal_end = a.Tk < q0 + kRows ? a.Tk : q0 + kRows;
  const int64_t last = a.q_pos ? a.Tk : causal_end;  // keys this block visits: [0, last)
  for (int64_t k0 = 0; k0 < last; k0 += kTile<kD>) {
    __syncthreads();
    stage<kD>(ks, kb, a.kv_ld, k0, a.Tk, a.D);
    stage<kD>(vs, vb, a.kv_ld, k0, a.Tk, a.D);
    __syncthreads();
    for (int j = 0; j < kTile<kD> && k0 + j < a.Tk && valid; ++j) {
      if (!a.visible(t, k0 + j)) continue;
      const float s = dot<kD>(q, ks[j], a.D);
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
  if (!valid) return;
  // A query that sees no key: output 0, lse -inf.
  float* o = a.out + ((b * a.Tq + t) * a.H + h) * a.D;
#pragma unroll
  for (int c = 0; c < kD; ++c)
    if (c < a.D) o[c] = l > 0.0f ? acc[c] / l : 0.0f;
  a.lse[(b * a.H + h) * a.Tq + t] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// delta (B,H,Tq) = rowsum(dout * out): the softmax backward's per-row term.
__global__ void delta_kernel(Args a) {
  const int64_t row = blockIdx.x;  // (b, t, h)
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < a.D; c += blockDim.x)
    s += a.dout[row * a.D + c] * a.out_c[row * a.D + c];
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t h = row % a.H, bt = row / a.H, b = bt / a.Tq, t = bt % a.Tq;
    const_cast<float*>(a.delta)[(b * a.H + h) * a.Tq + t] = s;
  }
}

// grid (ceil(Tq/kRows), H, B): thread = query t of head h; dq = scale * sum_j ds_j k_j with
// p = exp(q.k scale - lse), ds = p (dout.v - delta).
template <int kD>
__global__ void dq_kernel(Args a) {
  __shared__ float ks[kTile<kD>][kD], vs[kTile<kD>][kD];
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (a.H / a.KV);
  const int64_t q0 = blockIdx.x * int64_t{kRows}, t = q0 + threadIdx.x;
  const bool valid = t < a.Tq;
  const float* kb = a.k + b * a.kv_bs + g * a.D;
  const float* vb = a.v + b * a.kv_bs + g * a.D;
  float q[kD], dq[kD], go[kD];
#pragma unroll
  for (int c = 0; c < kD; ++c) {
    const bool in = c < a.D && valid;
    q[c] = in ? a.q[b * a.q_bs + t * a.q_ld + h * a.D + c] * a.scale : 0.0f;
    go[c] = in ? a.dout[((b * a.Tq + t) * a.H + h) * a.D + c] : 0.0f;
    dq[c] = 0.0f;
  }
  const float lse_t = valid ? a.lse_c[(b * a.H + h) * a.Tq + t] : 0.0f;
  const float delta_t = valid ? a.delta[(b * a.H + h) * a.Tq + t] : 0.0f;
  const int64_t causal_end = a.Tk < q0 + kRows ? a.Tk : q0 + kRows;
  const int64_t last = a.q_pos ? a.Tk : causal_end;
  for (int64_t k0 = 0; k0 < last; k0 += kTile<kD>) {
    __syncthreads();
    stage<kD>(ks, kb, a.kv_ld, k0, a.Tk, a.D);
    stage<kD>(vs, vb, a.kv_ld, k0, a.Tk, a.D);
    __syncthreads();
    for (int j = 0; j < kTile<kD> && k0 + j < a.Tk && valid; ++j) {
      if (!a.visible(t, k0 + j)) continue;
      const float p = expf(dot<kD>(q, ks[j], a.D) - lse_t);
      const float ds = p * (dot<kD>(go, vs[j], a.D) - delta_t);
#pragma unroll
      for (int c = 0; c < kD; ++c) dq[c] += ds * ks[j][c];
    }
  }
  if (!valid) return;
  float* o = a.dq + b * a.dq_bs + t * a.dq_ld + h * a.D;
#pragma unroll
  for (int c = 0; c < kD; ++c)
    if (c < a.D) o[c] = (a.accumulate ? o[c] : 0.0f) + dq[c] * a.scale;
}

// grid (ceil(Tk/kRows), KV, B): thread = key t of kv head g, summing over the group's query heads
// and the queries that see it: dv = sum p dout, dk = scale * sum ds q.
template <int kD>
__global__ void dkv_kernel(Args a) {
  __shared__ float qs[kTile<kD>][kD], gos[kTile<kD>][kD];
  __shared__ float lse_s[kTile<kD>], delta_s[kTile<kD>];
  const int64_t b = blockIdx.z, g = blockIdx.y, group = a.H / a.KV;
  const int64_t k0 = blockIdx.x * int64_t{kRows}, t = k0 + threadIdx.x;
  const bool valid = t < a.Tk;
  float k[kD], v[kD], dk[kD], dv[kD];
#pragma unroll
  for (int c = 0; c < kD; ++c) {
    const bool in = c < a.D && valid;
    k[c] = in ? a.k[b * a.kv_bs + t * a.kv_ld + g * a.D + c] : 0.0f;
    v[c] = in ? a.v[b * a.kv_bs + t * a.kv_ld + g * a.D + c] : 0.0f;
    dk[c] = dv[c] = 0.0f;
  }
  // Without positions, queries before k0 see no key here.
  const int64_t first = a.q_pos ? 0 : k0;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = first; i0 < a.Tq; i0 += kTile<kD>) {
      __syncthreads();
      stage<kD>(qs, a.q + b * a.q_bs + h * a.D, a.q_ld, i0, a.Tq, a.D);
      stage<kD>(gos, a.dout + (b * a.Tq * a.H + h) * a.D, a.H * a.D, i0, a.Tq, a.D);
      for (int64_t r = threadIdx.x; r < kTile<kD>; r += blockDim.x) {
        lse_s[r] = i0 + r < a.Tq ? a.lse_c[(b * a.H + h) * a.Tq + i0 + r] : 0.0f;
        delta_s[r] = i0 + r < a.Tq ? a.delta[(b * a.H + h) * a.Tq + i0 + r] : 0.0f;
      }
      __syncthreads();
      if (!valid) continue;
      for (int i = 0; i < kTile<kD> && i0 + i < a.Tq; ++i) {
        if (!a.visible(i0 + i, t)) continue;
        const float p = expf(dot<kD>(qs[i], k, a.D) * a.scale - lse_s[i]);
        const float ds = p * (dot<kD>(gos[i], v, a.D) - delta_s[i]);
#pragma unroll
        for (int c = 0; c < kD; ++c) {
          dv[c] += p * gos[i][c];
          dk[c] += ds * qs[i][c];
        }
      }
    }
  }
  if (!valid) return;
  float* ok = a.dk + b * a.dkv_bs + t * a.dkv_ld + g * a.D;
  float* ov = a.dv + b * a.dkv_bs + t * a.dkv_ld + g * a.D;
#pragma unroll
  for (int c = 0; c < kD; ++c)
    if (c < a.D) {
      ok[c] = (a.accumulate ? ok[c] : 0.0f) + dk[c] * a.scale;
      ov[c] = (a.accumulate ? ov[c] : 0.0f) + dv[c];
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

void run_forward(const Args& a) {
  const dim3 grid(static_cast<unsigned>((a.Tq + kRows - 1) / kRows), static_cast<unsigned>(a.H),
                  static_cast<unsigned>(a.B));
  with_head_dim(a.D, [&](auto kd) {
    forward_kernel<kd.value><<<grid, kRows, 0, stream()>>>(a);
    LLMT_CUDA_LAUNCHED();
  });
}

// a.dq/dk/dv set; computes delta in stream-ordered scratch.
void run_backward(Args a) {
  float* delta = nullptr;  // (B,H,Tq)
  LLMT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&delta),
                                  a.B * a.H * a.Tq * sizeof(float), stream()));
  a.delta = delta;
  delta_kernel<<<static_cast<unsigned>(a.B * a.Tq * a.H), 64, 0, stream()>>>(a);
  LLMT_CUDA_LAUNCHED();
  const unsigned q_tiles = static_cast<unsigned>((a.Tq + kRows - 1) / kRows);
  const unsigned k_tiles = static_cast<unsigned>((a.Tk + kRows - 1) / kRows);
  with_head_dim(a.D, [&](auto kd) {
    dq_kernel<kd.value><<<dim3(q_tiles, a.H, a.B), kRows, 0, stream()>>>(a);
    LLMT_CUDA_LAUNCHED();
    dkv_kernel<kd.value><<<dim3(k_tiles, a.KV, a.B), kRows, 0, stream()>>>(a);
    LLMT_CUDA_LAUNCHED();
  });
  LLMT_CUDA_CHECK(cudaFreeAsync(delta, stream()));
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
                       int64_t KV, int64_t D, DType operands, float scale) {
  if (B * T == 0) return;
#ifdef LLMTRAIN_HAVE_CUDNN
  if (attention_path(B, T, H, KV, D, operands) == "cudnn") {
    const cudnn_sdpa::Shape s{B, T, H, KV, D, operands, scale};
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
  Args a = make_args(qkv_operands(qkv, B, T, H, KV, D), scale);
  a.out = out;
  a.lse = lse;
  run_forward(a);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DType operands, float scale) {
  if (B * T == 0) return;
#ifdef LLMTRAIN_HAVE_CUDNN
  if (attention_path(B, T, H, KV, D, operands) == "cudnn") {  // as the forward decided
    const cudnn_sdpa::Shape s{B, T, H, KV, D, operands, scale};
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
  Args a = make_args(qkv_operands(qkv, B, T, H, KV, D), scale, qkv_grads(dqkv, T, H, KV, D));
  a.dout = dout;
  a.out_c = out;
  a.lse_c = lse;
  run_backward(a);
}

// ---- the block entry points (context parallelism): always the flash kernel ---------------------

void attention_block_forward(float* out, float* lse, const float* q_src, int64_t Wq,
                             const float* kv_src, int64_t Wk, int64_t kv0, const int32_t* q_pos,
                             const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                             int64_t KV, int64_t D, float scale) {
  if (B * Tq == 0) return;
  Args a = make_args(block_operands(q_src, Wq, kv_src, Wk, kv0, q_pos, k_pos, B, Tq, Tk, H, KV, D),
                     scale);
  a.out = out;
  a.lse = lse;
  run_forward(a);
}

void attention_block_backward(float* dq_src, float* dkv_src, const float* dout, const float* q_src,
                              int64_t Wq, const float* kv_src, int64_t Wk, int64_t kv0,
                              const float* out, const float* lse, const int32_t* q_pos,
                              const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                              int64_t KV, int64_t D, float scale) {
  if (B * Tq == 0) return;
  const AttnOperands in =
      block_operands(q_src, Wq, kv_src, Wk, kv0, q_pos, k_pos, B, Tq, Tk, H, KV, D);
  Args a = make_args(in, scale, block_grads(dq_src, dkv_src, kv0, in));
  a.dout = dout;
  a.out_c = out;
  a.lse_c = lse;
  run_backward(a);
}

void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse,
                     int64_t B, int64_t T, int64_t H, int64_t D) {
  // One thread per (b, h, t) row; the row's D outputs in a loop.
  for_each(B * H * T, [=] __device__(int64_t r) {
    const float a = lse[r], p = part_lse[r];
    const float mx = fmaxf(a, p);
    if (mx == -INFINITY) return;
    const float wa = expf(a - mx), wp = expf(p - mx), sum = wa + wp;
    lse[r] = mx + logf(sum);
    const float ca = wa / sum, cp = wp / sum;
    const int64_t b = r / (H * T), h = r / T % H, t = r % T;
    float* o = out + ((b * T + t) * H + h) * D;
    const float* po = part_out + ((b * T + t) * H + h) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = ca * o[d] + cp * po[d];
  });
}

void copy_heads(float* dst, int64_t Wd, int64_t dst_head, const float* src, int64_t Ws,
                int64_t src_head, int64_t n, int64_t N, int64_t D) {
  const int64_t w = n * D;
  for_each(N * w, [=] __device__(int64_t i) {
    const int64_t r = i / w, e = i % w;
    dst[(r * Wd + dst_head) * D + e] = src[(r * Ws + src_head) * D + e];
  });
}

void copy_blocks(float* dst, int64_t Wd, const float* src, int64_t Ws, int64_t rows, int64_t n,
                 int64_t w, int64_t d0, int64_t ds, int64_t s0, int64_t ss, bool add) {
  // One thread per (row, element of a block), over the blocks in order: a sum into one block
  // (ds = 0) adds in the CPU's order.
  for_each(rows * w, [=] __device__(int64_t k) {
    const int64_t r = k / w, i = k % w;
    for (int64_t j = 0; j < n; ++j) {
      float& d = dst[r * Wd + d0 + j * ds + i];
      const float v = src[r * Ws + s0 + j * ss + i];
      d = add ? d + v : v;
    }
  });
}

}  // namespace llmt::cuda
