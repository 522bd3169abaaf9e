// The op-case table (op_cases.h). Shapes are chosen to cross the CUDA kernels' block and tile
// boundaries (rows longer than a block, T not a multiple of the attention tile, head dims at and
// between the kernel's bounds), and outputs are seeded so that assigning and accumulating differ.
#include "tests/unit/ops/op_cases.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>
#include <utility>

#include "kernels/ops.h"

namespace llmt::test {
namespace {

using Views = std::vector<Tensor>;
using Call = std::function<std::vector<double>(const Views&)>;

// A call with no scalar results.
template <typename F>
Call op(F f) {
  return [f](const Views& v) {
    f(v);
    return std::vector<double>{};
  };
}

constexpr Tol kExact{0.0, 0.0};
constexpr Tol kTight{1e-5, 1e-6};    // elementwise maps: libm vs CUDA math, a few ulp
constexpr Tol kReduced{1e-4, 1e-5};  // reductions and GEMMs summed in another order

HostTensor with_ignored(HostTensor targets, int every) {  // targets with every k-th one -1
  for (int64_t i = 0; i < targets.numel(); i += every) targets.i32()[i] = -1;
  return targets;
}

void add_embedding(std::vector<OpCase>& cases) {
  cases.push_back({"embedding_forward",
                   "embedding_forward_wpe",
                   {uniform({2, 37, 48}, 1), tokens({2, 37}, 100, 2), uniform({100, 48}, 3),
                    uniform({50, 48}, 4)},
                   op([](const Views& v) { ops::embedding_forward(v[0], v[1], v[2], v[3], 5); }),
                   kExact});
  // Rows at explicit positions (context parallelism), out of order.
  HostTensor pos({37}, DType::i32);
  for (int32_t i = 0; i < 37; ++i) pos.i32()[i] = (i * 7) % 50;
  cases.push_back(
      {"embedding_forward",
       "embedding_forward_positions",
       {uniform({2, 37, 48}, 1), tokens({2, 37}, 100, 2), uniform({100, 48}, 3),
        uniform({50, 48}, 4), pos},
       op([](const Views& v) { ops::embedding_forward(v[0], v[1], v[2], v[3], 0, 0, 0, v[4]); }),
       kExact});
  cases.push_back(
      {"embedding_backward",
       "embedding_backward_positions",
       {uniform({20, 48}, 5), uniform({50, 48}, 6), uniform({2, 37, 48}, 7), tokens({2, 37}, 20, 8),
        pos},
       op([](const Views& v) { ops::embedding_backward(v[0], v[1], v[2], v[3], 0, 0, 0, v[4]); }),
       kTight});
  cases.push_back(
      {"embedding_forward",
       "embedding_forward_vocab_shard",
       {uniform({2, 37, 48}, 1), tokens({2, 37}, 100, 2), uniform({30, 48}, 3)},
       op([](const Views& v) { ops::embedding_forward(v[0], v[1], v[2], Tensor(), 0, 40, 100); }),
       kExact});
  // 20 token ids over 74 positions: rows repeat, so the scatter-add collides.
  cases.push_back({"embedding_backward",
                   "embedding_backward_wpe",
                   {uniform({20, 48}, 5), uniform({50, 48}, 6), uniform({2, 37, 48}, 7),
                    tokens({2, 37}, 20, 8)},
                   op([](const Views& v) { ops::embedding_backward(v[0], v[1], v[2], v[3], 3); }),
                   kTight});
  cases.push_back(
      {"embedding_backward",
       "embedding_backward_vocab_shard",
       {uniform({8, 48}, 5), HostTensor(), uniform({2, 37, 48}, 7), tokens({2, 37}, 20, 8)},
       op([](const Views& v) { ops::embedding_backward(v[0], Tensor(), v[2], v[3], 0, 6, 20); }),
       kTight});
}

void add_norms(std::vector<OpCase>& cases) {
  constexpr float kEps = 1e-5f;
  struct Shape2 {
    int64_t N, C;
  };
  // 700 and 2000 rows: the CUDA column sums of the weight gradients in 3 and 8 row chunks.
  for (const auto [N, C] : {Shape2{15, 100}, Shape2{33, 1030}, Shape2{700, 96}, Shape2{2000, 40}}) {
    const std::string dims = "_N" + std::to_string(N) + "_C" + std::to_string(C);
    HostTensor inp = uniform({N, C}, 1, -2.0f, 3.0f), weight = uniform({C}, 2, 0.5f, 1.5f);
    HostTensor bias = uniform({C}, 3), mean({N}), rstd({N}), out({N, C});
    ops::layernorm_forward(out.t(), mean.t(), rstd.t(), inp.t(), weight.t(), bias.t(), kEps);
    cases.push_back({"layernorm_forward",
                     "layernorm_forward" + dims,
                     {uniform({N, C}, 4), uniform({N}, 5), uniform({N}, 6), inp, weight, bias},
                     op([](const Views& v) {
                       ops::layernorm_forward(v[0], v[1], v[2], v[3], v[4], v[5], kEps);
                     }),
                     kReduced});
    cases.push_back({"layernorm_backward",
                     "layernorm_backward" + dims,
                     {uniform({N, C}, 7), uniform({C}, 8), uniform({C}, 9), uniform({N, C}, 10),
                      inp, weight, mean, rstd},
                     op([](const Views& v) {
                       ops::layernorm_backward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
                     }),
                     kReduced});
    cases.push_back({"layernorm_backward",
                     "layernorm_backward_nobias" + dims,
                     {uniform({N, C}, 7), uniform({C}, 8), HostTensor(), uniform({N, C}, 10), inp,
                      weight, mean, rstd},
                     op([](const Views& v) {
                       ops::layernorm_backward(v[0], v[1], Tensor(), v[3], v[4], v[5], v[6], v[7]);
                     }),
                     kReduced});
    ops::rmsnorm_forward(out.t(), rstd.t(), inp.t(), weight.t(), kEps);
    cases.push_back({"rmsnorm_forward",
                     "rmsnorm_forward" + dims,
                     {uniform({N, C}, 4), uniform({N}, 6), inp, weight},
                     op([](const Views& v) { ops::rmsnorm_forward(v[0], v[1], v[2], v[3], kEps); }),
                     kReduced});
    cases.push_back(
        {"rmsnorm_backward",
         "rmsnorm_backward" + dims,
         {uniform({N, C}, 7), uniform({C}, 8), uniform({N, C}, 10), inp, weight, rstd},
         op([](const Views& v) { ops::rmsnorm_backward(v[0], v[1], v[2], v[3], v[4], v[5]); }),
         kReduced});
  }
}

void add_linear(std::vector<OpCase>& cases) {
  const int64_t N = 257, IC = 96, OC = 130;
  cases.push_back(
      {"linear_forward",
       "linear_forward_bias",
       {uniform({N, OC}, 1), uniform({N, IC}, 2), uniform({OC, IC}, 3), uniform({OC}, 4)},
       op([](const Views& v) { ops::linear_forward(v[0], v[1], v[2], v[3]); }),
       kReduced});
  cases.push_back({"linear_forward",
                   "linear_forward_nobias_3d",
                   {uniform({3, 5, 33}, 1), uniform({3, 5, 64}, 2), uniform({33, 64}, 3)},
                   op([](const Views& v) { ops::linear_forward(v[0], v[1], v[2], Tensor()); }),
                   kReduced});
  cases.push_back(
      {"linear_backward",
       "linear_backward_all",
       {uniform({N, IC}, 5), uniform({OC, IC}, 6), uniform({OC}, 7), uniform({N, OC}, 8),
        uniform({N, IC}, 2), uniform({OC, IC}, 3)},
       op([](const Views& v) { ops::linear_backward(v[0], v[1], v[2], v[3], v[4], v[5]); }),
       kReduced});
  cases.push_back(
      {"linear_backward",
       "linear_backward_weight_only",
       {HostTensor(), uniform({OC, IC}, 6), HostTensor(), uniform({N, OC}, 8), uniform({N, IC}, 2),
        uniform({OC, IC}, 3)},
       op([](const Views& v) { ops::linear_backward(Tensor(), v[1], Tensor(), v[3], v[4], v[5]); }),
       kReduced});
  // The input-gradient half of ZB-H1's split backward: no weight gradient.
  cases.push_back(
      {"linear_backward",
       "linear_backward_input_only",
       {uniform({N, IC}, 5), HostTensor(), uniform({OC}, 7), uniform({N, OC}, 8),
        uniform({N, IC}, 2), uniform({OC, IC}, 3)},
       op([](const Views& v) { ops::linear_backward(v[0], Tensor(), v[2], v[3], v[4], v[5]); }),
       kReduced});
  // 16-bit operands (CUDA: tensor-core GEMMs on bf16/f16 copies) on inputs representable in that
  // type, as the model passes them. Each product of two such values is exact in fp32 and the
  // accumulation is fp32, so CUDA and CPU differ only in the order of summation, as for the fp32
  // GEMMs above: the same tolerance. Leading dims of 33 and 130 halves are not multiples of 16
  // bytes (the tensor cores' preferred alignment), 96 and 64 are.
  for (const DType t : {DType::bf16, DType::f16}) {
    const std::string ty = t == DType::bf16 ? "_bf16_operands" : "_f16_operands";
    auto in = [t](HostTensor x) {  // x's values rounded to t
      ops::round_to(x.t(), t);
      return x;
    };
    cases.push_back(
        {"linear_forward",
         "linear_forward_bias" + ty,
         {uniform({N, OC}, 1), in(uniform({N, IC}, 2)), in(uniform({OC, IC}, 3)), uniform({OC}, 4)},
         op([t](const Views& v) { ops::linear_forward(v[0], v[1], v[2], v[3], t); }),
         kReduced});
    cases.push_back(
        {"linear_forward",
         "linear_forward_nobias_3d" + ty,
         {uniform({3, 5, 33}, 1), in(uniform({3, 5, 64}, 2)), in(uniform({33, 64}, 3))},
         op([t](const Views& v) { ops::linear_forward(v[0], v[1], v[2], Tensor(), t); }),
         kReduced});
    cases.push_back(
        {"linear_backward",
         "linear_backward_all" + ty,
         {uniform({N, IC}, 5), uniform({OC, IC}, 6), uniform({OC}, 7), in(uniform({N, OC}, 8)),
          in(uniform({N, IC}, 2)), in(uniform({OC, IC}, 3))},
         op([t](const Views& v) { ops::linear_backward(v[0], v[1], v[2], v[3], v[4], v[5], t); }),
         kReduced});
    cases.push_back({"linear_backward",
                     "linear_backward_weight_only" + ty,
                     {HostTensor(), uniform({OC, IC}, 6), HostTensor(), in(uniform({N, OC}, 8)),
                      in(uniform({N, IC}, 2)), in(uniform({OC, IC}, 3))},
                     op([t](const Views& v) {
                       ops::linear_backward(Tensor(), v[1], Tensor(), v[3], v[4], v[5], t);
                     }),
                     kReduced});
  }
}

void add_activations(std::vector<OpCase>& cases) {
  cases.push_back({"gelu_forward",
                   "gelu_forward",
                   {uniform({3, 1000}, 1), uniform({3, 1000}, 2, -5.0f, 5.0f)},
                   op([](const Views& v) { ops::gelu_forward(v[0], v[1]); }),
                   kTight});
  cases.push_back(
      {"gelu_backward",
       "gelu_backward",
       {uniform({3, 1000}, 1), uniform({3, 1000}, 3), uniform({3, 1000}, 2, -5.0f, 5.0f)},
       op([](const Views& v) { ops::gelu_backward(v[0], v[1], v[2]); }),
       kTight});
  cases.push_back({"swiglu_forward",
                   "swiglu_forward",
                   {uniform({7, 50}, 1), uniform({7, 100}, 2, -4.0f, 4.0f)},
                   op([](const Views& v) { ops::swiglu_forward(v[0], v[1]); }),
                   kTight});
  cases.push_back({"swiglu_backward",
                   "swiglu_backward",
                   {uniform({7, 100}, 1), uniform({7, 50}, 3), uniform({7, 100}, 2, -4.0f, 4.0f)},
                   op([](const Views& v) { ops::swiglu_backward(v[0], v[1], v[2]); }),
                   kTight});
}

void add_rope(std::vector<OpCase>& cases) {
  cases.push_back({"rope_forward",
                   "rope_forward",
                   {uniform({2, 9, 5, 16}, 1)},
                   op([](const Views& v) { ops::rope_forward(v[0], 3, 11, 10000.0f); }),
                   kTight});
  cases.push_back({"rope_backward",
                   "rope_backward",
                   {uniform({2, 9, 5, 16}, 1)},
                   op([](const Views& v) { ops::rope_backward(v[0], 3, 11, 10000.0f); }),
                   kTight});
  // At context parallelism's global positions: rank 1 of cp 2 over T 36 (9 local rows).
  HostTensor pos({9}, DType::i32);
  for (int32_t i = 0; i < 9; ++i) pos.i32()[i] = i < 4 ? 9 + i : 18 + i;
  cases.push_back({"rope_forward",
                   "rope_forward_positions",
                   {uniform({2, 9, 5, 16}, 1), pos},
                   op([](const Views& v) { ops::rope_forward(v[0], 3, 0, 10000.0f, v[1]); }),
                   kTight});
  cases.push_back({"rope_backward",
                   "rope_backward_positions",
                   {uniform({2, 9, 5, 16}, 1), pos},
                   op([](const Views& v) { ops::rope_backward(v[0], 3, 0, 10000.0f, v[1]); }),
                   kTight});
  // Latent attention's: the last 6 of 16 dims of each head (its rope part).
  cases.push_back({"rope_forward",
                   "rope_forward_dims",
                   {uniform({2, 9, 5, 16}, 1), pos},
                   op([](const Views& v) {
                     ops::rope_forward(v[0], 4, 0, 10000.0f, v[1], {10, 6});
                   }),
                   kTight});
  cases.push_back({"rope_backward",
                   "rope_backward_dims",
                   {uniform({2, 9, 5, 16}, 1)},
                   op([](const Views& v) {
                     ops::rope_backward(v[0], 4, 3, 10000.0f, {}, {10, 6});
                   }),
                   kTight});
  // Scaled frequencies (kernels/rope_math.h): Llama 3.1's bands, YaRN's ramp with the attention
  // factor on cos and sin (at large positions, past the original context of 32).
  RopeScaling llama3, yarn;
  llama3.rope_type = RopeType::llama3;
  llama3.factor = 8.0f;
  llama3.original_max_position_embeddings = 32;
  yarn.rope_type = RopeType::yarn;
  yarn.factor = 16.0f;
  yarn.original_max_position_embeddings = 32;
  cases.push_back(
      {"rope_forward",
       "rope_forward_llama3",
       {uniform({2, 9, 5, 16}, 1)},
       op([llama3](const Views& v) { ops::rope_forward(v[0], 3, 500, 500000.0f, {}, {}, llama3); }),
       kTight});
  cases.push_back({"rope_backward",
                   "rope_backward_yarn",
                   {uniform({2, 9, 5, 16}, 1), pos},
                   op([yarn](const Views& v) {
                     ops::rope_backward(v[0], 4, 0, 10000.0f, v[1], {10, 6}, yarn);
                   }),
                   kTight});
}

// Unit roundoff of a 16-bit operands type: bf16 keeps 8 significant bits, f16 11.
double unit_roundoff(DType t) {
  return t == DType::bf16 ? 0x1p-8 : 0x1p-11;
}

// What cuDNN's fused attention on 16-bit operands may differ from the fp32 CPU kernel by, if it
// rounds where FlashAttention-2 does (everything else fp32, so the fp32 tolerances add on top):
// forward, the probabilities P to the operands type before P.V and out at the end; backward, P
// before dV = P^T dO, dS = P (dP - delta) before dQ = scale dS K and dK = scale dS^T Q, and the
// gradients at the end. A sum sum_j c_j y_j whose coefficients are rounded (relative u) moves by
// at most u sum_j |c_j| |y_j|; the final rounding adds u |x| (rtol). So:
//   out: atol 2u max|v| (the rows of P sum to 1; 2u whether cuDNN divides by the sum of P before
//        or after rounding), lse: fp32 only;
//   dqkv: atol u max(max|dO| colsum P, scale max|q| colsum |dS|, scale max|k| rowsum |dS|), the
//        sums over the keys a query sees (rows) or the queries (of the group) a key serves
//        (columns), computed here in double from the case's data; max|qkv| stands for max|q|,
//        max|k| and max|v|.
struct AttnBounds {
  Tol forward, backward;
};
// (scale_of: the scores' scale, 0 for 1/sqrt(D).)
AttnBounds cudnn_attention_bounds(const HostTensor& qkv, const HostTensor& dout,
                                  const HostTensor& out, int64_t H, int64_t KV, DType operands,
                                  double scale_of = 0.0) {
  const int64_t B = qkv.shape()[0], T = qkv.shape()[1], D = qkv.shape()[3];
  const int64_t ld = (H + 2 * KV) * D;
  const double u = unit_roundoff(operands);
  const double scale = scale_of > 0.0 ? scale_of : 1.0 / std::sqrt(static_cast<double>(D));
  const float* x = qkv.f32();
  auto max_abs = [](const float* p, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(p[i])));
    return m;
  };
  const double max_qkv = max_abs(x, qkv.numel()), max_dout = max_abs(dout.f32(), dout.numel());
  double row_ds = 0.0, col_p = 0.0, col_ds = 0.0;
  std::vector<double> p(T), ds(T), cp(T), cs(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < KV; ++g) {
      std::fill(cp.begin(), cp.end(), 0.0);
      std::fill(cs.begin(), cs.end(), 0.0);
      for (int64_t h = g * (H / KV); h < (g + 1) * (H / KV); ++h)
        for (int64_t i = 0; i < T; ++i) {
          const float* q = x + (b * T + i) * ld + h * D;
          const float* go = dout.f32() + ((b * T + i) * H + h) * D;
          const float* o = out.f32() + ((b * T + i) * H + h) * D;
          double mx = -INFINITY, sum = 0.0, delta = 0.0, rs = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            const float* k = x + (b * T + j) * ld + (H + g) * D;
            double s = 0.0;
            for (int64_t c = 0; c < D; ++c) s += static_cast<double>(q[c]) * k[c];
            p[j] = s * scale;
            mx = std::max(mx, p[j]);
          }
          for (int64_t j = 0; j <= i; ++j) sum += p[j] = std::exp(p[j] - mx);
          for (int64_t c = 0; c < D; ++c) delta += static_cast<double>(go[c]) * o[c];
          for (int64_t j = 0; j <= i; ++j) {
            const float* v = x + (b * T + j) * ld + (H + KV + g) * D;
            double dp = 0.0;
            for (int64_t c = 0; c < D; ++c) dp += static_cast<double>(go[c]) * v[c];
            p[j] /= sum;
            ds[j] = std::fabs(p[j] * (dp - delta));
            rs += ds[j];
            cp[j] += p[j];
            cs[j] += ds[j];
          }
          row_ds = std::max(row_ds, rs);
        }
      for (int64_t j = 0; j < T; ++j) {
        col_p = std::max(col_p, cp[j]);
        col_ds = std::max(col_ds, cs[j]);
      }
    }
  const double grad =
      std::max({max_dout * col_p, scale * max_qkv * col_ds, scale * max_qkv * row_ds});
  return {Tol{u + 2e-4, 2 * u * max_qkv + 2e-5}, Tol{u + 2e-4, u * grad + 1e-4}};
}

