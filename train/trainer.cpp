// One rank's run (trainer.h): construction (the model stage, the data-parallel strategy, the
// pipeline stage, the resumed state, the data), then the loop around Step (train/step.h): stop
// requests, the time limit, evaluation, checkpoints, metrics and the run's failures. Everything
// is allocated before the first step.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>
#include <vector>

#include "checkpoints/checkpoint.h"
#include "core/file_memory.h"
#include "core/peak_flops.h"
#include "data/blend.h"
#include "data/gpt_dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "engine/data_parallel/data_parallel.h"
#include "engine/model/parallelize.h"
#include "engine/model/transformer.h"
#include "engine/pipeline/stage.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "train/fault.h"
#include "train/metrics.h"
#include "train/rank_model.h"
#include "train/run_guard.h"
#include "train/run_lock.h"
#include "train/step.h"
#include "train/stop.h"
#include "train/tensorboard.h"

namespace llmt {

namespace fs = std::filesystem;

DType grad_dtype(const TrainConfig& t) {
  return t.grad_dtype == GradDType::compute ? compute_dtype(t.precision) : DType::f32;
}

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

// [offload] "nvme": the store of this rank's files (null without offload). The files are host
// memory the CPU kernels read in place; a GPU's state would need streaming to the device.
std::unique_ptr<FileStore> make_offload_store(const OffloadConfig& c, Device device) {
  if (!c.any()) return nullptr;
  if (device.kind != DeviceKind::cpu)
    throw Error(
        "[offload] \"nvme\" runs on the CPU backend (train.device=\"cpu\"); streaming "
        "offloaded state to a GPU is not built yet");
  return std::make_unique<FileStore>(c.nvme_dir, static_cast<size_t>(c.buffer_mb * 1024 * 1024));
}

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

// `valid` holds the valid split, or with `test_split` the test split (llmtrain eval).
DataSources make_data_sources(const Config& cfg, bool verbose, bool test_split) {
  const DataConfig& d = cfg.data;
  const int64_t V = cfg.model.vocab_size, T = cfg.model.seq_len;
  const bool eval = cfg.train.eval_interval > 0;
  DataSources out;
  if (d.source == DataSource::synthetic) {
    out.train = std::make_shared<SyntheticSamples>(d.seed, V, T + 1);
    // Validation: samples of the same process from 2^40 on, which no run trains on; the test
    // split from 2^41 on.
    if (eval)
      out.valid = std::make_shared<SyntheticSamples>(d.seed, V, T + 1,
                                                     int64_t{1} << (test_split ? 41 : 40));
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
    if (eval)
      valid.push_back(std::make_shared<GptDataset>(data, test_split ? Split::test : Split::valid,
                                                   split, d.seed, T));
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
    const ModelSpec stage = spec.shard_pp(p, static_cast<int>(par.virtual_stages), par.pp_layers, r,
                                          v_shaped(par.pp_schedule));
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

// This step's traffic per mesh axis and axis group, then per group the model split off (groups of
// one rank move nothing and are left out).
std::vector<std::pair<std::string, CommCounters>> take_comm_counters(
    Mesh& mesh, const std::vector<Communicator*>& more) {
  std::vector<std::pair<std::string, CommCounters>> out;
  std::vector<Communicator*> all = mesh.communicators();
  all.insert(all.end(), more.begin(), more.end());
  for (Communicator* c : all) {
    if (c->size() > 1) out.emplace_back(c->name(), c->counters());
    c->reset_counters();
  }
  return out;
}

}  // namespace

// Everything one rank's run holds, built in the order the old single function built it (the
// collectives of construction — mesh groups, checkpoint load, the embedding group — run in the
// same order on every rank). The step itself is Step's (train/step.h); this is the loop around
// it: construction, the resumed position, stop requests, evaluation, checkpoints, metrics.
struct Trainer::State {
  State(const Config& c, const TrainOptions& o, Mesh& m)
      : cfg(c),
        opts(o),
        mesh(m),
        rank0(m.rank() == 0),
        dp(m.size(Axis::dp)),
        dp_rank(m.coord(Axis::dp)),
        pp(m.size(Axis::pp)),
        thread_choice(c.train.threads > 0
                          ? ThreadChoice{static_cast<int>(c.train.threads), "train.threads"}
                          : default_cpu_threads(local_size_from_env())),
        threads(set_cpu_threads(thread_choice.threads)),
        // One GPU per rank: the rank's index on its node (0 when not launched by mpirun/srun).
        // Multi-rank GPU runs need a mesh whose groups route device buffers to NCCL
        // (make_device_routed, built by the app before the mesh).
        backend(make_device_backend(select_device(c.train.device, local_rank_from_env()))),
        offload_store(make_offload_store(c.offload, backend->device())),
        alloc(*backend),
        spec(ModelSpec::from_config(c.model)),
        T(c.model.seq_len),
        gbs(c.train.global_batch_size),
        mbs(c.train.micro_batch_size),
        stops(stop_requests, c.train.time_limit),
        fault(m.rank(), stop_requests) {
    alloc.set_offload(offload_store.get(), c.offload.optimizer == OffloadTarget::nvme,
                      c.offload.params == OffloadTarget::nvme);
  }

  // From construction on, so that a signal while loading a checkpoint stops the run too.
  const StopRequests stop_requests;
  const Config cfg;  // copies: a Trainer outlives the arguments it was built from
  const TrainOptions opts;
  Mesh& mesh;
  // Rank 0's locks on train.run_dir and checkpoint.dir, held for the run's life (run_lock.h).
  std::vector<std::unique_ptr<RunLock>> locks;
  const bool rank0;
  const int64_t dp, dp_rank;
  const int pp;
  const ThreadChoice thread_choice;  // train.threads, or what 0 means for this rank
  const int threads;
  std::unique_ptr<DeviceBackend> backend;
  // [offload] "nvme": the files the optimizer state and ZeRO-3's shards live in (before the
  // allocator, whose offloaded buffers it outlives).
  std::unique_ptr<FileStore> offload_store;
  Allocator alloc;
  const ModelSpec spec;
  const int64_t T, gbs, mbs;  // seq_len, global batch, micro-batch (sequences)
  std::optional<ckpt::Checkpoint> resume;
  std::optional<ckpt::Checkpoint> init_from;  // checkpoint.init_from, when the run starts fresh
  std::unique_ptr<Transformer> model;
  std::unique_ptr<DataParallel> data_parallel;
  std::unique_ptr<PipelineStage> pipeline;  // pp > 1
  int64_t start_step = 0, consumed = 0;
  int64_t skipped_in_a_row = 0;
  StopConditions stops;  // train.time_limit counts from the State's construction
  FaultInjector fault;   // LLMTRAIN_FAULT (tests)
  // A failure all ranks saw alike (non-finite values): the run ends after the step's metrics.
  std::string failure;
  std::string last_checkpoint;
  int64_t checkpointed_step = -1;  // the step of the newest save started by this run
  DataSources data;
  std::unique_ptr<DataLoader> loader;
  std::unique_ptr<Step> step;
  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;  // log.tensorboard, rank 0
  std::ofstream dump_tokens;
  std::vector<float> host_params;
  std::vector<int32_t> global_window;
  double peak = 0, flops_per_step = 0;
  // Checkpoints: at most one save in flight (checkpoint.async writes in the background and is
  // polled at every step end; a synchronous one completes where it starts). The staging is
  // declared first so that it outlives a save still writing from it when the run unwinds.
  HostBuffer ckpt_staging;  // async saves' snapshot (pinned on a GPU), reused from save to save
  std::unique_ptr<ckpt::PendingSave> pending;

  // Construction after the members: the checkpoint to resume from, the model, its state, the
  // data, the FLOP/s peak.
  void init();
  void build_model();
  void restore();
  void build_data();
  void gather_params();
  double device_peak();
  double evaluate(int64_t step);
  void report_save(const ckpt::SaveResult& r);
  void poll_checkpoint(bool wait);
  // Starts the save of `step` (a synchronous one writes every rank file here, and commits at
  // the next poll_checkpoint); false when the state is not finite (`failure` says why).
  bool start_checkpoint(int64_t step);
  void warn_cluster_run(int64_t from_step);
  // The debug dump's tokens of step `step`: the whole global batch's windows (gbs, T+1).
  void dump_step_tokens(int64_t step);
  // After a step that was not dropped: the run's failures (a non-finite loss or norm under
  // train.on_nonfinite = "stop", too many skipped steps in a row) into `failure`.
  void check_step(int64_t step, const StepMetrics& m, bool nonfinite);
  TrainResult run();
};

void Trainer::State::init() {
  State& s = *this;
  if (s.rank0 && !s.opts.quiet) {
    const Device dev = s.backend->device();
    std::printf("launch: %s, %d rank%s (%d per node), %d thread%s per rank (%s), device %s%s\n",
                launcher_name(), s.mesh.world().size(), s.mesh.world().size() > 1 ? "s" : "",
                local_size_from_env(), s.threads, s.threads > 1 ? "s" : "",
                s.thread_choice.source.c_str(), std::string(device_name(dev.kind)).c_str(),
                dev.kind == DeviceKind::cuda ? detail::concat(" ", dev.index).c_str() : "");
    if (std::string_view(launcher_name()) == "mpirun")
      std::printf(
          "stop: SIGUSR1 to mpirun stops cleanly (checkpoint, exit 75); SIGTERM to mpirun is Open "
          "MPI's abort (scripts/mpirun_graceful.sh; docs/slurm.md)\n");
  }
  // Before anything reads or writes the directories (the leftover removal below included).
  std::string lock_error;
  if (s.rank0) {
    try {
      s.locks.push_back(std::make_unique<RunLock>(cfg.train.run_dir, "train.run_dir"));
      std::error_code ec;
      if (!cfg.checkpoint.dir.empty() && !fs::equivalent(cfg.checkpoint.dir, cfg.train.run_dir, ec))
        s.locks.push_back(std::make_unique<RunLock>(cfg.checkpoint.dir, "checkpoint.dir"));
      // Nothing of an earlier run is overwritten unless the user says so.
      check_run_dirs(cfg, ckpt::resolve_load(cfg.checkpoint).has_value(), s.opts.overwrite);
    } catch (const ConfigError& e) {
      lock_error = e.what();
    }
  }
  int32_t locked_out = lock_error.empty() ? 0 : 1;
  if (s.mesh.world().size() > 1)
    s.mesh.world().all_reduce(Tensor(&locked_out, {1}, DType::i32), ReduceOp::max).wait();
  if (locked_out)
    throw ConfigError(s.rank0 ? lock_error
                              : "the run's directories are locked (rank 0 says by whom)");
  // The checkpoint to resume from, checked against the model before anything is allocated.
  if (std::optional<std::string> path = ckpt::resolve_load(cfg.checkpoint)) {
    s.resume.emplace(*path);
    const int64_t step = s.resume->state().step;
    if (step > cfg.train.steps)
      throw ConfigError(detail::concat(
          "checkpoint ", *path, " is at step ", step, ", past train.steps=", cfg.train.steps,
          ": nothing to train. Raise train.steps to train on, or fine-tune from its weights in "
          "a new run: checkpoint.init_from = \"",
          *path, "\" (step 0, a fresh optimizer and schedule)"));
    ckpt::check_model(*s.resume, s.spec, training_state_names(cfg.optimizer));
  } else if (!cfg.checkpoint.init_from.empty()) {
    // Fine-tuning: the weights alone, from a run of the same model.
    const std::string key = "checkpoint.init_from=\"" + cfg.checkpoint.init_from + "\": ";
    // ConfigError (no such directory) or Error (not a readable checkpoint): both name the key.
    try {
      s.init_from.emplace(ckpt::resolve_checkpoint_dir(cfg.checkpoint.init_from));
    } catch (const std::runtime_error& e) {
      throw ConfigError(key + e.what());
    }
    const std::string diff = finetune_model_differences(s.init_from->state().config, cfg);
    if (!diff.empty())
      throw ConfigError(key + "the checkpoint's model differs from this run's: " + diff +
                        " (fine-tuning may change only model.dropout, init_std, seq_len and the "
                        "MoE loss and capacity settings)");
    ckpt::check_model(*s.init_from, s.spec, s.init_from->states());  // shapes; states read: param
  }
  if (s.rank0)
    for (const std::string& name : ckpt::remove_leftovers(cfg.checkpoint.dir))
      std::printf("checkpoint: removed %s/%s, left by a save that did not finish\n",
                  cfg.checkpoint.dir.c_str(), name.c_str());
  const double rank_peak = cfg.log.peak_flops > 0 ? cfg.log.peak_flops : s.device_peak();
  // log.peak_flops is per rank; the step's FLOPs are the whole world's. A GPU whose peak is not
  // known gives 0: MFU is then reported as 0, and rank 0 says to set log.peak_flops.
  if (rank_peak <= 0 && s.rank0 && !opts.quiet)
    std::printf(
        "note: the peak FLOP/s of this GPU is not known; MFU reads 0 until log.peak_flops "
        "is set\n");
  s.peak = rank_peak * static_cast<double>(mesh.shape().world());
  s.flops_per_step = s.spec.flops_per_token() * static_cast<double>(s.gbs * s.T);
  warn_cluster_run(s.resume ? s.resume->state().step : 0);
  build_model();
  restore();
  build_data();
}

// A config sized for a cluster, started on a few ranks (a paper config on one machine): said on
// rank 0 before anything is allocated, from the run's FLOPs and the ranks' peak, a bound no
// implementation beats (the run's MFU would have to exceed 100%).
void Trainer::State::warn_cluster_run(int64_t from_step) {
  const int64_t steps = cfg.train.steps - from_step;
  if (!rank0 || peak <= 0 || steps <= 0) return;
  const double flops = flops_per_step * static_cast<double>(steps);
  const double at_least = flops / peak;
  if (at_least <= 30 * 86400.0) return;
  const double days = at_least / 86400, years = days / 365;
  const std::string span = years >= 2 ? detail::concat(static_cast<int64_t>(years), " years")
                                      : detail::concat(static_cast<int64_t>(days), " days");
  std::fprintf(stderr,
               "warning: this run is %lld steps of %.3g FLOP (%lld sequences of %lld tokens, "
               "%.3g FLOP per token) = %.3g FLOP: at least %s on %d rank%s at their peak of %.3g "
               "FLOP/s each, more at any real MFU. It is sized for a cluster: `llmtrain plan "
               "--config C --world N --hardware H` gives its memory and step time there; to try "
               "it here, `--shrink` (a small model of the same shape) or --set train.steps=N\n",
               static_cast<long long>(steps), flops_per_step, static_cast<long long>(gbs),
               static_cast<long long>(T), spec.flops_per_token(), flops, span.c_str(),
               mesh.world().size(), mesh.world().size() > 1 ? "s" : "", peak / mesh.world().size());
}

// The peak FLOP/s of this rank's device: a GPU's from its model (0 when unknown); a CPU's from
// its FMA width (vendor, family, model) x the clock x the threads, the clock measured when the
// kernel does not expose it (cpu_peak). Rank 0 prints how it was found.
double Trainer::State::device_peak() {
  const Device dev = backend->device();
  if (dev.kind != DeviceKind::cpu)
    return default_gpu_peak_flops(dev, compute_dtype(cfg.train.precision));
  const CpuPeak p = host_cpu_peak(threads, cpufreq_max_hz());
  if (rank0 && !opts.quiet)
    std::printf("peak: %s per rank, for MFU (log.peak_flops overrides)\n", p.text().c_str());
  return p.flops;
}

Trainer::Trainer(const Config& cfg, const TrainOptions& opts, Mesh& mesh)
    : s_(std::make_unique<State>(cfg, opts, mesh)) {
  s_->init();
}

Trainer::~Trainer() {
  if (s_->model) s_->model->set_hooks(nullptr);
}

TrainResult Trainer::run() {
  return s_->run();
}

double Trainer::evaluate() {
  LLMT_CHECK(s_->data.valid != nullptr, "Trainer::evaluate needs train.eval_interval > 0");
  return s_->evaluate(s_->start_step);
}

// This rank's part of the model (parallelize: its pipeline stage's chunks, the embeddings on pp
// rank 0 and the head on the last, its tp shards, its experts) and its pipeline stage (the
// executor that runs the schedule's actions for it, the embedding group). Every rank of a tp group
// reads the same micro-batches.
void Trainer::State::build_model() {
  State& s = *this;
  const Config& cfg = s.cfg;
  const int ep = static_cast<int>(cfg.parallel.ep);
  const int virtual_stages = static_cast<int>(cfg.parallel.virtual_stages);
  const ModelSpec stage_spec =
      parallelize(s.spec, model_layout(cfg.parallel, s.mesh.shape()), s.mesh.rank());
  // Expert parallelism: the ep group (ep consecutive ranks of the dp x cp group), whose rank is
  // the one parallelize gave this rank's experts.
  Communicator* ep_group = ep > 1 ? &s.mesh.expert_group(ep) : nullptr;
  LLMT_CHECK(ep_group == nullptr || ep_group->rank() == stage_spec.ep_rank, "expert group rank ",
             ep_group ? ep_group->rank() : 0, ", the spec holds the experts of ep rank ",
             stage_spec.ep_rank);
  s.model = make_rank_model(cfg, stage_spec, s.alloc, &s.mesh.comm(Axis::tp),
                            s.mesh.size(Axis::cp) > 1 ? &s.mesh.comm(Axis::cp) : nullptr, ep_group);
  if (cfg.parallel.zero_stage < 3) s.model->init(cfg.train.seed);
  s.data_parallel =
      make_data_parallel(cfg.parallel, cfg.optimizer, s.mesh, *s.model, s.alloc, cfg.train.seed);
  s.model->set_hooks(s.data_parallel.get());
  if (s.pp == 1) return;
  const int micro_batches = static_cast<int>(grad_accum_steps(cfg) / s.dp);
  s.pipeline = std::make_unique<PipelineStage>(
      make_schedule(cfg.parallel.pp_schedule, {s.pp, virtual_stages, micro_batches, false,
                                               static_cast<int>(cfg.parallel.pp_max_deferred)}),
      *s.model, s.mesh.comm(Axis::pp), s.alloc, cfg.model.embedding_on_last_stage());
}

// Loads the checkpoint to resume from into what build_model made (resharding when the layout
// differs): weights, optimizer state, step and loader position.
void Trainer::State::restore() {
  State& s = *this;
  if (s.init_from) {
    const int64_t bytes = ckpt::load(*s.init_from, s.model->spec(), *s.data_parallel, *s.backend,
                                     /*weights_only=*/true);
    if (s.rank0 && !s.opts.quiet)
      std::printf(
          "checkpoint: weights from %s (step %lld of the run that wrote it, at %s; %.1f MB); "
          "step, optimizer, schedule and data start fresh\n",
          s.init_from->dir().c_str(), static_cast<long long>(s.init_from->state().step),
          ckpt::layout_text(s.init_from->state()).c_str(), static_cast<double>(bytes) / 1e6);
    return;
  }
  if (!s.resume) return;
  const ckpt::RunState& rs = s.resume->state();
  const auto t_load = std::chrono::steady_clock::now();
  const int64_t bytes = ckpt::load(*s.resume, s.model->spec(), *s.data_parallel, *s.backend);
  s.fault.at("load", 0);
  s.fault.resumed();
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  s.start_step = rs.step;  // the update count and the loss scale: Step's, from rs
  s.consumed = rs.consumed_samples;
  if (s.rank0 && !s.opts.quiet)
    std::printf(
        "checkpoint: resumed from %s (step %lld, written at %s; rank 0 read %.1f MB in "
        "%.2f s, %.2f GB/s)\n",
        s.resume->dir().c_str(), static_cast<long long>(rs.step), ckpt::layout_text(rs).c_str(),
        static_cast<double>(bytes) / 1e6, load_s,
        static_cast<double>(bytes) / 1e9 / std::max(load_s, 1e-9));
  if (s.rank0 && !s.resume->has_manifest())
    std::fprintf(stderr,
                 "warning: checkpoint %s has no manifest.json (written before manifests): its "
                 "files were read without the whole-file checks; the next save writes one\n",
                 s.resume->dir().c_str());
  LLMT_CHECK(s.consumed <= s.cfg.train.steps * s.gbs || s.start_step >= s.cfg.train.steps,
             "checkpoint ", s.resume->dir(), " consumed ", s.consumed, " samples");
}

// The loader at the resumed position, the step (its token staging, the resumed update count and
// loss scale), the metrics file and the debug dump.
void Trainer::State::build_data() {
  State& s = *this;
  const Config& cfg = s.cfg;
  s.data = make_data_sources(cfg, s.rank0 && !s.opts.quiet, s.opts.eval_test_split);
  const BatchLayout layout{s.gbs, s.mbs, s.dp_rank, s.dp};
  s.loader = std::make_unique<DataLoader>(s.data.train, layout,
                                          std::min(s.consumed, cfg.train.steps * s.gbs),
                                          std::max(s.consumed, cfg.train.steps * s.gbs));
  const StepParts parts{.mesh = s.mesh,
                        .backend = *s.backend,
                        .alloc = s.alloc,
                        .model = *s.model,
                        .data_parallel = *s.data_parallel,
                        .pipeline = s.pipeline.get(),
                        .loader = *s.loader,
                        .fault = s.fault,
                        .stops = s.stops};
  s.step =
      std::make_unique<Step>(cfg, parts, s.start_step + 1, s.resume ? &s.resume->state() : nullptr);
  if (s.rank0) {
    fs::create_directories(cfg.train.run_dir);
    record_run_config(cfg);
  }
  s.metrics = std::make_unique<MetricsWriter>(
      cfg.log.metrics.empty() || !s.rank0
          ? ""
          : (fs::path(cfg.train.run_dir) / cfg.log.metrics).string(),
      s.start_step);
  s.tensorboard = std::make_unique<TensorBoardWriter>(
      cfg.log.tensorboard && s.rank0 ? (fs::path(cfg.train.run_dir) / "tensorboard").string() : "",
      s.start_step);
  if (!s.opts.dump_dir.empty()) {
    gather_params();
    if (s.rank0) {
      dump_params(s.opts.dump_dir, s.spec, s.host_params);
      s.dump_tokens.open(fs::path(s.opts.dump_dir) / "tokens.bin", std::ios::binary);
    }
  }
}

// Every parameter at global shape into host_params on rank 0 (dumps).
void Trainer::State::gather_params() {
  State& s = *this;
  s.data_parallel->gather_params(s.host_params);
  if (s.pp > 1) {
    std::vector<float> local;
    local.swap(s.host_params);
    gather_pp_params(s.mesh.comm(Axis::pp), s.spec, s.cfg.parallel, local, s.host_params);
  }
}

// Validation: the mean loss over train.eval_iters global batches of the valid split (the same
// ones every time), each rank taking its slices as in training.
double Trainer::State::evaluate(int64_t step) {
  State& s = *this;
  const BatchLayout layout{s.gbs, s.mbs, s.dp_rank, s.dp};
  DataLoader valid(s.data.valid, layout, 0, s.cfg.train.eval_iters * s.gbs);
  return s.step->evaluate(valid, s.cfg.train.eval_iters * layout.micro_batches(), step);
}

void Trainer::State::report_save(const ckpt::SaveResult& r) {
  if (rank0 && !opts.quiet)
    std::printf(
        "checkpoint: saved %s (%.1f MB; rank 0 wrote its file in %.2f s, %.2f GB/s over all "
        "ranks; training blocked %.2f s)\n",
        r.path.c_str(), static_cast<double>(r.bytes) / 1e6, r.write_seconds,
        static_cast<double>(r.bytes) / 1e9 / std::max(r.write_seconds, 1e-9), r.blocked_seconds);
}

void Trainer::State::poll_checkpoint(bool wait) {
  State& s = *this;
  if (s.pending && s.pending->poll(wait)) {
    report_save(s.pending->result());
    s.last_checkpoint = s.pending->result().path;
    s.pending.reset();
  }
}

bool Trainer::State::start_checkpoint(int64_t step) {
  State& s = *this;
  const Config& cfg = s.cfg;
  poll_checkpoint(true);
  // Never a checkpoint with inf/nan in it: it would verify, resume and replace a good one.
  std::vector<Tensor> held;
  for (const StateTensor& t : s.data_parallel->state_tensors()) held.push_back(t.local);
  int32_t bad = ops::has_nonfinite(held) ? 1 : 0;
  if (s.mesh.world().size() > 1)
    s.mesh.world().all_reduce(Tensor(&bad, {1}, DType::i32), ReduceOp::max).wait();
  if (bad) {
    s.failure = detail::concat(
        "step ", step,
        ": not saving a checkpoint: the parameters or the optimizer state hold "
        "inf/nan (the loss and gradient norm of the step were finite; the update made them so). "
        "Lower optimizer.lr or raise optimizer.warmup_steps, and resume from the last checkpoint");
    return false;
  }
  ckpt::RunState rs;
  rs.step = step;
  s.step->save_state(rs);  // updates, loss scale
  rs.consumed_samples = s.consumed + (step - s.start_step) * s.gbs;
  rs.seed = static_cast<int64_t>(cfg.train.seed);
  rs.config = to_toml(cfg);
  rs.mesh = s.mesh.shape();
  rs.zero_stage = cfg.parallel.zero_stage;
  rs.sequence_parallel = cfg.parallel.sequence_parallel;
  rs.virtual_stages = cfg.parallel.virtual_stages;
  rs.pp_layers = cfg.parallel.pp_layers;
  rs.pp_v_shape = cfg.parallel.pp > 1 && v_shaped(cfg.parallel.pp_schedule);
  rs.ep = cfg.parallel.ep;
  rs.zero_shard_group = cfg.parallel.zero_shard_group;
  s.pending = std::make_unique<ckpt::PendingSave>(cfg.checkpoint, rs, s.spec, s.model->spec(),
                                                  *s.data_parallel, s.mesh, *s.backend,
                                                  cfg.checkpoint.async, &s.ckpt_staging);
  s.checkpointed_step = step;
  return true;
}

void Trainer::State::dump_step_tokens(int64_t step) {
  global_window.resize(static_cast<size_t>(gbs * (T + 1)));
  data.train->fill(global_window.data(), (step - 1) * gbs, gbs);
  dump_tokens.write(reinterpret_cast<const char*>(global_window.data()),
                    static_cast<std::streamsize>(global_window.size() * 4));
}

void Trainer::State::check_step(int64_t step, const StepMetrics& m, bool nonfinite) {
  if (nonfinite && cfg.train.on_nonfinite == OnNonfinite::stop)
    failure = detail::concat(
        "step ", step, ": loss = ", m.loss, ", grad_norm = ", m.grad_norm,
        ": not finite; stopped before the update, so the parameters (and the last checkpoint) are "
        "those of step ",
        step - 1,
        ". Lower optimizer.lr, raise optimizer.warmup_steps or "
        "optimizer.grad_clip, or set train.on_nonfinite = \"skip\" to skip such steps");
  skipped_in_a_row = m.skipped ? skipped_in_a_row + 1 : 0;
  if (failure.empty() && cfg.train.max_skipped_steps > 0 &&
      skipped_in_a_row >= cfg.train.max_skipped_steps)
    failure = detail::concat(
        "step ", step, ": ", skipped_in_a_row,
        " steps skipped in a row (train.max_skipped_steps=", cfg.train.max_skipped_steps, "; ",
        nonfinite
            ? "non-finite loss or gradient norm"
            : detail::concat("fp16 overflow at loss scale ", static_cast<float>(m.loss_scale)),
        "): the run is not training. Lower optimizer.lr, or use train.precision = \"bf16\"");
}

TrainResult Trainer::State::run() {
  State& s = *this;
  const Config& cfg = s.cfg;
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  TrainResult result;
  if (s.rank0 && !s.opts.quiet && s.start_step >= cfg.train.steps)
    std::printf("checkpoint: step %lld is already >= train.steps=%lld; nothing to train\n",
                static_cast<long long>(s.start_step), static_cast<long long>(cfg.train.steps));
  const int64_t last_step =
      s.opts.stop_after > 0 ? std::min(s.opts.stop_after, cfg.train.steps) : cfg.train.steps;
  double max_step_s = 0;
  for (int64_t step = s.start_step + 1; step <= last_step; ++step) {
    const auto t0 = clock::now();
    StepMetrics m;
    m.step = step;
    m.steps = cfg.train.steps;
    if (s.dump_tokens.is_open()) dump_step_tokens(step);
    const Step::Outcome outcome = s.step->run(step, m);
    if (outcome.dropped) {
      // The parameters, optimizer and schedule are still step - 1's: that is what is saved (no
      // metrics line for the dropped step, so metrics.jsonl still ends at `latest`).
      const CheckpointConfig& ck = cfg.checkpoint;
      if (!ck.dir.empty() && step - 1 > s.start_step && s.checkpointed_step < step - 1 &&
          start_checkpoint(step - 1))
        poll_checkpoint(true);
      result.stopped = outcome.dropped->why;
      result.dropped_step = step;
      result.dropped_after = outcome.dropped->done;
      result.micro_batches = s.step->micro_batches();
      result.steps = step - 1;
      break;
    }
    check_step(step, m, outcome.nonfinite);
    const auto t1 = clock::now();
    m.step_time_s = std::chrono::duration<double>(t1 - t0).count();
    m.tokens_per_s = static_cast<double>(s.gbs * s.T) / m.step_time_s;
    m.mfu = s.peak > 0 ? s.flops_per_step / m.step_time_s / s.peak : 0.0;
    m.mem = s.alloc.stats();
    if (s.offload_store) {
      m.rss_peak_bytes = FileStore::peak_resident_bytes();
      m.disk_io_bytes = FileStore::process_io_bytes();
    }
    // The groups the model and its pipeline stage split off count too: context parallelism's
    // hybrid groups, the tied embeddings' first-and-last-stage group.
    std::vector<Communicator*> more = s.model->own_communicators();
    if (s.pipeline)
      for (Communicator* c : s.pipeline->own_communicators()) more.push_back(c);
    m.comm = take_comm_counters(s.mesh, more);
    m.comm_wait_s = s.data_parallel->take_wait_seconds();
    if (s.pipeline) {  // after the counters: the bubble's all-reduce counts in the next step's
      m.pp_bubble = s.pipeline->measured_bubble();
      m.pp_bubble_predicted = s.pipeline->predicted_bubble();
    }
    m.data_wait_s = s.loader->take_wait_seconds();
    if (s.failure.empty() && cfg.train.eval_interval > 0 && step % cfg.train.eval_interval == 0)
      m.val_loss = evaluate(step);
    // A stop request (a signal on any rank, or the time limit before the next step would end
    // past it): every rank learns it here, with one all-reduce.
    std::string stop;
    if (s.failure.empty() && step < last_step) {
      max_step_s = std::max(max_step_s, m.step_time_s);
      int32_t req[2] = {s.stops.signal(), s.stops.time_up(clock::now(), max_step_s) ? 1 : 0};
      if (s.mesh.world().size() > 1)
        s.mesh.world().all_reduce(Tensor(req, {2}, DType::i32), ReduceOp::max).wait();
      if (req[0])
        stop = signal_name(req[0]);
      else if (req[1])
        stop = "train.time_limit";
    }
    const CheckpointConfig& ck = cfg.checkpoint;
    const bool save_due =
        s.failure.empty() && !ck.dir.empty() &&
        ((ck.interval > 0 && step % ck.interval == 0) || step == last_step || !stop.empty());
    bool started = false;
    if (save_due || s.pending) {
      const auto tc = clock::now();
      if (save_due)
        started = start_checkpoint(step);
      else
        poll_checkpoint(false);
      m.checkpoint_s = std::chrono::duration<double>(clock::now() - tc).count();
      if (save_due) s.stops.saved(*m.checkpoint_s);
    }
    // The step's metrics line is on disk before its checkpoint commits (a synchronous save
    // commits just below, an async one at a later step's poll): `latest` never runs ahead of
    // metrics.jsonl.
    s.metrics->write(m);
    s.tensorboard->write(m);
    if (started) s.fault.at("save", step);
    if (started && !ck.async) poll_checkpoint(true);
    if (s.rank0 && !s.opts.quiet && cfg.log.progress &&
        (step % cfg.log.interval == 0 || step == 1 || step == cfg.train.steps || m.val_loss ||
         m.skipped)) {
      const double elapsed = std::chrono::duration<double>(t1 - t_start).count();
      const double eta =
          elapsed / static_cast<double>(step) * static_cast<double>(cfg.train.steps - step);
      std::printf("%s\n", progress_line(m, eta).c_str());
      std::fflush(stdout);
    }
    result.steps = step;
    result.final_loss = m.loss;
    if (!s.failure.empty() || !stop.empty()) {
      result.stopped = stop;
      break;
    }
  }
  poll_checkpoint(true);  // an async save completes before the run ends, whatever ended it
  result.error = s.failure;
  result.last_checkpoint = s.last_checkpoint;
  if (!s.opts.dump_final.empty() && s.failure.empty()) {
    gather_params();
    if (s.rank0) dump_params(s.opts.dump_final, s.spec, s.host_params);
  }
  return result;
}

TrainResult train(const Config& cfg, const TrainOptions& opts) {
  Mesh mesh = Mesh::create(MeshShape{}, make_local_communicator("world"));
  validate_layout(cfg, 1);
  return train(cfg, opts, mesh);
}

TrainResult train(const Config& cfg, const TrainOptions& opts, Mesh& mesh) {
  Trainer trainer(cfg, opts, mesh);
  return trainer.run();
}

}  // namespace llmt
