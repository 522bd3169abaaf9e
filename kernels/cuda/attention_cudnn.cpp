// cuDNN fused attention (attention_cudnn.h) through the cuDNN frontend's graph API. One graph per
// (shape, dtype, direction), built on first use and kept for the process (building runs cuDNN's
// heuristics and compiles plans: far more work than a launch). q, k and v are strided views into
// the interleaved qkv buffer and dq, dk, dv into dqkv, so nothing is transposed. The backward asks
// for cuDNN's deterministic algorithm, as the flash kernel is deterministic (same-layout resume is
// meant to repeat bit for bit). Never run on a GPU (docs/gpu.md).
// Dims: B batch, T sequence, H query heads, KV kv heads, D head dim, L = (H+2KV)*D (a qkv row).
#define CUDNN_FRONTEND_SKIP_JSON_LIB  // no serialization needed: keeps nlohmann/json out
#include "kernels/cuda/attention_cudnn.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"

#define LLMT_CUDNN_CHECK(call) LLMT_STATUS_CHECK(call, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)

// The frontend's error_t: throws with its message.
#define LLMT_CUDNN_FE_CHECK(call)                                                                \
  do {                                                                                           \
    auto e_ = (call);                                                                            \
    if (e_.is_bad())                                                                             \
      throw ::llmt::Error(                                                                       \
          ::llmt::detail::concat(__FILE__, ":", __LINE__, ": ", #call, ": ", e_.get_message())); \
  } while (0)

namespace llmt::cuda::cudnn_sdpa {
namespace {

namespace fe = cudnn_frontend;
using Graph = std::shared_ptr<fe::graph::Graph>;

// Tensor ids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// The process's cuDNN handle on the compute stream (created on first use, like cuBLASLt's).
cudnnHandle_t handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t x = nullptr;
    LLMT_CUDNN_CHECK(cudnnCreate(&x));
    LLMT_CUDNN_CHECK(cudnnSetStream(x, static_cast<cudaStream_t>(cuda_compute_stream())));
    return x;
  }();
  return h;
}

Graph new_graph(const Shape& s) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s.operands == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// A head-major view (B, heads, T, D) of `heads` heads of a (B,T,.,D) buffer whose rows are
// `row` elements apart; the first head is chosen by the pointer in the variant pack.
fe::graph::Tensor_attributes view(const char* name, Uid uid, const Shape& s, int64_t heads,
                                  int64_t row) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({s.B, heads, s.T, s.D})
      .set_stride({s.T * row, s.D, row, 1});
}

// t as the saved log-sum-exp: (B,H,T,1) f32, laid out as ops.h's lse (B,H,T).
fe::graph::Tensor_attributes& as_lse(fe::graph::Tensor_attributes& t, const Shape& s) {
  return t.set_uid(kStats)
      .set_dim({s.B, s.H, s.T, 1})
      .set_stride({s.H * s.T, s.T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

float scale_of(const Shape& s) {
  return s.scale > 0.0f ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.D));
}

Graph forward_graph(const Shape& s) {
  Graph g = new_graph(s);
  const int64_t L = (s.H + 2 * s.KV) * s.D;
  auto q = g->tensor(view("Q", kQ, s, s.H, L));
  auto k = g->tensor(view("K", kK, s, s.KV, L));
  auto v = g->tensor(view("V", kV, s, s.KV, L));
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("sdpa")
                  .set_generate_stats(true)
                  .set_attn_scale(scale_of(s))
                  .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                  .set_diagonal_band_right_bound(0);  // causal: key j <= query i
  auto [o, stats] = g->sdpa(q, k, v, opts);
  o->set_output(true)
      .set_uid(kO)
      .set_dim({s.B, s.H, s.T, s.D})
      .set_stride({s.T * s.H * s.D, s.D, s.H * s.D, 1});
  as_lse(stats->set_output(true), s);
  return g;
}

Graph backward_graph(const Shape& s) {
  Graph g = new_graph(s);
  const int64_t L = (s.H + 2 * s.KV) * s.D, HD = s.H * s.D;
  auto q = g->tensor(view("Q", kQ, s, s.H, L));
  auto k = g->tensor(view("K", kK, s, s.KV, L));
  auto v = g->tensor(view("V", kV, s, s.KV, L));
  auto o = g->tensor(view("O", kO, s, s.H, HD));
  auto dout = g->tensor(view("dO", kDO, s, s.H, HD));
  fe::graph::Tensor_attributes lse;
  auto stats = g->tensor(as_lse(lse.set_name("Stats"), s));
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("sdpa_backward")
                  .set_attn_scale(scale_of(s))
                  .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                  .set_diagonal_band_right_bound(0)
                  .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
  dq->set_output(true).set_uid(kDQ).set_dim({s.B, s.H, s.T, s.D}).set_stride({s.T * L, s.D, L, 1});
  dk->set_output(true).set_uid(kDK).set_dim({s.B, s.KV, s.T, s.D}).set_stride({s.T * L, s.D, L, 1});
  dv->set_output(true).set_uid(kDV).set_dim({s.B, s.KV, s.T, s.D}).set_stride({s.T * L, s.D, L, 1});
  return g;
}

// Builds g (validation, heuristics, plans); "" or cuDNN's reason for refusing it. A cuDNN that
// cannot start (no handle: a library piece missing at run time) refuses too, so training falls
// back to the flash kernel rather than stopping.
std::string build(const Graph& g) {
  try {
    auto e = g->build(handle(), {fe::HeurMode_t::A});
    return e.is_good() ? std::string() : e.get_message();
  } catch (const Error& e) {
    return e.what();
  }
}

struct Entry {
  Graph fwd, bwd;       // both built, or both null
  std::string refused;  // why not, when null
  size_t workspace = 0;
};

// The graphs of a shape, built on first use. Built together, so that forward and backward agree
// on the path: a shape runs on cuDNN only when both directions do.
const Entry& entry(const Shape& s) {
  static std::map<std::array<int64_t, 7>, Entry> cache;
  const std::array<int64_t, 7> key{s.B,
                                   s.T,
                                   s.H,
                                   s.KV,
                                   s.D,
                                   static_cast<int64_t>(s.operands),
                                   std::bit_cast<int32_t>(scale_of(s))};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Entry e;
  // cuDNN's documented limits for 16-bit SDPA (checked here first: no graph is built for them):
  // head dim a multiple of 8 up to 256; q heads a multiple of kv heads (GQA/MQA).
  if (s.operands != DType::bf16 && s.operands != DType::f16)
    e.refused = detail::concat("operands ", dtype_name(s.operands), " (cuDNN SDPA: bf16 or f16)");
  else if (s.D % 8 != 0 || s.D > 256)
    e.refused = detail::concat("head dim ", s.D, " (cuDNN SDPA: a multiple of 8, at most 256)");
  else if (s.H % s.KV != 0)
    e.refused = detail::concat("n_head ", s.H, " not a multiple of n_kv_head ", s.KV);
  if (e.refused.empty()) {
    Graph fwd = forward_graph(s), bwd = backward_graph(s);
    std::string why = build(fwd);
    if (why.empty()) {
      why = build(bwd);
      if (!why.empty()) why = "backward: " + why;
    } else {
      why = "forward: " + why;
    }
    if (why.empty()) {
      int64_t wf = 0, wb = 0;
      LLMT_CUDNN_FE_CHECK(fwd->get_workspace_size(wf));
      LLMT_CUDNN_FE_CHECK(bwd->get_workspace_size(wb));
      e.fwd = fwd;
      e.bwd = bwd;
      e.workspace = static_cast<size_t>(std::max(wf, wb));
    } else {
      e.refused = "cuDNN refused the graph (" + why + ")";
    }
  }
  return cache.emplace(key, std::move(e)).first->second;
}

const Entry& supported_entry(const Shape& s) {
  const Entry& e = entry(s);
  LLMT_CHECK(e.fwd != nullptr, "cuDNN attention called for an unsupported shape: ", e.refused);
  return e;
}

void* mut(const void* p) {  // the variant pack takes void* for inputs too
  return const_cast<void*>(p);
}

}  // namespace

std::string unsupported(const Shape& s) {
  return entry(s).refused;
}

size_t workspace_bytes(const Shape& s) {
  return supported_entry(s).workspace;
}

void forward(void* o, float* lse, const void* qkv, void* workspace, const Shape& s) {
  const Entry& e = supported_entry(s);
  const size_t es = dtype_size(s.operands);
  const char* base = static_cast<const char*>(qkv);
  std::unordered_map<int64_t, void*> pack{{kQ, mut(base)},
                                          {kK, mut(base + s.H * s.D * es)},
                                          {kV, mut(base + (s.H + s.KV) * s.D * es)},
                                          {kO, o},
                                          {kStats, lse}};
  LLMT_CUDNN_FE_CHECK(e.fwd->execute(handle(), pack, workspace));
}

void backward(void* dqkv, const void* dout, const void* qkv, const void* o, const float* lse,
              void* workspace, const Shape& s) {
  const Entry& e = supported_entry(s);
  const size_t es = dtype_size(s.operands);
  const char* base = static_cast<const char*>(qkv);
  char* dbase = static_cast<char*>(dqkv);
  const size_t k_off = s.H * s.D * es, v_off = (s.H + s.KV) * s.D * es;
  std::unordered_map<int64_t, void*> pack{
      {kQ, mut(base)}, {kK, mut(base + k_off)}, {kV, mut(base + v_off)},
      {kO, mut(o)},    {kDO, mut(dout)},        {kStats, mut(lse)},
      {kDQ, dbase},    {kDK, dbase + k_off},    {kDV, dbase + v_off}};
  LLMT_CUDNN_FE_CHECK(e.bwd->execute(handle(), pack, workspace));
}

}  // namespace llmt::cuda::cudnn_sdpa