void add_attention(std::vector<OpCase>& cases) {
  struct Dims {
    int64_t B, T, H, KV, D;
    DType operands;
  };
  // fp32 operands (the flash kernel on CUDA): GQA with partial tiles; MQA with a padded head dim;
  // MHA with D between 128 and 256. 16-bit operands (cuDNN on CUDA where it supports the shape),
  // inputs pre-rounded to that type as the model's compute precision leaves them: GQA in bf16,
  // MQA in f16, and a head dim cuDNN refuses (not a multiple of 8), which falls back to the flash
  // kernel and so keeps the fp32 tolerance.
  for (const Dims d : {Dims{2, 70, 4, 2, 16, DType::f32}, Dims{1, 130, 2, 1, 80, DType::f32},
                       Dims{1, 33, 2, 2, 160, DType::f32}, Dims{2, 70, 4, 2, 16, DType::bf16},
                       Dims{1, 130, 2, 1, 64, DType::f16}, Dims{1, 33, 2, 2, 12, DType::bf16}}) {
    std::ostringstream os;
    os << "_B" << d.B << "_T" << d.T << "_H" << d.H << "_KV" << d.KV << "_D" << d.D;
    if (d.operands != DType::f32) os << "_ops_" << dtype_name(d.operands);
    const int64_t H = d.H, KV = d.KV;
    const DType ops16 = d.operands;
    const bool lowp = d.operands != DType::f32;
    HostTensor qkv = uniform({d.B, d.T, H + 2 * KV, d.D}, 1, -2.0f, 2.0f);
    HostTensor dout = uniform({d.B, d.T, H, d.D}, 5);
    if (lowp) {
      ops::round_to(qkv.t(), d.operands);
      ops::round_to(dout.t(), d.operands);
    }
    HostTensor out({d.B, d.T, H, d.D}), lse({d.B, H, d.T});
    ops::attention_forward(out.t(), lse.t(), qkv.t(), H, KV);
    if (lowp) ops::round_to(out.t(), d.operands);
    AttnBounds tol{Tol{2e-4, 2e-5}, Tol{2e-4, 1e-4}};  // twice the CPU kernel's bound vs double
    if (lowp && d.D % 8 == 0) tol = cudnn_attention_bounds(qkv, dout, out, H, KV, d.operands);
    cases.push_back({"attention_forward",
                     "attention_forward" + os.str(),
                     {uniform({d.B, d.T, H, d.D}, 2), uniform({d.B, H, d.T}, 3), qkv},
                     op([H, KV, ops16](const Views& v) {
                       ops::attention_forward(v[0], v[1], v[2], H, KV, ops16);
                     }),
                     tol.forward});
    cases.push_back({"attention_backward",
                     "attention_backward" + os.str(),
                     {uniform({d.B, d.T, H + 2 * KV, d.D}, 4), dout, qkv, out, lse},
                     op([H, KV, ops16](const Views& v) {
                       ops::attention_backward(v[0], v[1], v[2], v[3], v[4], H, KV, ops16);
                     }),
                     tol.backward});
  }
  // The scores scaled other than by 1/sqrt(D) (YaRN's factor; DeepSeek-V3's 1.874), through the
  // flash kernel (fp32) and cuDNN's attn_scale (bf16).
  for (const DType ops16 : {DType::f32, DType::bf16}) {
    const int64_t B = 2, T = 70, H = 4, KV = 2, D = 16;
    const float scale = scaled_attention_scale(D);
    HostTensor qkv = uniform({B, T, H + 2 * KV, D}, 6, -2.0f, 2.0f),
               dout = uniform({B, T, H, D}, 7);
    if (ops16 != DType::f32) {
      ops::round_to(qkv.t(), ops16);
      ops::round_to(dout.t(), ops16);
    }
    HostTensor out({B, T, H, D}), lse({B, H, T});
    ops::attention_forward(out.t(), lse.t(), qkv.t(), H, KV, DType::f32, scale);
    AttnBounds tol{Tol{2e-4, 2e-5}, Tol{2e-4, 1e-4}};
    if (ops16 != DType::f32) {
      ops::round_to(out.t(), ops16);
      tol = cudnn_attention_bounds(qkv, dout, out, H, KV, ops16, scale);
    }
    const std::string suffix = ops16 == DType::f32 ? "_scaled" : "_scaled_ops_bf16";
    cases.push_back({"attention_forward",
                     "attention_forward" + suffix,
                     {uniform({B, T, H, D}, 2), uniform({B, H, T}, 3), qkv},
                     op([ops16, scale](const Views& v) {
                       ops::attention_forward(v[0], v[1], v[2], H, KV, ops16, scale);
                     }),
                     tol.forward});
    cases.push_back({"attention_backward",
                     "attention_backward" + suffix,
                     {uniform({B, T, H + 2 * KV, D}, 4), dout, qkv, out, lse},
                     op([ops16, scale](const Views& v) {
                       ops::attention_backward(v[0], v[1], v[2], v[3], v[4], H, KV, ops16, scale);
                     }),
                     tol.backward});
  }
}

