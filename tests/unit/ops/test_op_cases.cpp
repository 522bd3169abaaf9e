// The op-case table that the GPU suite runs on CUDA (op_cases.h), checked where CI can run it:
// it names every op declared in kernels/ops.h, every case passes the dispatcher's checks and
// changes something, and running a case through a DeviceBackend's buffers gives the bits of a
// run in host memory (the round trip the GPU comparison relies on); and the tolerances of the
// attention cases with 16-bit operands cover a CPU model of cuDNN's rounding, where fp32 ones
// would not.
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "core/allocator.h"
#include "kernels/ops.h"
#include "tests/unit/ops/op_cases.h"

namespace llmt::test {
namespace {

// The functions declared in kernels/ops.h.
std::set<std::string> declared_ops() {
  std::ifstream in(LLMT_SOURCE_DIR "/kernels/ops.h");
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  std::set<std::string> names;
  const std::regex decl(R"(\n(void|double|bool) (\w+)\()");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), decl); it != std::sregex_iterator(); ++it)
    names.insert((*it)[2]);
  return names;
}

TEST(OpCases, CoverEveryOpOfOpsH) {
  const std::set<std::string> declared = declared_ops();
  ASSERT_GT(declared.size(), 30u) << "could not read the declarations of kernels/ops.h";
  std::set<std::string> covered, names;
  for (const OpCase& c : op_cases()) {
    EXPECT_TRUE(declared.count(c.op)) << c.name << " calls " << c.op << ", not in ops.h";
    EXPECT_TRUE(names.insert(c.name).second) << "two cases named " << c.name;
    covered.insert(c.op);
  }
  for (const std::string& op : declared) EXPECT_TRUE(covered.count(op)) << op << " has no case";
}

TEST(OpCases, EveryCaseChangesSomething) {
  for (const OpCase& c : op_cases()) {
    const OpResult r = run_case(c);
    bool changed = !r.scalars.empty();
    for (size_t i = 0; i < r.args.size() && !changed; ++i)
      changed = r.args[i].defined() && !bits_equal(r.args[i], c.args[i]);
    EXPECT_TRUE(changed) << c.name << " leaves every argument as it was and returns nothing";
  }
}

TEST(OpCases, BackendBuffersGiveTheBitsOfHostMemory) {
  auto backend = make_cpu_backend();
  Allocator alloc(*backend);
  for (const OpCase& c : op_cases()) {
    for (const OpCase& v : {c, bf16_storage(c)}) {
      EXPECT_TRUE(results_close(run_case(v, &alloc), run_case(v), Tol{0.0, 0.0})) << v.name;
    }
  }
  EXPECT_EQ(alloc.stats().live_total, 0);
}

// The tolerance of the attention cases with 16-bit operands (cuDNN on the GPU) against a CPU model
// of cuDNN's forward: fp32 scores and softmax, P rounded to the operands type before P.V, out
// rounded at the end. The model must pass within the case's tolerance, and fail the fp32 one
// (else the 16-bit cases would not need their own).
TEST(OpCases, AttentionOperandsToleranceCoversRoundedProbabilities) {
  int checked = 0;
  for (const OpCase& c : op_cases()) {
    if (c.op != "attention_forward" || c.name.find("_ops_") == std::string::npos) continue;
    const DType t = c.name.ends_with("_f16") ? DType::f16 : DType::bf16;
    const HostTensor& qkv = c.args[2];
    const int64_t B = qkv.shape()[0], T = qkv.shape()[1], D = qkv.shape()[3];
    const int64_t H = c.args[0].shape()[2], KV = (qkv.shape()[2] - H) / 2, ld = (H + 2 * KV) * D;
    if (D % 8 != 0) continue;  // the fallback case: the flash kernel, fp32
    const double scale = c.name.find("_scaled") != std::string::npos
                             ? static_cast<double>(scaled_attention_scale(D))
                             : 1.0 / std::sqrt(static_cast<double>(D));
    const OpResult want = run_case(c);
    OpResult model = want;
    HostTensor p({T});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const int64_t g = h / (H / KV);
          const float* q = qkv.f32() + (b * T + i) * ld + h * D;
          double m = -INFINITY, l = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            double s = 0.0;
            for (int64_t d = 0; d < D; ++d)
              s += static_cast<double>(q[d]) * qkv.f32()[(b * T + j) * ld + (H + g) * D + d];
            p[j] = static_cast<float>(s * scale);
            m = std::max(m, static_cast<double>(p[j]));
          }
          for (int64_t j = 0; j <= i; ++j) l += p[j] = std::exp(p[j] - static_cast<float>(m));
          ops::round_to(p.t(), t);
          float* o = model.args[0].f32() + ((b * T + i) * H + h) * D;
          for (int64_t d = 0; d < D; ++d) {
            double acc = 0.0;
            for (int64_t j = 0; j <= i; ++j)
              acc += p[j] * static_cast<double>(qkv.f32()[(b * T + j) * ld + (H + KV + g) * D + d]);
            o[d] = static_cast<float>(acc / l);
          }
        }
    ops::round_to(model.args[0].t(), t);
    EXPECT_TRUE(results_close(model, want, c.tol)) << c.name;
    EXPECT_FALSE(results_close(model, want, Tol{2e-4, 2e-5})) << c.name;
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

