// The experts' GEMMs of one MoE MLP (forward fc1 and fc2, backward input and weight gradients of
// both) as one grouped call per GEMM (ops::grouped_linear_*) against a loop of one linear call
// per expert on the same buffers, in the same process, interleaved. Tokens are routed unevenly
// (expert e gets a share proportional to e + 1), as a router in training does. Prints the median
// time of each and the loop / grouped ratio; and the grouped call with bf16 operands (every input
// a bf16 value) against fp32. CPU only.
//
//   build/scripts/bench/bench_grouped_gemm [E (8)] [ROWS (4096)] [C (512)] [FE (1024)]
//                                          [REPEATS (7)] [THREADS (all cores)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "kernels/ops.h"
#include "kernels/threads.h"
#include "scripts/bench/bench_timing.h"

using namespace llmt;
using bench::median_ms;
using bench::time_ms;

namespace {

Tensor view(std::vector<float>& b, Shape s) {
  return Tensor(b.data(), s, DType::f32);
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t def) { return argc > i ? std::atoll(argv[i]) : def; };
  const int64_t E = arg(1, 8), M = arg(2, 4096), C = arg(3, 512), Fe = arg(4, 1024);
  const int repeats = static_cast<int>(arg(5, 7));
  const int threads = set_cpu_threads(static_cast<int>(arg(6, 0)));
  const int64_t F1 = 2 * Fe;  // SwiGLU: fc1 rows [gate | up]
  std::vector<int64_t> off(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = M * (e + 1) * (e + 2) / (E * (E + 1));
  std::vector<float> x(M * C), h(M * F1), g(M * Fe), y(M * C), w1(E * F1 * C), w2(E * C * Fe);
  std::vector<float> dy(M * C), dg(M * Fe), dh(M * F1), dx(M * C), dw1(E * F1 * C), dw2(E * C * Fe);
  for (auto* b : {&x, &w1, &w2, &dy, &dh})
    ops::init_normal(view(*b, {static_cast<int64_t>(b->size())}), 0.02f, 1, b->size());
  ops::init_normal(view(g, {M * Fe}), 1.0f, 2, 3);

  // Every input a bf16 value, as in a bf16 run: the fp32 runs do not mind, the bf16 one needs it.
  for (auto* b : {&x, &w1, &w2, &dy, &dh, &g})
    ops::round_to(view(*b, {static_cast<int64_t>(b->size())}), DType::bf16);

  auto grouped_as = [&](DType operands) {
    ops::grouped_linear_forward(view(h, {M, F1}), view(x, {M, C}), view(w1, {E, F1, C}), off, {},
                                operands);
    ops::grouped_linear_forward(view(y, {M, C}), view(g, {M, Fe}), view(w2, {E, C, Fe}), off, {},
                                operands);
    ops::grouped_linear_backward(view(dg, {M, Fe}), view(dw2, {E, C, Fe}), view(dy, {M, C}),
                                 view(g, {M, Fe}), view(w2, {E, C, Fe}), off, {}, operands);
    ops::grouped_linear_backward(view(dx, {M, C}), view(dw1, {E, F1, C}), view(dh, {M, F1}),
                                 view(x, {M, C}), view(w1, {E, F1, C}), off, {}, operands);
  };
  auto grouped = [&] { grouped_as(DType::f32); };
  auto grouped16 = [&] { grouped_as(DType::bf16); };
  auto loop = [&] {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t a = off[e], b = off[e + 1];
      if (a == b) continue;
      const Tensor W1 = view(w1, {E, F1, C}).rows(e, e + 1).view({F1, C});
      const Tensor W2 = view(w2, {E, C, Fe}).rows(e, e + 1).view({C, Fe});
      ops::linear_forward(view(h, {M, F1}).rows(a, b), view(x, {M, C}).rows(a, b), W1, Tensor());
      ops::linear_forward(view(y, {M, C}).rows(a, b), view(g, {M, Fe}).rows(a, b), W2, Tensor());
      ops::linear_backward(view(dg, {M, Fe}).rows(a, b),
                           view(dw2, {E, C, Fe}).rows(e, e + 1).view({C, Fe}), Tensor(),
                           view(dy, {M, C}).rows(a, b), view(g, {M, Fe}).rows(a, b), W2);
      ops::linear_backward(view(dx, {M, C}).rows(a, b),
                           view(dw1, {E, F1, C}).rows(e, e + 1).view({F1, C}), Tensor(),
                           view(dh, {M, F1}).rows(a, b), view(x, {M, C}).rows(a, b), W1);
    }
  };
  grouped();
  loop();
  grouped16();
  std::vector<double> tg, tl, t16;
  for (int r = 0; r < repeats; ++r) {
    tg.push_back(time_ms(grouped));
    tl.push_back(time_ms(loop));
    t16.push_back(time_ms(grouped16));
  }
  const double flops = 6.0 * static_cast<double>(M) * C * (F1 + Fe);
  const double mg = median_ms(tg), ml = median_ms(tl), m16 = median_ms(t16);
  std::printf(
      "experts E=%lld, rows %lld (expert e gets (e+1)/%lld of them), C=%lld, Fe=%lld "
      "(SwiGLU fc1 %lld rows); %d threads; median of %d\n",
      static_cast<long long>(E), static_cast<long long>(M), static_cast<long long>(E * (E + 1) / 2),
      static_cast<long long>(C), static_cast<long long>(Fe), static_cast<long long>(F1), threads,
      repeats);
  std::printf("grouped (one call per GEMM)  %8.2f ms  %6.1f GFLOP/s\n", mg, flops / mg / 1e6);
  std::printf("loop (one call per expert)   %8.2f ms  %6.1f GFLOP/s\n", ml, flops / ml / 1e6);
  std::printf("loop / grouped: %.3f\n", ml / mg);
  std::printf(
      "grouped, bf16 operands       %8.2f ms  %6.1f GFLOP/s  (%.2fx fp32; oneDNN where "
      "the CPU has AVX512-BF16 and LLMTRAIN_CPU_BF16_GEMM is not blas)\n",
      m16, flops / m16 / 1e6, mg / m16);
  return 0;
}