// Context parallelism's blocks at zigzag positions (cp 2, T 140: chunks of 35, so tiles straddle
// chunks): the local block (rank 0's queries and keys), a block of another rank's keys, the merge,
// and the K/V packing.
HostTensor zigzag_positions(int64_t T, int cp, int rank) {
  const int64_t c = T / (2 * cp);
  HostTensor p({2 * c}, DType::i32);
  for (int64_t i = 0; i < c; ++i) {
    p.i32()[i] = static_cast<int32_t>(rank * c + i);
    p.i32()[c + i] = static_cast<int32_t>((2 * cp - 1 - rank) * c + i);
  }
  return p;
}

void add_attention_blocks(std::vector<OpCase>& cases) {
  const int64_t B = 2, Tl = 70, H = 4, KV = 2, D = 24, W = H + 2 * KV;
  const AttnBounds tol{Tol{2e-4, 2e-5}, Tol{2e-4, 1e-4}};
  const HostTensor q0 = zigzag_positions(2 * Tl, 2, 0), q1 = zigzag_positions(2 * Tl, 2, 1);
  HostTensor qkv = uniform({B, Tl, W, D}, 21, -2.0f, 2.0f);
  HostTensor kv = uniform({B, Tl, 2 * KV, D}, 22, -2.0f, 2.0f);
  for (const auto& [name, kv_src, kv0, k_pos] :
       {std::tuple<const char*, HostTensor, int64_t, HostTensor>{"_local", qkv, H, q0},
        std::tuple<const char*, HostTensor, int64_t, HostTensor>{"_remote", kv, 0, q1}}) {
    HostTensor out({B, Tl, H, D}), lse({B, H, Tl});
    {
      HostTensor qk = qkv, kvs = kv_src, qp = q0, kp = k_pos;
      ops::attention_block_forward(out.t(), lse.t(), qk.t(), kvs.t(), kv0, qp.t(), kp.t(), H, KV);
    }
    const int64_t k0 = kv0;
    cases.push_back({"attention_block_forward",
                     std::string("attention_block_forward") + name,
                     {uniform({B, Tl, H, D}, 23), uniform({B, H, Tl}, 24), qkv, kv_src, q0, k_pos},
                     op([k0](const Views& v) {
                       ops::attention_block_forward(v[0], v[1], v[2], v[3], k0, v[4], v[5], H, KV);
                     }),
                     tol.forward});
    cases.push_back({"attention_block_backward",
                     std::string("attention_block_backward") + name,
                     {uniform({B, Tl, W, D}, 25), uniform(kv_src.shape(), 26),
                      uniform({B, Tl, H, D}, 27), qkv, kv_src, out, lse, q0, k_pos},
                     op([k0](const Views& v) {
                       ops::attention_block_backward(v[0], v[1], v[2], v[3], v[4], k0, v[5], v[6],
                                                     v[7], v[8], H, KV);
                     }),
                     tol.backward});
  }
  // Merge: some rows -inf on one side (a block no query of them sees).
  HostTensor part_lse = uniform({B, H, Tl}, 29, -1.0f, 3.0f);
  for (int64_t i = 0; i < part_lse.numel(); i += 3)
    part_lse[i] = -std::numeric_limits<float>::infinity();
  cases.push_back({"attention_merge",
                   "attention_merge",
                   {uniform({B, Tl, H, D}, 30), uniform({B, H, Tl}, 31, -1.0f, 3.0f),
                    uniform({B, Tl, H, D}, 32), part_lse},
                   op([](const Views& v) { ops::attention_merge(v[0], v[1], v[2], v[3]); }),
                   kTight});
  cases.push_back({"copy_heads",
                   "copy_heads_kv_of_qkv",
                   {uniform({B, Tl, 2 * KV, D}, 33), qkv},
                   op([](const Views& v) { ops::copy_heads(v[0], 0, v[1], H, 2 * KV); }),
                   kExact});
  // Latent attention's assembly: 3 blocks of 5 at stride 7 from stride 9; one block into every
  // head (source stride 0); a sum of 3 blocks into one (destination stride 0).
  cases.push_back({"copy_blocks",
                   "copy_blocks_strided",
                   {uniform({13, 23}, 34), uniform({13, 27}, 35)},
                   op([](const Views& v) {
                     ops::copy_blocks(v[0], v[1], {3, 5, 1, 7, 2, 9});
                   }),
                   kExact});
  cases.push_back({"copy_blocks",
                   "copy_blocks_broadcast",
                   {uniform({13, 23}, 36), uniform({13, 4}, 37)},
                   op([](const Views& v) {
                     ops::copy_blocks(v[0], v[1], {3, 4, 2, 7, 0, 0});
                   }),
                   kExact});
  cases.push_back({"copy_blocks",
                   "copy_blocks_sum",
                   {uniform({13, 4}, 38), uniform({13, 27}, 39)},
                   op([](const Views& v) {
                     ops::copy_blocks(v[0], v[1], {3, 4, 0, 0, 1, 9}, /*add=*/true);
                   }),
                   kTight});
}

