// One optimizer step's ops over GPT-2 124M's parameter list (ModelSpec shapes, 148 tensors,
// 124.4M elements, weight decay as the trainer applies it), called per tensor (the loop the
// optimizer ran before the multi-tensor ops) and as one multi-tensor call, in the same process
// on the same buffers, interleaved: AdamW, the grad norm's sum of squares and the overflow check.
// Prints the median time of each and the per-tensor / multi-tensor ratios. CPU only.
//
//   build/scripts/bench/bench_optim [REPEATS (default 7)] [THREADS (default: all cores)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/model_spec.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "scripts/bench/bench_timing.h"

using namespace llmt;
using bench::median_ms;
using bench::time_ms;

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 7;
  const int threads = set_cpu_threads(argc > 2 ? std::atoi(argv[2]) : 0);
  ModelConfig
      cfg;  // GPT-2 124M: the defaults, with the preset's d_ff resolved as config parsing does
  cfg.d_ff = preset_d_ff(cfg.arch, cfg.d_model);
  const ModelSpec spec = ModelSpec::from_config(cfg);
  int64_t total = 0;
  for (const ParamSpec& p : spec.params) total += p.shape.numel();
  std::vector<float> p_buf(total), g_buf(total), m_buf(total, 0.0f), v_buf(total, 0.0f);
  Tensor p_flat(p_buf.data(), {total}, DType::f32), g_flat(g_buf.data(), {total}, DType::f32);
  ops::init_normal(p_flat, 0.02f, 1, 1);
  ops::init_normal(g_flat, 1e-3f, 1, 2);

  std::vector<Tensor> grads;
  std::vector<ops::AdamWTensor> list;
  int64_t off = 0;
  for (const ParamSpec& ps : spec.params) {
    auto at = [&](std::vector<float>& b) { return Tensor(b.data() + off, ps.shape, DType::f32); };
    list.push_back({at(p_buf), at(g_buf), at(m_buf), at(v_buf), ps.decay});
    grads.push_back(at(g_buf));
    off += ps.shape.numel();
  }
  ops::AdamWParams hp{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f};

  auto adamw_per_tensor = [&] {
    for (const ops::AdamWTensor& t : list) {
      ops::AdamWParams one = hp;
      one.weight_decay = t.decay ? hp.weight_decay : 0.0f;
      ops::adamw_update(t.param, t.grad, t.m, t.v, one);
    }
  };
  auto adamw_multi = [&] { ops::adamw_update(list, hp); };
  double sink = 0.0;
  auto sum_per_tensor = [&] {
    double s = 0.0;
    for (const Tensor& g : grads) s += ops::sum_squares(g);
    sink += s;
  };
  auto sum_multi = [&] { sink += ops::sum_squares(grads); };
  auto check_per_tensor = [&] {
    bool bad = false;
    for (const Tensor& g : grads) bad |= ops::has_nonfinite(g);
    sink += bad;
  };
  auto check_multi = [&] { sink += ops::has_nonfinite(grads); };

  struct Pair {
    const char* name;
    std::function<void()> per_tensor, multi;
    std::vector<double> t_per, t_multi;
  };
  std::vector<Pair> pairs{{"adamw_update", adamw_per_tensor, adamw_multi, {}, {}},
                          {"sum_squares", sum_per_tensor, sum_multi, {}, {}},
                          {"has_nonfinite", check_per_tensor, check_multi, {}, {}}};
  for (int r = 0; r < repeats + 1; ++r) {  // round 0 warms up (page faults on first touch)
    for (Pair& p : pairs) {
      ++hp.step;
      const double a = time_ms(p.per_tensor);
      ++hp.step;
      const double b = time_ms(p.multi);
      if (r > 0) {
        p.t_per.push_back(a);
        p.t_multi.push_back(b);
      }
    }
  }
  double load[1] = {0.0};
  getloadavg(load, 1);
  std::printf(
      "GPT-2 124M parameter list: %zu tensors, %lld elements; %d threads, %u cores, load "
      "average %.1f, median of %d\n",
      list.size(), static_cast<long long>(total), threads, std::thread::hardware_concurrency(),
      load[0], repeats);
  std::printf("%-14s %14s %14s %18s\n", "op", "per-tensor ms", "multi ms", "per-tensor/multi");
  for (const Pair& p : pairs) {
    const double a = median_ms(p.t_per), b = median_ms(p.t_multi);
    std::printf("%-14s %14.2f %14.2f %17.3fx\n", p.name, a, b, a / b);
  }
  return sink == -1.0;  // keeps the reductions from being optimised away
}
