// Single-rank trainer. Everything is allocated once before the first step; the loop only calls
// into the model, the optimizer and the metrics writer.
#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "checkpoints/checkpoint.h"
#include "data/blend.h"
#include "data/gpt_dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "engine/core/peak_flops.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/data_parallel/data_parallel.h"
#include "engine/pipeline/executor.h"
#include "engine/train/metrics.h"
#include "kernels/ops.h"
#include "kernels/threads.h"

namespace llmt {

namespace fs = std::filesystem;

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::fp32:
      return DType::f32;
    case Precision::bf16:
      return DType::bf16;
    case Precision::fp16:
      return DType::f16;
  }
  return DType::f32;
}

namespace {

// Writes every parameter (`flat`: all of them at global shape, spec order) as params.json +
// params.bin (docs/model.md, "Debug dump").
void dump_params(const fs::path& dir, const ModelSpec& spec, const std::vector<float>& flat) {
  fs::create_directories(dir);
  std::ofstream js(dir / "params.json");
  std::ofstream bin(dir / "params.bin", std::ios::binary);
  js << "{\"params\": [";
  int64_t offset = 0;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamSpec& p = spec.params[i];
    js << (i ? ",\n  " : "\n  ") << "{\"name\": \"" << p.name << "\", \"shape\": [";
    for (int d = 0; d < p.shape.ndim(); ++d) js << (d ? ", " : "") << p.shape[d];
    js << "], \"offset\": " << offset << "}";
    offset += p.shape.numel();
  }
  bin.write(reinterpret_cast<const char*>(flat.data()),
            static_cast<std::streamsize>(flat.size() * 4));
  js << "\n]}\n";
  if (!js || !bin) throw Error("writing the parameter dump to " + dir.string() + " failed");
}

// The train and valid samples of [data]: the synthetic process, or GPT samples of one dataset or
// of a blend. Each dataset's token ids are checked against model.vocab_size first.
struct DataSources {
  std::shared_ptr<const SampleSource> train;
  std::shared_ptr<const SampleSource> valid;  // only with train.eval_interval > 0
};