void add_elementwise(std::vector<OpCase>& cases) {
  const Shape s{3, 1001};
  cases.push_back({"add",
                   "add",
                   {uniform(s, 1), uniform(s, 2), uniform(s, 3)},
                   op([](const Views& v) { ops::add(v[0], v[1], v[2]); }),
                   kExact});
  cases.push_back({"add_inplace",
                   "add_inplace",
                   {uniform(s, 1), uniform(s, 2)},
                   op([](const Views& v) { ops::add_inplace(v[0], v[1]); }),
                   kExact});
  cases.push_back({"scale_inplace",
                   "scale_inplace",
                   {uniform(s, 1)},
                   op([](const Views& v) { ops::scale_inplace(v[0], 0.37f); }),
                   kExact});
  cases.push_back({"add_bias",
                   "add_bias",
                   {uniform({13, 77}, 1), uniform({77}, 2)},
                   op([](const Views& v) { ops::add_bias(v[0], v[1]); }),
                   kExact});
  cases.push_back({"copy",
                   "copy",
                   {uniform(s, 1), uniform(s, 2)},
                   op([](const Views& v) { ops::copy(v[0], v[1]); }),
                   kExact});
  cases.push_back({"fill_zero",
                   "fill_zero",
                   {uniform(s, 1)},
                   op([](const Views& v) { ops::fill_zero(v[0]); }),
                   kExact});
  cases.push_back({"fill",
                   "fill",
                   {uniform(s, 1)},
                   op([](const Views& v) { ops::fill(v[0], 0.25f); }),
                   kExact});
  cases.push_back({"dropout_forward",
                   "dropout_forward",
                   {uniform(s, 1), uniform(s, 2)},
                   op([](const Views& v) { ops::dropout_forward(v[0], v[1], 0.3f, 7, 9, 123); }),
                   kExact});
  cases.push_back({"dropout_backward",
                   "dropout_backward",
                   {uniform(s, 1), uniform(s, 2)},
                   op([](const Views& v) { ops::dropout_backward(v[0], v[1], 0.3f, 7, 9, 123); }),
                   kExact});
}