// The same for the backward: P from the saved lse, delta = dO . O, dS = P (dO . v - delta); P
// rounded before dV = P^T dO, dS before dQ = scale dS K and dK = scale dS^T Q, dqkv rounded at
// the end; sums in double.
TEST(OpCases, AttentionOperandsToleranceCoversRoundedGradients) {
  int checked = 0;
  for (const OpCase& c : op_cases()) {
    if (c.op != "attention_backward" || c.name.find("_ops_") == std::string::npos) continue;
    const DType t = c.name.ends_with("_f16") ? DType::f16 : DType::bf16;
    const HostTensor &dout = c.args[1], &qkv = c.args[2], &out = c.args[3], &lse = c.args[4];
    const int64_t B = qkv.shape()[0], T = qkv.shape()[1], D = qkv.shape()[3];
    const int64_t H = out.shape()[2], KV = (qkv.shape()[2] - H) / 2, ld = (H + 2 * KV) * D;
    if (D % 8 != 0) continue;  // the fallback case
    const double scale = c.name.find("_scaled") != std::string::npos
                             ? static_cast<double>(scaled_attention_scale(D))
                             : 1.0 / std::sqrt(static_cast<double>(D));
    const OpResult want = run_case(c);
    std::vector<double> grad(qkv.numel(), 0.0);
    HostTensor p({T}), ds({T});
    auto at = [&](int64_t b, int64_t t, int64_t head) { return (b * T + t) * ld + head * D; };
    const float* x = qkv.f32();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const int64_t g = h / (H / KV), oi = ((b * T + i) * H + h) * D;
          double delta = 0.0;
          for (int64_t d = 0; d < D; ++d) delta += static_cast<double>(dout[oi + d]) * out[oi + d];
          for (int64_t j = 0; j <= i; ++j) {
            double s = 0.0, dp = 0.0;
            for (int64_t d = 0; d < D; ++d) {
              s += static_cast<double>(x[at(b, i, h) + d]) * x[at(b, j, H + g) + d];
              dp += static_cast<double>(dout[oi + d]) * x[at(b, j, H + KV + g) + d];
            }
            const double pj = std::exp(s * scale - lse[(b * H + h) * T + i]);
            p[j] = static_cast<float>(pj);
            ds[j] = static_cast<float>(pj * (dp - delta));
          }
          ops::round_to(p.t(), t);
          ops::round_to(ds.t(), t);
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t d = 0; d < D; ++d) {
              grad[at(b, j, H + KV + g) + d] += p[j] * static_cast<double>(dout[oi + d]);
              grad[at(b, j, H + g) + d] += scale * ds[j] * x[at(b, i, h) + d];
              grad[at(b, i, h) + d] += scale * ds[j] * x[at(b, j, H + g) + d];
            }
        }
    OpResult model = want;
    for (int64_t e = 0; e < qkv.numel(); ++e) model.args[0][e] = static_cast<float>(grad[e]);
    ops::round_to(model.args[0].t(), t);
    EXPECT_TRUE(results_close(model, want, c.tol)) << c.name;
    EXPECT_FALSE(results_close(model, want, Tol{2e-4, 1e-4})) << c.name;
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(OpCases, ResultsCloseFailsOnADifference) {
  const OpCase c = op_cases().front();
  const OpResult a = run_case(c);
  OpResult b = a;
  b.args[0][3] += 1e-3f;
  EXPECT_FALSE(results_close(b, a, Tol{1e-5, 1e-6}));
  EXPECT_TRUE(results_close(b, a, Tol{0.0, 2e-3}));
}