DataSources make_data_sources(const Config& cfg, bool verbose) {
  const DataConfig& d = cfg.data;
  const int64_t V = cfg.model.vocab_size, T = cfg.model.seq_len;
  const bool eval = cfg.train.eval_interval > 0;
  DataSources out;
  if (d.source == DataSource::synthetic) {
    out.train = std::make_shared<SyntheticSamples>(d.seed, V, T + 1);
    // Validation: samples of the same process from 2^40 on, which no run trains on.
    if (eval) out.valid = std::make_shared<SyntheticSamples>(d.seed, V, T + 1, int64_t{1} << 40);
    return out;
  }
  std::optional<Tokenizer> tok;
  if (!d.tokenizer.empty()) {
    tok.emplace(d.tokenizer);
    if (tok->vocab_size() > V)
      throw ConfigError(
          detail::concat("model.vocab_size=", V, " is smaller than the vocabulary of ",
                         "data.tokenizer=", d.tokenizer, " (", tok->vocab_size(), ")"));
  }
  std::vector<DataSourceConfig> entries = d.sources;
  if (!d.path.empty()) entries.push_back({d.path, 1.0});
  const SplitWeights split = *parse_split(d.split);
  double total_weight = 0;
  for (const DataSourceConfig& e : entries) total_weight += e.weight;
  std::vector<std::shared_ptr<const SampleSource>> train, valid;
  std::vector<double> weights;
  for (const DataSourceConfig& e : entries) {
    std::shared_ptr<const IndexedDataset> data = IndexedDataset::open(e.path);
    try {
      data->verify_tokens(V);
    } catch (const Error& err) {
      throw ConfigError(detail::concat("model.vocab_size=", V, " is too small for dataset ", e.path,
                                       ": ", err.what(),
                                       "; set model.vocab_size to at least the tokenizer's "
                                       "vocabulary size"));
    }
    auto t = std::make_shared<GptDataset>(data, Split::train, split, d.seed, T);
    if (verbose) {
      const double run_samples = static_cast<double>(cfg.train.steps * cfg.train.global_batch_size);
      std::printf(
          "data: %s: %lld documents, %lld tokens; train split: %lld documents, %lld "
          "tokens, %lld samples per epoch; this run reads %.2f epochs of it\n",
          e.path.c_str(), static_cast<long long>(data->num_sequences()),
          static_cast<long long>(data->num_tokens()), static_cast<long long>(t->num_documents()),
          static_cast<long long>(t->tokens_per_epoch()),
          static_cast<long long>(t->samples_per_epoch()),
          run_samples * e.weight / total_weight / static_cast<double>(t->samples_per_epoch()));
    }
    train.push_back(t);
    if (eval) valid.push_back(std::make_shared<GptDataset>(data, Split::valid, split, d.seed, T));
    weights.push_back(e.weight);
  }
  auto combine = [&](const std::vector<std::shared_ptr<const SampleSource>>& parts)
      -> std::shared_ptr<const SampleSource> {
    if (parts.size() == 1) return parts[0];
    return std::make_shared<Blend>(parts, weights);
  };
  out.train = combine(train);
  if (eval) out.valid = combine(valid);
  if (tok && verbose) {
    std::vector<int32_t> sample(static_cast<size_t>(T + 1));
    out.train->fill(sample.data(), 0, 1);
    std::string text = tok->decode(sample);
    size_t cut = std::min<size_t>(text.size(), 160);
    while (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    if (cut < text.size()) text = text.substr(0, cut) + "...";  // at a UTF-8 character boundary
    for (char& ch : text)
      if (static_cast<unsigned char>(ch) < 0x20) ch = ' ';  // one log line
    std::printf("data: sample 0: \"%s\"\n", text.c_str());
  }
  return out;
}

// Every pp rank's stage parameters (host f32, global shapes, its stage spec's order) -> the
// whole model in `spec` order on pp rank 0 (blocking sends to it; a tied copy of wte is left
// out). Other ranks' `out` is left empty.
void gather_pp_params(Communicator& pp, const ModelSpec& spec, const ParallelConfig& par,
                      const std::vector<float>& local, std::vector<float>& out) {
  const int p = pp.size();
  if (pp.rank() != 0) {
    pp.send(Tensor(const_cast<float*>(local.data()), {static_cast<int64_t>(local.size())},
                   DType::f32),
            0, 0)
        .wait();
    out.clear();
    return;
  }
  std::vector<int64_t> offset(spec.params.size() + 1, 0);
  for (size_t i = 0; i < spec.params.size(); ++i)
    offset[i + 1] = offset[i] + spec.params[i].global_shape.numel();
  out.assign(static_cast<size_t>(offset.back()), 0.0f);
  std::vector<float> part;
  for (int r = 0; r < p; ++r) {
    const ModelSpec stage =
        spec.shard_pp(p, static_cast<int>(par.virtual_stages), par.pp_layers, r);
    const std::vector<float>* src = &local;
    if (r != 0) {
      part.resize(static_cast<size_t>(stage.num_params()));
      pp.recv(Tensor(part.data(), {static_cast<int64_t>(part.size())}, DType::f32), r, 0).wait();
      src = &part;
    }
    LLMT_CHECK(src->size() == static_cast<size_t>(stage.num_params()), "pp rank ", r, " sent ",
               src->size(), " parameter values, its stage holds ", stage.num_params());
    int64_t off = 0;
    for (const ParamSpec& ps : stage.params) {
      const int64_t n = ps.global_shape.numel();
      if (!ps.tied_copy) {
        const size_t i = spec.index_of(ps.name);
        std::copy(src->begin() + off, src->begin() + off + n, out.begin() + offset[i]);
      }
      off += n;
    }
  }
}

// This step's traffic per mesh axis and axis group (groups of one rank move nothing and are left
// out).
std::vector<std::pair<std::string, CommCounters>> take_comm_counters(Mesh& mesh) {
  std::vector<std::pair<std::string, CommCounters>> out;
  for (Communicator* c : mesh.communicators()) {
    if (c->size() > 1) out.emplace_back(c->name(), c->counters());
    c->reset_counters();
  }
  return out;
}

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& opts) {
  Mesh mesh = Mesh::create(MeshShape{}, make_local_communicator("world"));
  validate_layout(cfg, 1);
  return train(cfg, opts, mesh);
}