void add_loss(std::vector<OpCase>& cases) {
  const int64_t N = 37, V = 1000, Vl = 300, start = 300;
  const float dloss = 1.0f / N;
  HostTensor logits = uniform({N, V}, 1, -4.0f, 4.0f);
  HostTensor targets = with_ignored(tokens({N}, static_cast<int32_t>(V), 2), 5);
  cases.push_back(
      {"softmax_cross_entropy",
       "softmax_cross_entropy",
       {uniform({N}, 3), uniform({N, V}, 4), logits, targets},
       op([dloss](const Views& v) { ops::softmax_cross_entropy(v[0], v[1], v[2], v[3], dloss); }),
       kReduced});
  cases.push_back(
      {"softmax_cross_entropy",
       "softmax_cross_entropy_in_place",
       {uniform({N}, 3), logits, targets},
       op([dloss](const Views& v) { ops::softmax_cross_entropy(v[0], v[1], v[1], v[2], dloss); }),
       kReduced});
  cases.push_back(
      {"softmax_cross_entropy",
       "softmax_cross_entropy_loss_only",
       {uniform({N}, 3), logits, targets},
       op([](const Views& v) { ops::softmax_cross_entropy(v[0], Tensor(), v[1], v[2], 1.0f); }),
       kReduced});
  HostTensor shard = uniform({N, Vl}, 5, -4.0f, 4.0f), max({N}), sums({2, N});
  ops::cross_entropy_shard_max(max.t(), shard.t(), targets.t(), V);
  ops::cross_entropy_shard_sums(sums.t(), shard.t(), max.t(), targets.t(), start);
  cases.push_back({"cross_entropy_shard_max",
                   "cross_entropy_shard_max",
                   {uniform({N}, 6), shard, targets},
                   op([V](const Views& v) { ops::cross_entropy_shard_max(v[0], v[1], v[2], V); }),
                   kExact});
  cases.push_back({"cross_entropy_shard_sums",
                   "cross_entropy_shard_sums",
                   {uniform({2, N}, 7), shard, max, targets},
                   op([start](const Views& v) {
                     ops::cross_entropy_shard_sums(v[0], v[1], v[2], v[3], start);
                   }),
                   kReduced});
  cases.push_back({"cross_entropy_shard_finish",
                   "cross_entropy_shard_finish",
                   {uniform({N}, 8), uniform({N, Vl}, 9), shard, max, sums, targets},
                   op([start, dloss](const Views& v) {
                     ops::cross_entropy_shard_finish(v[0], v[1], v[2], v[3], v[4], v[5], start,
                                                     dloss);
                   }),
                   kReduced});
}

// An empty tensor on the device of `like` (a HostTensor of 0 elements stands for an absent one).
Tensor empty_like(const Tensor& like) {
  return Tensor(nullptr, {0}, DType::f32, like.device);
}

