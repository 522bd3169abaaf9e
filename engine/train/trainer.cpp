// Single-rank trainer. Everything is allocated once before the first step; the loop only calls
// into the model, the optimizer and the metrics writer.
#include "engine/train/trainer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "data/synthetic.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/train/metrics.h"
#include "kernels/ops.h"
#include "kernels/threads.h"

namespace llmt {

namespace fs = std::filesystem;

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::fp32: return DType::f32;
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
  }
  return DType::f32;
}

double default_peak_flops(int threads) {
  const double flop_per_cycle = __builtin_cpu_supports("avx512f") ? 64.0 : 32.0;
  return threads * 4.1e9 * flop_per_cycle;
}

namespace {

// Writes the initial weights as params.json + params.bin (docs/model.md, "Debug dump").
void dump_params(const fs::path& dir, const ModelSpec& spec, const Transformer& model,
                 Allocator& alloc) {
  std::ofstream js(dir / "params.json");
  std::ofstream bin(dir / "params.bin", std::ios::binary);
  js << "{\"params\": [";
  int64_t offset = 0;
  std::vector<float> host;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamSpec& p = spec.params[i];
    js << (i ? ",\n  " : "\n  ") << "{\"name\": \"" << p.name << "\", \"shape\": [";
    for (int d = 0; d < p.shape.ndim(); ++d) js << (d ? ", " : "") << p.shape[d];
    js << "], \"offset\": " << offset << "}";
    const Tensor& t = model.params()[i];
    host.resize(static_cast<size_t>(t.numel()));
    alloc.backend().copy_to_host(host.data(), t.data, t.nbytes());
    bin.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(t.nbytes()));
    offset += t.numel();
  }
  js << "\n]}\n";
  if (!js || !bin) throw Error("writing the parameter dump to " + dir.string() + " failed");
}

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& opts) {
  const int threads = set_cpu_threads(static_cast<int>(cfg.train.threads));
  auto backend = make_device_backend(cfg.train.device == "cuda" ? Device{DeviceKind::cuda, 0}
                                                                : Device{DeviceKind::cpu, 0});
  Allocator alloc(*backend);

  const ModelSpec spec = ModelSpec::from_config(cfg.model);
  const int64_t T = cfg.model.seq_len, gbs = cfg.train.global_batch_size;
  const int64_t mbs = cfg.train.micro_batch_size, accum = grad_accum_steps(cfg);
  Transformer model(spec, alloc, mbs, compute_dtype(cfg.train.precision));
  model.init(cfg.train.seed);
  std::vector<bool> decay;
  for (const auto& p : spec.params) decay.push_back(p.decay);
  AdamW adamw(cfg.optimizer, alloc, model.params(), decay);
  LossScaler scaler(cfg.optimizer, cfg.train.precision == Precision::fp16);
  SyntheticSource source(cfg.data.seed, cfg.model.vocab_size);

  // Token staging: the host window (mbs, T+1) and the device inputs/targets (mbs, T).
  Buffer tok_buf = alloc.allocate_tensor({2, mbs, T}, DType::i32, MemCategory::other);
  Tensor inputs = tok_buf.tensor({mbs, T}, DType::i32);
  Tensor targets = tok_buf.tensor({mbs, T}, DType::i32, static_cast<size_t>(mbs * T) * 4);
  std::vector<int32_t> window(static_cast<size_t>(mbs * (T + 1)));
  std::vector<int32_t> host_in(static_cast<size_t>(mbs * T)), host_tg(host_in.size());

  fs::create_directories(cfg.train.run_dir);
  MetricsWriter metrics(cfg.log.metrics.empty() ? "" : (fs::path(cfg.train.run_dir) / cfg.log.metrics).string());
  std::ofstream dump_tokens;
  if (!opts.dump_dir.empty()) {
    fs::create_directories(opts.dump_dir);
    dump_params(opts.dump_dir, spec, model, alloc);
    dump_tokens.open(fs::path(opts.dump_dir) / "tokens.bin", std::ios::binary);
  }

  const double peak = cfg.log.peak_flops > 0 ? cfg.log.peak_flops : default_peak_flops(threads);
  const double flops_per_step = spec.flops_per_token() * static_cast<double>(gbs * T);
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  TrainResult result;
  int64_t updates = 0;
  for (int64_t step = 1; step <= cfg.train.steps; ++step) {
    const auto t0 = clock::now();
    model.zero_grads();
    const float scale = scaler.scale();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      const int64_t first = (step - 1) * gbs + micro * mbs;
      source.fill(window.data(), first, mbs, T + 1);
      if (dump_tokens.is_open())
        dump_tokens.write(reinterpret_cast<const char*>(window.data()),
                          static_cast<std::streamsize>(window.size() * 4));
      for (int64_t b = 0; b < mbs; ++b)
        for (int64_t t = 0; t < T; ++t) {
          host_in[b * T + t] = window[b * (T + 1) + t];
          host_tg[b * T + t] = window[b * (T + 1) + t + 1];
        }
      backend->copy_from_host(inputs.data, host_in.data(), inputs.nbytes());
      backend->copy_from_host(targets.data, host_tg.data(), targets.nbytes());
      StepContext ctx{cfg.train.seed, step, first};
      loss_sum += model.forward_backward(inputs, targets, scale / static_cast<float>(accum), ctx);
    }
    StepMetrics m;
    m.step = step;
    m.steps = cfg.train.steps;
    m.loss = loss_sum / static_cast<double>(accum);
    m.lr = lr_at(cfg.optimizer, step);
    m.loss_scale = scale;

    // The gradients hold scale * dL/dw: overflow shows as inf/nan whatever the scale, the norm
    // is divided by it, and unscaling and clipping are fused into AdamW's read of the gradient.
    Tensor flat_grads = model.flat_grads();
    const bool overflow = cfg.train.precision == Precision::fp16 && ops::has_nonfinite(flat_grads);
    m.skipped = scaler.update(overflow);
    m.grad_norm = global_norm({flat_grads}) / scale;
    if (!m.skipped) {
      const double coef = clip_coefficient(cfg.optimizer, m.grad_norm);
      adamw.step(model.params(), model.grads(), m.lr, ++updates, static_cast<float>(coef / scale));
      model.sync_compute_weights();
    }
    backend->synchronize();

    const auto t1 = clock::now();
    m.step_time_s = std::chrono::duration<double>(t1 - t0).count();
    m.tokens_per_s = static_cast<double>(gbs * T) / m.step_time_s;
    m.mfu = flops_per_step / m.step_time_s / peak;
    m.mem = alloc.stats();
    metrics.write(m);
    if (!opts.quiet && cfg.log.progress &&
        (step % cfg.log.interval == 0 || step == 1 || step == cfg.train.steps)) {
      const double elapsed = std::chrono::duration<double>(t1 - t_start).count();
      const double eta = elapsed / static_cast<double>(step) * static_cast<double>(cfg.train.steps - step);
      std::printf("%s\n", progress_line(m, eta).c_str());
      std::fflush(stdout);
    }
    result.steps = step;
    result.final_loss = m.loss;
  }
  return result;
}

}  // namespace llmt