TrainResult train(const Config& cfg, const TrainOptions& opts, Mesh& mesh) {
  const bool rank0 = mesh.rank() == 0;
  const int64_t dp = mesh.size(Axis::dp), dp_rank = mesh.coord(Axis::dp);
  const int threads = set_cpu_threads(static_cast<int>(cfg.train.threads));
  // One GPU per rank: the rank's index on its node (0 when not launched by mpirun/srun).
  // Multi-rank GPU runs need a mesh whose groups route device buffers to NCCL
  // (make_device_routed, built by the app before the mesh).
  auto backend = make_device_backend(select_device(cfg.train.device, local_rank_from_env()));
  Allocator alloc(*backend);

  const ModelSpec spec = ModelSpec::from_config(cfg.model);
  // The checkpoint to resume from, checked against the model before anything is allocated.
  std::optional<ckpt::Checkpoint> resume;
  if (std::optional<std::string> path = ckpt::resolve_load(cfg.checkpoint)) {
    resume.emplace(*path);
    ckpt::check_model(*resume, spec);
  }
  if (rank0)
    for (const std::string& name : ckpt::remove_leftovers(cfg.checkpoint.dir))
      std::printf("checkpoint: removed %s/%s, left by a save that did not finish\n",
                  cfg.checkpoint.dir.c_str(), name.c_str());
  // Pipeline parallelism: this rank's stage of the model (its chunks' layers, the embeddings on
  // pp rank 0, the head on the last) and the executor that runs the schedule's actions for it.
  const int pp = mesh.size(Axis::pp), pp_rank = mesh.coord(Axis::pp);
  const int virtual_stages = static_cast<int>(cfg.parallel.virtual_stages);
  const ModelSpec stage_spec =
      pp > 1 ? spec.shard_pp(pp, virtual_stages, cfg.parallel.pp_layers, pp_rank) : spec;
  const int64_t T = cfg.model.seq_len, gbs = cfg.train.global_batch_size;
  // Each dp rank runs `accum` micro-batches of its slice of the global batch.
  const int64_t mbs = cfg.train.micro_batch_size, accum = grad_accum_steps(cfg) / dp;
  // Under tp the model holds this rank's shards (ModelSpec::shard_tp); every rank of a tp group
  // reads the same micro-batches.
  const TensorParallel tp{&mesh.comm(Axis::tp), cfg.parallel.sequence_parallel};
  Transformer model(stage_spec, alloc, mbs, compute_dtype(cfg.train.precision),
                    model_storage(cfg.parallel.zero_stage), tp,
                    {cfg.train.recompute, cfg.train.recompute_layers});
  if (cfg.parallel.zero_stage < 3) model.init(cfg.train.seed);
  std::unique_ptr<DataParallel> data_parallel =
      make_data_parallel(cfg.parallel, cfg.optimizer, mesh, model, alloc, cfg.train.seed);
  model.set_hooks(data_parallel.get());
  std::optional<PipelineExecutor> pipeline;
  double predicted_bubble = 0;
  // Tied embeddings under pp: stage 0's wte and the last stage's copy form the embedding group,
  // whose gradients are summed before the update (Megatron's embedding group).
  std::unique_ptr<Communicator> embedding_group;
  if (pp > 1) {
    pipeline.emplace(
        make_schedule(cfg.parallel.pp_schedule, {pp, virtual_stages, static_cast<int>(accum)}),
        model, mesh.comm(Axis::pp), alloc);
    predicted_bubble = simulate(pipeline->schedule()).bubble_fraction;
    if (cfg.model.tie_embeddings) {
      const bool ends = pp_rank == 0 || pp_rank == pp - 1;
      embedding_group = mesh.comm(Axis::pp).split(ends ? 0 : 1, pp_rank, "embedding");
      if (!ends) embedding_group.reset();
    }
  }
  LossScaler scaler(cfg.optimizer, cfg.train.precision == Precision::fp16);
  int64_t start_step = 0, updates = 0, consumed = 0;
  if (resume) {
    const ckpt::RunState& rs = resume->state();
    const auto t_load = std::chrono::steady_clock::now();
    const int64_t bytes = ckpt::load(*resume, model.spec(), *data_parallel, *backend);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    scaler.restore({static_cast<float>(rs.loss_scale), rs.loss_scale_clean_steps});
    start_step = rs.step;
    updates = rs.updates;
    consumed = rs.consumed_samples;
    if (rank0 && !opts.quiet)
      std::printf(
          "checkpoint: resumed from %s (step %lld, written at %s; rank 0 read %.1f MB in "
          "%.2f s, %.2f GB/s)\n",
          resume->dir().c_str(), static_cast<long long>(rs.step), ckpt::layout_text(rs).c_str(),
          static_cast<double>(bytes) / 1e6, load_s,
          static_cast<double>(bytes) / 1e9 / std::max(load_s, 1e-9));
    LLMT_CHECK(consumed <= cfg.train.steps * gbs || start_step >= cfg.train.steps, "checkpoint ",
               resume->dir(), " consumed ", consumed, " samples");
  }
  const DataSources data = make_data_sources(cfg, rank0 && !opts.quiet);
  const BatchLayout layout{gbs, mbs, dp_rank, dp};
  DataLoader loader(data.train, layout, std::min(consumed, cfg.train.steps * gbs),
                    std::max(consumed, cfg.train.steps * gbs));

  // Token staging: the device inputs/targets (mbs, T), cut from a micro-batch's windows
  // (mbs, T+1) on the host; under pp one pair per micro-batch of the step (every pp rank of a dp
  // group reads the same ones; the first and last stage use them).
  const int64_t slots = pp > 1 ? accum : 1;
  Buffer tok_buf = alloc.allocate_tensor({slots, 2, mbs, T}, DType::i32, MemCategory::other);
  auto inputs_of = [&](int64_t slot) {
    return tok_buf.tensor({mbs, T}, DType::i32, static_cast<size_t>(2 * slot * mbs * T) * 4);
  };
  auto targets_of = [&](int64_t slot) {
    return tok_buf.tensor({mbs, T}, DType::i32, static_cast<size_t>((2 * slot + 1) * mbs * T) * 4);
  };
  Tensor inputs = inputs_of(0), targets = targets_of(0);
  std::vector<int32_t> host_in(static_cast<size_t>(mbs * T)), host_tg(host_in.size());
  auto stage = [&](const MicroBatch& mb, int64_t slot = 0) {
    for (int64_t b = 0; b < mbs; ++b)
      for (int64_t t = 0; t < T; ++t) {
        host_in[b * T + t] = mb.tokens[b * (T + 1) + t];
        host_tg[b * T + t] = mb.tokens[b * (T + 1) + t + 1];
      }
    backend->copy_from_host(inputs_of(slot).data, host_in.data(), inputs.nbytes());
    backend->copy_from_host(targets_of(slot).data, host_tg.data(), targets.nbytes());
  };
  std::vector<PipelineMicroBatch> pipe_mbs(static_cast<size_t>(slots));

  if (rank0) fs::create_directories(cfg.train.run_dir);
  MetricsWriter metrics(cfg.log.metrics.empty() || !rank0
                            ? ""
                            : (fs::path(cfg.train.run_dir) / cfg.log.metrics).string(),
                        start_step);
  std::ofstream dump_tokens;
  std::vector<float> host_params;
  auto gather_params = [&]() {
    data_parallel->gather_params(host_params);
    if (pp > 1) {
      std::vector<float> local;
      local.swap(host_params);
      gather_pp_params(mesh.comm(Axis::pp), spec, cfg.parallel, local, host_params);
    }
  };
  if (!opts.dump_dir.empty()) {
    gather_params();
    if (rank0) {
      dump_params(opts.dump_dir, spec, host_params);
      dump_tokens.open(fs::path(opts.dump_dir) / "tokens.bin", std::ios::binary);
    }
  }
  std::vector<int32_t> global_window;
  // Losses are averaged over the world: every rank of a dp group saw different samples, tp/cp
  // ranks of one group the same.
  Communicator& world = mesh.world();
  auto world_mean = [&](double v) {
    if (world.size() == 1) return v;
    float x = static_cast<float>(v);
    world.all_reduce(Tensor(&x, {1}, DType::f32)).wait();
    return static_cast<double>(x) / world.size();
  };
  // Validation: the mean loss over train.eval_iters global batches of the valid split (the same
  // ones every time), each rank taking its slices as in training.
  auto evaluate = [&](int64_t step) {
    DataLoader valid(data.valid, layout, 0, cfg.train.eval_iters * gbs);
    const int64_t n = cfg.train.eval_iters * layout.micro_batches();
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const MicroBatch& mb = valid.next();
      stage(mb);
      const StepContext ctx{cfg.train.seed, step, mb.first_sample, /*dropout=*/false};
      sum += pipeline ? pipeline->forward_loss({inputs, targets, ctx})
                      : model.forward_loss(inputs, targets, ctx);
    }
    return world_mean(sum / static_cast<double>(n));
  };

  // log.peak_flops is per rank; the step's FLOPs are the whole world's. A GPU whose peak is not
  // known gives 0: MFU is then reported as 0, and rank 0 says to set log.peak_flops.
  const double rank_peak =
      cfg.log.peak_flops > 0
          ? cfg.log.peak_flops
          : default_peak_flops(backend->device(), compute_dtype(cfg.train.precision), threads);
  if (rank_peak <= 0 && rank0 && !opts.quiet)
    std::printf(
        "note: the peak FLOP/s of this GPU is not known; MFU reads 0 until log.peak_flops "
        "is set\n");
  const double peak = rank_peak * static_cast<double>(mesh.shape().world());
  const double flops_per_step = spec.flops_per_token() * static_cast<double>(gbs * T);
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  TrainResult result;
  if (rank0 && !opts.quiet && start_step >= cfg.train.steps)
    std::printf("checkpoint: step %lld is already >= train.steps=%lld; nothing to train\n",
                static_cast<long long>(start_step), static_cast<long long>(cfg.train.steps));
  // Checkpoints: at most one save in flight (checkpoint.async writes in the background and is
  // polled at every step end; a synchronous one completes where it starts).
  std::unique_ptr<ckpt::PendingSave> pending;
  HostBuffer ckpt_staging;  // async saves' snapshot (pinned on a GPU), reused from save to save
  auto report = [&](const ckpt::SaveResult& r) {
    if (rank0 && !opts.quiet)
      std::printf(
          "checkpoint: saved %s (%.1f MB; rank 0 wrote its file in %.2f s, %.2f GB/s over all "
          "ranks; training blocked %.2f s)\n",
          r.path.c_str(), static_cast<double>(r.bytes) / 1e6, r.write_seconds,
          static_cast<double>(r.bytes) / 1e9 / std::max(r.write_seconds, 1e-9), r.blocked_seconds);
  };
  auto poll_checkpoint = [&](bool wait) {
    if (pending && pending->poll(wait)) {
      report(pending->result());
      pending.reset();
    }
  };
  auto start_checkpoint = [&](int64_t step) {
    poll_checkpoint(true);
    const LossScaler::State sc = scaler.state();
    ckpt::RunState rs;
    rs.step = step;
    rs.updates = updates;
    rs.consumed_samples = consumed + (step - start_step) * gbs;
    rs.loss_scale = sc.scale;
    rs.loss_scale_clean_steps = sc.clean_steps;
    rs.seed = static_cast<int64_t>(cfg.train.seed);
    rs.config = to_toml(cfg);
    rs.mesh = mesh.shape();
    rs.zero_stage = cfg.parallel.zero_stage;
    rs.sequence_parallel = cfg.parallel.sequence_parallel;
    rs.virtual_stages = cfg.parallel.virtual_stages;
    rs.pp_layers = cfg.parallel.pp_layers;
    pending =
        std::make_unique<ckpt::PendingSave>(cfg.checkpoint, rs, spec, model.spec(), *data_parallel,
                                            mesh, *backend, cfg.checkpoint.async, &ckpt_staging);
    if (!cfg.checkpoint.async) poll_checkpoint(true);
  };
  const int64_t last_step =
      opts.stop_after > 0 ? std::min(opts.stop_after, cfg.train.steps) : cfg.train.steps;
  for (int64_t step = start_step + 1; step <= last_step; ++step) {
    const auto t0 = clock::now();
    data_parallel->start_step();
    const float scale = scaler.scale();
    if (dump_tokens.is_open()) {
      global_window.resize(static_cast<size_t>(gbs * (T + 1)));
      data.train->fill(global_window.data(), (step - 1) * gbs, gbs);
      dump_tokens.write(reinterpret_cast<const char*>(global_window.data()),
                        static_cast<std::streamsize>(global_window.size() * 4));
    }
    double loss_sum = 0;
    // Pre-scaled by 1/dp as well: the dp sum of the gradients is the global-batch mean.
    const float dloss = scale / static_cast<float>(accum * dp);
    if (!pipeline) {
      for (int64_t micro = 0; micro < accum; ++micro) {
        // This dp rank's slice of the step's global batch (BatchLayout).
        const MicroBatch& mb = loader.next();
        stage(mb);
        StepContext ctx{cfg.train.seed, step, mb.first_sample};
        data_parallel->start_micro_batch(micro + 1 == accum);
        loss_sum += model.forward_backward(inputs, targets, dloss, ctx);
      }
    } else {
      for (int64_t micro = 0; micro < accum; ++micro) {
        const MicroBatch& mb = loader.next();
        stage(mb, micro);
        pipe_mbs[static_cast<size_t>(micro)] = {inputs_of(micro), targets_of(micro),
                                                StepContext{cfg.train.seed, step, mb.first_sample}};
      }
      loss_sum = static_cast<double>(accum) * pipeline->run(pipe_mbs, dloss, [&](bool last) {
        data_parallel->start_micro_batch(last);
      });
    }
    data_parallel->finish_backward();
    if (embedding_group) {
      // Both copies of the tied wte get the sum of their (dp-reduced) gradients: the same rows
      // on both ends, whose dp coordinates are the same.
      Tensor g = data_parallel->owned_grad(model.spec().index_of("wte.weight"));
      if (g.defined()) embedding_group->all_reduce(g).wait();
    }
    StepMetrics m;
    m.step = step;
    m.steps = cfg.train.steps;
    m.loss = world_mean(loss_sum / static_cast<double>(accum));
    m.lr = lr_at(cfg.optimizer, step);
    m.loss_scale = scale;

    // The gradients hold scale * dL/dw: overflow shows as inf/nan whatever the scale, the norm
    // is divided by it, and unscaling and clipping are fused into AdamW's read of the gradient.
    bool overflow = cfg.train.precision == Precision::fp16 && data_parallel->grads_nonfinite();
    double grad_norm = data_parallel->grad_norm();
    if (pp > 1) {  // each stage's norm covers its parameters: sum the squares over pp
      double v[2] = {grad_norm * grad_norm, overflow ? 1.0 : 0.0};
      mesh.comm(Axis::pp).all_reduce(Tensor(v, {2}, DType::f64)).wait();
      grad_norm = std::sqrt(v[0]);
      overflow = v[1] > 0;
    }
    m.skipped = scaler.update(overflow);
    m.grad_norm = grad_norm / scale;
    if (!m.skipped) {
      const double coef = clip_coefficient(cfg.optimizer, m.grad_norm);
      data_parallel->step(m.lr, ++updates, static_cast<float>(coef / scale));
    }
    backend->synchronize();

    const auto t1 = clock::now();
    m.step_time_s = std::chrono::duration<double>(t1 - t0).count();
    m.tokens_per_s = static_cast<double>(gbs * T) / m.step_time_s;
    m.mfu = peak > 0 ? flops_per_step / m.step_time_s / peak : 0.0;
    m.mem = alloc.stats();
    m.comm = take_comm_counters(mesh);
    m.comm_wait_s = data_parallel->take_wait_seconds();
    if (pipeline) {
      float idle = static_cast<float>((pipeline->total_seconds() - pipeline->busy_seconds()) /
                                      pipeline->busy_seconds());
      mesh.comm(Axis::pp).all_reduce(Tensor(&idle, {1}, DType::f32)).wait();
      m.pp_bubble = idle / static_cast<float>(pp);
      m.pp_bubble_predicted = predicted_bubble;
    }
    m.data_wait_s = loader.take_wait_seconds();
    if (cfg.train.eval_interval > 0 && step % cfg.train.eval_interval == 0)
      m.val_loss = evaluate(step);
    const CheckpointConfig& ck = cfg.checkpoint;
    const bool save_due =
        !ck.dir.empty() && ((ck.interval > 0 && step % ck.interval == 0) || step == last_step);
    if (save_due || pending) {
      const auto tc = clock::now();
      if (save_due) {
        start_checkpoint(step);
      } else {
        poll_checkpoint(false);
      }
      m.checkpoint_s = std::chrono::duration<double>(clock::now() - tc).count();
    }
    metrics.write(m);
    if (rank0 && !opts.quiet && cfg.log.progress &&
        (step % cfg.log.interval == 0 || step == 1 || step == cfg.train.steps || m.val_loss)) {
      const double elapsed = std::chrono::duration<double>(t1 - t_start).count();
      const double eta =
          elapsed / static_cast<double>(step) * static_cast<double>(cfg.train.steps - step);
      std::printf("%s\n", progress_line(m, eta).c_str());
      std::fflush(stdout);
    }
    result.steps = step;
    result.final_loss = m.loss;
  }
  poll_checkpoint(true);  // an async save of the last step completes before the run ends
  if (!opts.dump_final.empty()) {
    gather_params();
    if (rank0) dump_params(opts.dump_final, spec, host_params);
  }
  model.set_hooks(nullptr);
  return result;
}

}  // namespace llmt