// The multi-tensor (list) ops, on lists that cross every limit of the CUDA multi-tensor apply
// (kernels/cuda/optim.cu): more tensors than a launch holds (24 for AdamW, 96 for the
// reductions), tensors of one element and of several 16384-element chunks, empty tensors (made
// in the call), and for the sum one tensor cut by a full launch (320 chunks).
void add_multi_tensor(std::vector<OpCase>& cases) {
  std::vector<HostTensor> adamw_args;
  const int n_adamw = 30;
  for (int k = 0; k < n_adamw; ++k) {
    const int64_t n = k % 7 == 0 ? 40000 + k : 1 + 37 * k;
    adamw_args.push_back(uniform({n}, 100 + 4 * k));
    adamw_args.push_back(uniform({n}, 101 + 4 * k));
    adamw_args.push_back(uniform({n}, 102 + 4 * k, -0.1f, 0.1f));
    adamw_args.push_back(uniform({n}, 103 + 4 * k, 0.0f, 0.01f));
  }
  cases.push_back(
      {"adamw_update", "adamw_update_list", adamw_args, op([n_adamw](const Views& v) {
         const Tensor e = empty_like(v[0]);
         std::vector<ops::AdamWTensor> ts{{e, e, e, e, true}};
         for (int k = 0; k < n_adamw; ++k) {
           ts.push_back({v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3], k % 3 != 0});
           if (k == 12) ts.push_back({e, e, e, e, false});
         }
         ops::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
         ops::adamw_update(ts, hp);
       }),
       kTight});
  // 100003 elements (7 chunks), then 5.3M (324 chunks: the launch fills at its 313th), then 98
  // small ones.
  std::vector<HostTensor> sum_args{uniform({100003}, 200), uniform({5300000}, 201)};
  for (int k = 0; k < 98; ++k) sum_args.push_back(uniform({1 + 13 * k}, 202 + k));
  auto with_empty = [](const Views& v) {
    std::vector<Tensor> xs(v);
    xs.insert(xs.begin() + 50, empty_like(v[0]));
    return xs;
  };
  cases.push_back({"sum_squares", "sum_squares_list", sum_args,
                   [with_empty](const Views& v) {
                     return std::vector<double>{ops::sum_squares(with_empty(v))};
                   },
                   Tol{1e-10, 0.0}});
  std::vector<HostTensor> finite(sum_args.begin() + 2, sum_args.end());
  std::vector<HostTensor> with_inf = finite;
  with_inf.back()[with_inf.back().numel() - 1] = INFINITY;  // in the second launch (tensor 97)
  for (auto& [name, args] : {std::pair{"has_nonfinite_list_inf", with_inf},
                             std::pair{"has_nonfinite_list_finite", finite}})
    cases.push_back({"has_nonfinite", name, args,
                     [with_empty](const Views& v) {
                       return std::vector<double>{ops::has_nonfinite(with_empty(v)) * 1.0};
                     },
                     kExact});
}

void add_optim_and_reductions(std::vector<OpCase>& cases) {
  const Shape s{1000, 37};
  cases.push_back(
      {"adamw_update",
       "adamw_update",
       {uniform(s, 1), uniform(s, 2), uniform(s, 3, -0.1f, 0.1f), uniform(s, 4, 0.0f, 0.01f)},
       op([](const Views& v) {
         ops::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
         ops::adamw_update(v[0], v[1], v[2], v[3], hp);
       }),
       kTight});
  cases.push_back({"sum_squares",
                   "sum_squares",
                   {uniform({100003}, 5)},
                   [](const Views& v) { return std::vector<double>{ops::sum_squares(v[0])}; },
                   Tol{1e-10, 0.0}});
  HostTensor with_inf = uniform({100003}, 6);
  with_inf[77777] = INFINITY;
  cases.push_back(
      {"has_nonfinite",
       "has_nonfinite_inf",
       {with_inf},
       [](const Views& v) { return std::vector<double>{ops::has_nonfinite(v[0]) * 1.0}; },
       kExact});
  cases.push_back(
      {"has_nonfinite",
       "has_nonfinite_finite",
       {uniform({100003}, 6)},
       [](const Views& v) { return std::vector<double>{ops::has_nonfinite(v[0]) * 1.0}; },
       kExact});
  add_multi_tensor(cases);
}

void add_precision(std::vector<OpCase>& cases) {
  // Values across both formats' ranges: f16 overflow (> 65504) and subnormals (< 6.1e-5).
  HostTensor x = normal({4000}, 1, 3.0f);
  for (int64_t i = 0; i < x.numel(); i += 7) x[i] *= 3e4f;
  for (int64_t i = 3; i < x.numel(); i += 11) x[i] *= 1e-6f;
  cases.push_back({"round_to",
                   "round_to_bf16",
                   {x},
                   op([](const Views& v) { ops::round_to(v[0], DType::bf16); }),
                   kExact});
  cases.push_back({"round_to",
                   "round_to_f16",
                   {x},
                   op([](const Views& v) { ops::round_to(v[0], DType::f16); }),
                   kExact});
  HostTensor bf({4000}, DType::bf16), f16({4000}, DType::f16);
  ops::convert(bf.t(), x.t());
  ops::convert(f16.t(), x.t());
  cases.push_back({"convert",
                   "convert_f32_to_bf16",
                   {HostTensor({4000}, DType::bf16), x},
                   op([](const Views& v) { ops::convert(v[0], v[1]); }),
                   kExact});
  cases.push_back({"convert",
                   "convert_bf16_to_f16",
                   {HostTensor({4000}, DType::f16), bf},
                   op([](const Views& v) { ops::convert(v[0], v[1]); }),
                   kExact});
  cases.push_back({"convert",
                   "convert_f16_to_f32",
                   {uniform({4000}, 2), f16},
                   op([](const Views& v) { ops::convert(v[0], v[1]); }),
                   kExact});
}

// FP8 (emulated): the tiles the GEMMs use over a tensor with edge tiles, many tiles per CUDA
// block row, and magnitudes that reach both formats' subnormals.
void add_fp8(std::vector<OpCase>& cases) {
  const int64_t M = 70, K = 300;
  HostTensor x = normal({M, K}, 4);
  for (int64_t i = 0; i < x.numel(); i += 13) x[i] *= 1e-4f;
  for (const auto& [tr, tc, tiles] : std::vector<std::tuple<int64_t, int64_t, std::string>>{
           {1, 128, "1x128"}, {128, 1, "128x1"}, {128, 128, "128x128"}, {M, K, "tensor"}}) {
    const int64_t TR = (M + tr - 1) / tr, TC = (K + tc - 1) / tc;
    cases.push_back({"fp8_amax",
                     "fp8_amax_" + tiles,
                     {uniform({TR, TC}, 5), x},
                     op([tr, tc](const Views& v) { ops::fp8_amax(v[0], v[1], tr, tc); }),
                     kExact});
    HostTensor amax({TR, TC});
    ops::fp8_amax(amax.t(), x.t(), tr, tc);
    for (const auto& [fmt, name] :
         {std::pair{ops::Fp8Format::e4m3, "e4m3"}, std::pair{ops::Fp8Format::e5m2, "e5m2"}})
      cases.push_back(
          {"fp8_quantize",
           "fp8_quantize_" + tiles + "_" + name,
           {uniform({M, K}, 6), x, amax},
           op([tr, tc, fmt](const Views& v) { ops::fp8_quantize(v[0], v[1], v[2], tr, tc, fmt); }),
           kExact});
  }
}