// x stored as t (bf16 or f16): its values rounded.
HostTensor stored_as(const HostTensor& x, DType t) {
  HostTensor out(x.shape(), t);
  ops::convert(out.t(), const_cast<HostTensor&>(x).t());
  return out;
}

HostTensor widened(const HostTensor& x) {
  HostTensor out(x.shape());
  ops::convert(out.t(), const_cast<HostTensor&>(x).t());
  return out;
}

// 16-bit storage (docs/model.md, "Precision"): an op given bf16 or f16 tensors widens them to
// fp32, runs the fp32 kernel and rounds what it writes once. Each case is run with every argument
// the op takes in 16 bits (found by trying each alone: statistics, router math and optimizer
// states refuse) stored in 16 bits, and must give the bits of the fp32 op on the same values with
// those arguments rounded after the call: the emulation's rounding points. An argument the
// dispatcher took as an output when the kernel reads it, or any 16-bit value read or written
// wrongly, changes bits here.
TEST(OpCases, SixteenBitStorageGivesTheBitsOfTheRoundedF32Op) {
  // Ops whose every floating argument stays fp32 in every precision.
  const std::set<std::string> fp32_only = {"moe_route_backward", "moe_route_losses", "moe_dispatch",
                                           "round_to"};
  // copy and convert move any type, as their types say, not as the op decides.
  const std::set<std::string> any_type = {"copy", "convert"};
  for (const DType t : {DType::bf16, DType::f16}) {
    std::set<std::string> taking, seen;
    int compared = 0;
    for (const OpCase& c : op_cases()) {
      std::vector<size_t> capable;
      for (size_t i = 0; i < c.args.size(); ++i) {
        if (!c.args[i].defined() || c.args[i].dtype() != DType::f32) continue;
        OpCase one = c;
        one.args[i] = stored_as(c.args[i], t);
        try {
          run_case(one);
          capable.push_back(i);
        } catch (const Error&) {
        }
      }
      if (any_type.count(c.op)) continue;
      seen.insert(c.op);
      if (capable.empty()) continue;
      EXPECT_FALSE(fp32_only.count(c.op)) << c.name << " takes a 16-bit argument";
      taking.insert(c.op);
      OpCase storage = c, emulation = c;
      for (size_t i : capable) {
        storage.args[i] = stored_as(c.args[i], t);
        emulation.args[i] = widened(storage.args[i]);
      }
      emulation.call = [call = c.call, capable, t](const std::vector<Tensor>& v) {
        std::vector<double> scalars = call(v);
        for (size_t i : capable) ops::round_to(v[i], t);
        return scalars;
      };
      OpResult got = run_case(storage);
      for (size_t i : capable) got.args[i] = widened(got.args[i]);
      // A list of 16-bit tensors is reduced tensor by tensor (each widened alone, so the scratch
      // stays one tensor's): the same double sum in another order.
      const Tol tol = c.op == "sum_squares" ? Tol{1e-14, 0.0} : Tol{0.0, 0.0};
      EXPECT_TRUE(results_close(got, run_case(emulation), tol))
          << c.name << " in " << dtype_name(t);
      ++compared;
    }
    EXPECT_GT(compared, 80);
    for (const std::string& op : seen)
      EXPECT_TRUE(taking.count(op) || fp32_only.count(op)) << op << " takes no argument in 16 bits";
    for (const char* op :
         {"linear_forward", "linear_backward", "layernorm_forward", "rmsnorm_backward",
          "attention_forward", "attention_backward", "gelu_forward", "swiglu_backward", "add",
          "dropout_forward", "grouped_linear_forward", "moe_permute", "copy_heads"})
      EXPECT_TRUE(taking.count(op)) << op << " takes no 16-bit argument";
  }
}

}  // namespace
}  // namespace llmt::test