// Integer block quantisation (qwZ in 8 bits, qgZ in 4): blocks of 256 and of an odd 7 over rows
// whose length is no multiple of either, a zero block, magnitudes far apart; dequantised into f32
// and bf16.
void add_int_quant(std::vector<OpCase>& cases) {
  const int64_t S = 3, L = 1000;
  HostTensor x = normal({S, L}, 7);
  for (int64_t i = 0; i < x.numel(); i += 11) x[i] *= 1e-3f;
  for (int64_t i = 256; i < 512; ++i) x[i] = 0.0f;  // row 0's second block of 256
  for (const int bits : {8, 4})
    for (const int64_t block : {int64_t{256}, int64_t{7}}) {
      const int64_t W = ops::int_packed_words(L, block, bits);
      const std::string b = "int" + std::to_string(bits) + "_block" + std::to_string(block);
      cases.push_back(
          {"quantize_int",
           "quantize_" + b,
           {HostTensor({S, W}, DType::i32), x},
           op([block, bits](const Views& v) { ops::quantize_int(v[0], v[1], block, bits); }),
           kExact});
      HostTensor packed({S, W}, DType::i32);
      ops::quantize_int(packed.t(), x.t(), block, bits);
      for (const DType t : {DType::f32, DType::bf16})
        cases.push_back(
            {"dequantize_int",
             "dequantize_" + b + "_" + std::string(dtype_name(t)),
             {HostTensor({S, L}, t), packed},
             op([block, bits](const Views& v) { ops::dequantize_int(v[0], v[1], block, bits); }),
             kExact});
    }
}

void add_init(std::vector<OpCase>& cases) {
  cases.push_back({"init_normal",
                   "init_normal_contiguous",
                   {uniform({5000}, 1)},
                   op([](const Views& v) { ops::init_normal(v[0], 0.02f, 5, 77, 1000); }),
                   Tol{1e-6, 1e-9}});
  cases.push_back({"init_normal",
                   "init_normal_column_shard",
                   {uniform({37, 20}, 1)},
                   op([](const Views& v) { ops::init_normal(v[0], 0.02f, 5, 77, 1000, 50); }),
                   Tol{1e-6, 1e-9}});
}

}  // namespace

// Mixture of experts: 2 sequences of 37 tokens, 6 experts, top-2; indices from the CPU router
// and dispatch (so the GPU cases see valid plans), a capacity that drops, and grouped GEMMs with
// an empty group and groups longer than a tile.
void add_moe(std::vector<OpCase>& cases) {
  const int64_t S = 2, T = 37, N = S * T, E = 6, k = 2, M = N * k, C = 48;
  HostTensor logits = uniform({N, E}, 1, -3.0f, 3.0f);
  HostTensor scores({N, E}), idx({N, k}, DType::i32), weights({N, k});
  ops::moe_route(scores.t(), idx.t(), weights.t(), logits.t(), ops::MoeRouting{});
  for (const auto& [sigmoid, normalize] : {std::pair{false, true}, std::pair{true, false}}) {
    const std::string name = std::string("moe_route_") + (sigmoid ? "sigmoid" : "softmax") +
                             (normalize ? "_normalized" : "");
    cases.push_back(
        {"moe_route",
         name,
         {uniform({N, E}, 2), HostTensor({N, k}, DType::i32), uniform({N, k}, 3), logits},
         op([sigmoid, normalize](const Views& v) {
           ops::moe_route(v[0], v[1], v[2], v[3], {.sigmoid = sigmoid, .normalize = normalize});
         }),
         kTight});
  }
  // Aux-loss-free balancing: a bias on the scores for selection; and with it DeepSeek-V3's
  // group-limited routing (2 of 3 groups of 2 experts), the weights scaled.
  for (const auto& [name, how] :
       {std::pair{"moe_route_sigmoid_bias", ops::MoeRouting{.sigmoid = true}},
        std::pair{"moe_route_sigmoid_bias_grouped",
                  ops::MoeRouting{.sigmoid = true, .groups = 3, .topk_group = 2, .scale = 2.5f}}})
    cases.push_back(
        {"moe_route",
         name,
         {uniform({N, E}, 2), HostTensor({N, k}, DType::i32), uniform({N, k}, 3), logits,
          uniform({E}, 21, -0.3f, 0.3f)},
         op([how](const Views& v) { ops::moe_route(v[0], v[1], v[2], v[3], how, v[4]); }),
         kTight});
  HostTensor counts({S, E}, DType::i32), offsets({E + 1}, DType::i32), assign({M}, DType::i32);
  HostTensor slot({N, k}, DType::i32);
  const int64_t capacity = 10;  // of ~12 per (sequence, expert): some drop
  ops::moe_dispatch(counts.t(), offsets.t(), assign.t(), slot.t(), idx.t(), T, capacity);
  for (const int64_t cap : {int64_t{0}, capacity})
    cases.push_back(
        {"moe_dispatch",
         "moe_dispatch_capacity" + std::to_string(cap),
         {HostTensor({S, E}, DType::i32), HostTensor({E + 1}, DType::i32),
          HostTensor({M}, DType::i32), HostTensor({N, k}, DType::i32), idx},
         op([cap](const Views& v) { ops::moe_dispatch(v[0], v[1], v[2], v[3], v[4], 37, cap); }),
         kExact});
  // Context parallelism's ranks within the whole sequence: the 37 tokens as 1 run and as 37 runs
  // of one, each (sequence, expert, choice, run) starting at a rank in [0, 12).
  for (const int64_t H : {int64_t{1}, T}) {
    HostTensor base({S, E, k, H}, DType::i32);
    for (int64_t i = 0; i < base.t().numel(); ++i)
      base.i32()[i] = static_cast<int32_t>((i * 7 + H) % 12);
    cases.push_back({"moe_dispatch",
                     "moe_dispatch_rank_base_runs" + std::to_string(H),
                     {HostTensor({S, E}, DType::i32), HostTensor({E + 1}, DType::i32),
                      HostTensor({M}, DType::i32), HostTensor({N, k}, DType::i32), idx, base},
                     op([capacity](const Views& v) {
                       ops::moe_dispatch(v[0], v[1], v[2], v[3], v[4], 37, capacity, v[5]);
                     }),
                     kExact});
  }
  cases.push_back({"moe_permute",
                   "moe_permute_weighted",
                   {uniform({M, C}, 4), uniform({N, C}, 5), assign, weights},
                   op([](const Views& v) { ops::moe_permute(v[0], v[1], v[2], v[3]); }),
                   kExact});
  cases.push_back({"moe_unpermute",
                   "moe_unpermute_weighted",
                   {uniform({N, C}, 6), uniform({M, C}, 7), slot, weights},
                   op([](const Views& v) { ops::moe_unpermute(v[0], v[1], v[2], v[3]); }),
                   kTight});
  cases.push_back({"moe_weights_backward",
                   "moe_weights_backward",
                   {uniform({N, k}, 8), uniform({N, C}, 9), uniform({M, C}, 10), slot},
                   op([](const Views& v) { ops::moe_weights_backward(v[0], v[1], v[2], v[3]); }),
                   kReduced});
  for (const auto& [sigmoid, normalize] : {std::pair{false, true}, std::pair{true, false}})
    cases.push_back({"moe_route_backward",
                     std::string("moe_route_backward_") + (sigmoid ? "sigmoid" : "softmax"),
                     {uniform({N, E}, 11), uniform({N, k}, 12), logits, idx, counts},
                     op([sigmoid, normalize](const Views& v) {
                       ops::moe_route_backward(
                           v[0], v[1], v[2], v[3], v[4],
                           {.sigmoid = sigmoid, .normalize = normalize, .scale = 2.5f}, 0.3f, 0.1f);
                     }),
                     kReduced});
  cases.push_back(
      {"moe_route_losses",
       "moe_route_losses",
       {uniform({S}, 13), uniform({N}, 14), logits, counts},
       op([](const Views& v) { ops::moe_route_losses(v[0], v[1], v[2], v[3], 2, true); }),
       kReduced});
  const int64_t IC = 40, OC = 52, G = 6, R = 300;
  const std::vector<int64_t> groups{0, 30, 30, 170, 200, 299, 300};  // an empty group, 140 rows
  cases.push_back(
      {"grouped_linear_forward",
       "grouped_linear_forward",
       {uniform({R, OC}, 15), uniform({R, IC}, 16), uniform({G, OC, IC}, 17)},
       op([groups](const Views& v) { ops::grouped_linear_forward(v[0], v[1], v[2], groups); }),
       kReduced});
  // Groups sharing weights (expert parallelism: each peer's rows of each local expert).
  const std::vector<int64_t> shared_groups{0, 40, 90, 90, 200, 250, 300},
      weight_of{0, 1, 2, 0, 1, 2};
  cases.push_back({"grouped_linear_forward",
                   "grouped_linear_forward_shared_weights",
                   {uniform({R, OC}, 15), uniform({R, IC}, 16), uniform({3, OC, IC}, 17)},
                   op([shared_groups, weight_of](const Views& v) {
                     ops::grouped_linear_forward(v[0], v[1], v[2], shared_groups, weight_of);
                   }),
                   kReduced});
  cases.push_back({"grouped_linear_backward",
                   "grouped_linear_backward_shared_weights",
                   {uniform({R, IC}, 18), uniform({3, OC, IC}, 19), uniform({R, OC}, 20),
                    uniform({R, IC}, 16), uniform({3, OC, IC}, 17)},
                   op([shared_groups, weight_of](const Views& v) {
                     ops::grouped_linear_backward(v[0], v[1], v[2], v[3], v[4], shared_groups,
                                                  weight_of);
                   }),
                   kReduced});
  cases.push_back({"grouped_linear_backward",
                   "grouped_linear_backward",
                   {uniform({R, IC}, 18), uniform({G, OC, IC}, 19), uniform({R, OC}, 20),
                    uniform({R, IC}, 16), uniform({G, OC, IC}, 17)},
                   op([groups](const Views& v) {
                     ops::grouped_linear_backward(v[0], v[1], v[2], v[3], v[4], groups);
                   }),
                   kReduced});
  // 16-bit operands (CUDA: one grouped tensor-core call on bf16/f16 copies; the CPU: oneDNN
  // where it multiplies bf16): inputs representable in the type, so only the summation order
  // differs from the fp32 kernel, as for the linear cases.
  for (const DType t : {DType::bf16, DType::f16}) {
    const std::string ty = t == DType::bf16 ? "_bf16_operands" : "_f16_operands";
    auto in = [t](HostTensor x) {  // x's values rounded to t
      ops::round_to(x.t(), t);
      return x;
    };
    cases.push_back({"grouped_linear_forward",
                     "grouped_linear_forward_shared_weights" + ty,
                     {uniform({R, OC}, 15), in(uniform({R, IC}, 16)), in(uniform({3, OC, IC}, 17))},
                     op([shared_groups, weight_of, t](const Views& v) {
                       ops::grouped_linear_forward(v[0], v[1], v[2], shared_groups, weight_of, t);
                     }),
                     kReduced});
    cases.push_back({"grouped_linear_backward",
                     "grouped_linear_backward" + ty,
                     {uniform({R, IC}, 18), uniform({G, OC, IC}, 19), in(uniform({R, OC}, 20)),
                      in(uniform({R, IC}, 16)), in(uniform({G, OC, IC}, 17))},
                     op([groups, t](const Views& v) {
                       ops::grouped_linear_backward(v[0], v[1], v[2], v[3], v[4], groups, {}, t);
                     }),
                     kReduced});
  }
}

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  add_moe(cases);
  add_embedding(cases);
  add_norms(cases);
  add_linear(cases);
  add_activations(cases);
  add_rope(cases);
  add_attention(cases);
  add_attention_blocks(cases);
  add_elementwise(cases);
  add_loss(cases);
  add_optim_and_reductions(cases);
  add_precision(cases);
  add_fp8(cases);
  add_int_quant(cases);
  add_init(cases);
  return cases;
}

OpResult run_case(const OpCase& c, Allocator* device) {
  OpResult r{c.args, {}};  // deep copies: the case stays as it was
  if (device == nullptr) {
    std::vector<Tensor> views;
    for (HostTensor& a : r.args) views.push_back(a.t());
    r.scalars = c.call(views);
    return r;
  }
  DeviceBackend& backend = device->backend();
  std::vector<Buffer> buffers;
  std::vector<Tensor> views;
  for (HostTensor& a : r.args) {
    if (!a.defined()) {
      views.emplace_back();
      continue;
    }
    Tensor host = a.t();
    buffers.push_back(device->allocate(host.nbytes(), MemCategory::other));
    backend.copy_from_host(buffers.back().data(), host.data, host.nbytes());
    views.push_back(buffers.back().tensor(host.shape, host.dtype));
  }
  r.scalars = c.call(views);
  backend.synchronize();
  for (size_t i = 0; i < r.args.size(); ++i)
    if (r.args[i].defined()) {
      Tensor host = r.args[i].t();
      backend.copy_to_host(host.data, views[i].data, host.nbytes());
    }
  return r;
}

OpCase bf16_storage(const OpCase& c) {
  OpCase b = c;
  b.name += "_bf16";
  for (HostTensor& a : b.args)
    if (a.defined() && a.dtype() == DType::f32) ops::round_to(a.t(), DType::bf16);
  b.call = [call = c.call](const std::vector<Tensor>& views) {
    std::vector<double> scalars = call(views);
    for (const Tensor& t : views)
      if (t.defined() && t.dtype == DType::f32) ops::round_to(t, DType::bf16);
    return scalars;
  };
  b.tol = Tol{c.tol.rtol + kBf16Tol.rtol, c.tol.atol + kBf16Tol.atol};
  return b;
}

::testing::AssertionResult results_close(const OpResult& got, const OpResult& want, Tol tol) {
  if (got.args.size() != want.args.size() || got.scalars.size() != want.scalars.size())
    return ::testing::AssertionFailure() << "results of different arity";
  for (size_t i = 0; i < got.args.size(); ++i) {
    const HostTensor &g = got.args[i], &w = want.args[i];
    if (g.defined() != w.defined()) return ::testing::AssertionFailure() << "argument " << i;
    if (!g.defined()) continue;
    auto r = g.dtype() == DType::f32 ? all_close(g, w, tol) : bits_equal(g, w);
    if (!r) return ::testing::AssertionFailure() << "argument " << i << ": " << r.message();
  }
  for (size_t i = 0; i < got.scalars.size(); ++i) {
    const double g = got.scalars[i], w = want.scalars[i];
    if (!(std::fabs(g - w) <= tol.atol + tol.rtol * std::fabs(w)))
      return ::testing::AssertionFailure()
             << "scalar result " << i << ": got " << g << ", want " << w;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace llmt::test
