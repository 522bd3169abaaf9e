// `llmtrain train --config F [--set k=v]...`: parse, validate, train.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/allocator.h"
#include "engine/comm/communicator.h"
#include "engine/model/model_spec.h"
#include "plan/cost_model.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/shrink.h"
#include "train/stop.h"
#include "train/trainer.h"

namespace llmt::app {

std::string params_text(const ModelSpec& spec) {
  const MoeConfig& e = spec.cfg.moe;
  std::vector<std::string> notes;
  if (e.enabled())
    notes.push_back(detail::concat(spec.num_active_params(), " active: ", e.top_k, " of ",
                                   e.num_experts, " experts per MoE layer"));
  if (spec.cfg.mtp_depth > 0)
    notes.push_back(detail::concat("+ ", spec.num_mtp_params(), " in ", spec.cfg.mtp_depth,
                                   " multi-token prediction module",
                                   spec.cfg.mtp_depth > 1 ? "s" : ""));
  std::string out = std::to_string(spec.num_params() - spec.num_mtp_params());
  for (size_t i = 0; i < notes.size(); ++i) out += (i == 0 ? " (" : "; ") + notes[i];
  return notes.empty() ? out : out + ")";
}

std::string launch_hint(const Config& cfg, int world) {
  const int64_t ranks = layout_min_ranks(cfg.parallel);
  if (ranks <= world) return "";
  return detail::concat("; this layout needs ", ranks, " ranks: run it under `mpirun -np ", ranks,
                        " llmtrain ...` (or `srun -n ", ranks, "`)",
                        world == 1 ? " — started without a launcher, llmtrain runs 1 rank" : "");
}

Run add_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string dump_dir;
    std::string dump_final;
    bool quiet = false;
    bool force = false;
    bool overwrite = false;
    bool shrink = false;
    int64_t stop_after = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  cmd->add_option("-c,--config", args->config, "TOML config file")->required();
  cmd->add_option("--set", args->overrides, "Override a key: section.key=value (repeatable)");
  cmd->add_option("--dump-dir", args->dump_dir,
                  "Write the initial weights and every step's tokens here (docs/model.md)");
  cmd->add_option("--dump-final", args->dump_final,
                  "Write the weights after the last step here, gathered at global shape "
                  "(params.json + params.bin, as --dump-dir)");
  cmd->add_option("--stop-after-steps", args->stop_after,
                  "Stop after this step (saving a checkpoint there when [checkpoint] dir is set), "
                  "as a job that runs out of time; the LR schedule still spans train.steps")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("-q,--quiet", args->quiet,
                "No progress lines (the final `done:` line, warnings and errors still print)");
  cmd->add_flag(
      "--shrink", args->shrink,
      "Train the config shrunk to one machine with its parallel structure (docs/papers.md; "
      "`config show --shrink` prints it and its world size)");
  cmd->add_flag("--force", args->force,
                "Start even when the ranks of a node need more memory than it has available");
  cmd->add_flag("--overwrite", args->overwrite,
                "Start over in a train.run_dir / checkpoint.dir that holds an earlier run: "
                "truncates its metrics and deletes its checkpoints (without it, such a start is "
                "refused)");
  return [args]() {
    Shrunk shrunk;
    Config cfg = args->shrink ? parse_shrunk(args->config, args->overrides, shrunk)
                              : parse_config(args->config, args->overrides);
    // Stop signals are caught from here to the exit (the trainer acts on them while it runs): one
    // that arrives after the last step, while the run writes its end or MPI shuts down, must not
    // kill the process (a preemption notice for a run that has just finished; it exits 0).
    const StopRequests stop_requests;
    // MPI starts here when launched by mpirun/srun; the layout is checked against the world
    // size before anything is allocated.
    CommRuntime runtime;
    std::unique_ptr<Communicator> world = make_world_communicator();
    world->set_timeout(cfg.comm.timeout_s);  // every group split from it inherits the watchdog
    const int world_size = world->size();
    const bool rank0 = world->rank() == 0;
    try {
      validate_layout(cfg, world_size);
    } catch (const ConfigError& e) {
      // Every rank fails alike: rank 0 alone reports it, and all leave together (a rank that
      // exits first would make mpirun kill rank 0 before it has printed).
      if (rank0)
        std::fprintf(stderr, "error: %s%s\n", e.what(), launch_hint(cfg, world_size).c_str());
      world->barrier();
      return 2;
    }
    // A V (ZB-V, DualPipeV) on GPUs: before CUDA starts (select_device below), since a kernel's
    // first launch under lazy loading may synchronize and deadlock the V's transfers (docs/gpu.md).
    if (cfg.parallel.pp > 1 && v_shaped(cfg.parallel.pp_schedule)) request_eager_module_loading();
    // Memory before allocation: the ranks of a node must fit in what the node has left (host
    // memory; a GPU run's state lives on the GPUs, checked against each GPU's free memory below).
    const MemoryEstimate need = estimate_rank_memory(cfg, mesh_shape(cfg.parallel, world_size));
    const int local_ranks = local_size_from_env();
    const Device dev = select_device(cfg.train.device, local_rank_from_env());
    const bool on_host = dev.kind == DeviceKind::cpu;
    const AvailableMemory have = host_memory_available();
    // A GPU rank's state and activations live on its GPU: they must fit what it has free.
    const double gpu_free = on_host ? -1 : gpu_free_bytes(dev);
    const double node_need = need.total() * local_ranks;
    if (!args->quiet && rank0)
      std::printf(
          "memory: at least %s per rank (params %s, grads %s, optimizer %s, activations "
          ">= %s) by a bound from the config alone; %d rank%s on this node; %s available "
          "(%s)\n",
          gib(need.total()).c_str(), gib(need.params).c_str(), gib(need.grads).c_str(),
          gib(need.optimizer).c_str(), gib(need.activations).c_str(), local_ranks,
          local_ranks > 1 ? "s" : "", gib(have.bytes).c_str(),
          (have.source + (gpu_free >= 0
                              ? detail::concat("; GPU ", dev.index, ": ", gib(gpu_free), " free")
                              : std::string()))
              .c_str());
    // The first rank whose node is short, or world_size: every rank learns it.
    int32_t short_rank = !args->force && ((on_host && node_need > have.bytes) ||
                                          (gpu_free >= 0 && need.total() > gpu_free))
                             ? -world->rank()
                             : -world_size;
    if (world_size > 1)
      world->all_reduce(Tensor(&short_rank, {1}, DType::i32), ReduceOp::max).wait();
    if (-short_rank < world_size) {
      if (world->rank() == -short_rank && !on_host)
        std::fprintf(stderr,
                     "error: rank %d needs at least %s on GPU %d (params %s, grads %s, optimizer "
                     "%s, activations >= %s), which has %s free. Use more ranks (parallel."
                     "zero_stage, tp, pp shard the state), a smaller model or micro-batch, or "
                     "--force to start anyway\n",
                     world->rank(), gib(need.total()).c_str(), dev.index, gib(need.params).c_str(),
                     gib(need.grads).c_str(), gib(need.optimizer).c_str(),
                     gib(need.activations).c_str(), gib(gpu_free).c_str());
      else if (world->rank() == -short_rank)
        std::fprintf(
            stderr,
            "error: this run needs at least %s on the node of rank %d (%d rank%s x %s: params "
            "%s, grads %s, optimizer %s, activations >= %s), which has %s available (%s). Use "
            "more ranks or nodes (parallel.zero_stage, tp, pp shard the state), a smaller model "
            "or micro-batch, or --force to start anyway\n",
            gib(node_need).c_str(), world->rank(), local_ranks, local_ranks > 1 ? "s" : "",
            gib(need.total()).c_str(), gib(need.params).c_str(), gib(need.grads).c_str(),
            gib(need.optimizer).c_str(), gib(need.activations).c_str(), gib(have.bytes).c_str(),
            have.source.c_str());
      world->barrier();
      return 2;
    }
    // Then the figures of `llmtrain plan` (the model's spec is affordable now): the state
    // exactly, the activations at the schedule's peak (tested within 2% of the allocator), for
    // the ranks of this node (consecutive global ranks, as mpirun and srun place them). The
    // comm buffers are an estimate, printed but not counted.
    {
      const MeshShape shape = mesh_shape(cfg.parallel, world_size);
      const std::vector<MemoryEstimate> stages = stage_memory(cfg, world_size);
      auto of = [&](int r) {
        return stages[static_cast<size_t>(shape.coords(r)[static_cast<int>(Axis::pp)])];
      };
      auto counted = [](const MemoryEstimate& m) { return m.total() - m.comm; };
      const MemoryEstimate mine = of(world->rank());
      const int first = world->rank() - local_rank_from_env();
      double node = 0;
      for (int r = std::max(0, first); r < std::min(world_size, first + local_ranks); ++r)
        node += counted(of(r));
      const MemoryEstimate r0 = of(0);
      if (!args->quiet && rank0)
        std::printf(
            "memory: %s per rank (params %s, grads %s, optimizer %s, activations %s; comm "
            "buffers about %s more), as `llmtrain plan` computes them\n",
            gib(counted(r0)).c_str(), gib(r0.params).c_str(), gib(r0.grads).c_str(),
            gib(r0.optimizer).c_str(), gib(r0.activations).c_str(), gib(r0.comm).c_str());
      const bool short_gpu = gpu_free >= 0 && counted(mine) > gpu_free;
      int32_t short_rank = !args->force && ((on_host && node > have.bytes) || short_gpu)
                               ? -world->rank()
                               : -world_size;
      if (world_size > 1)
        world->all_reduce(Tensor(&short_rank, {1}, DType::i32), ReduceOp::max).wait();
      if (-short_rank < world_size) {
        if (world->rank() == -short_rank && short_gpu)
          std::fprintf(stderr,
                       "error: rank %d needs %s on GPU %d (params %s, grads %s, optimizer %s, "
                       "activations %s), which has %s free. Use more ranks (parallel.zero_stage, "
                       "tp, pp shard the state; train.recompute and sequence_parallel the "
                       "activations), a smaller model or micro-batch, or --force to start "
                       "anyway\n",
                       world->rank(), gib(counted(mine)).c_str(), dev.index,
                       gib(mine.params).c_str(), gib(mine.grads).c_str(),
                       gib(mine.optimizer).c_str(), gib(mine.activations).c_str(),
                       gib(gpu_free).c_str());
        else if (world->rank() == -short_rank)
          std::fprintf(stderr,
                       "error: this run needs %s on the node of rank %d (%d rank%s; this one: "
                       "params %s, grads %s, optimizer %s, activations %s), which has %s "
                       "available (%s). Use more ranks or nodes (parallel.zero_stage, tp, pp "
                       "shard the state; train.recompute and sequence_parallel the "
                       "activations), a smaller model or micro-batch, or --force to start "
                       "anyway\n",
                       gib(node).c_str(), world->rank(), local_ranks, local_ranks > 1 ? "s" : "",
                       gib(mine.params).c_str(), gib(mine.grads).c_str(),
                       gib(mine.optimizer).c_str(), gib(mine.activations).c_str(),
                       gib(have.bytes).c_str(), have.source.c_str());
        world->barrier();
        return 2;
      }
    }
    // On GPUs every axis group moves device buffers with NCCL and host scalars with MPI
    // (docs/gpu.md); the trainer picks the same device with the same rule.
    if (world_size > 1 &&
        select_device(cfg.train.device, local_rank_from_env()).kind == DeviceKind::cuda)
      world = make_device_routed(std::move(world), nccl_factory(local_rank_from_env()));
    Mesh mesh = Mesh::create(mesh_shape(cfg.parallel, world_size), std::move(world));
    ModelSpec spec = ModelSpec::from_config(cfg.model);
    if (!args->quiet && rank0)
      std::printf("llmtrain: %s, %s parameters, %lld layers, d_model %lld, seq_len %lld, %s\n",
                  cfg.model.arch == Arch::gpt2 ? "gpt2" : "llama", params_text(spec).c_str(),
                  static_cast<long long>(cfg.model.n_layers),
                  static_cast<long long>(cfg.model.d_model),
                  static_cast<long long>(cfg.model.seq_len),
                  std::string(precision_name(cfg.train.precision)).c_str());
    if (!args->quiet && rank0 && mesh.shape().world() > 1) {
      // Context parallelism: each rank's share of a sequence and how attention crosses ranks.
      const std::string cp_text =
          mesh.size(Axis::cp) > 1
              ? detail::concat(" (", cp_impl_name(cfg.parallel.cp_impl), ", ",
                               cfg.model.seq_len / mesh.size(Axis::cp), " positions per rank)")
              : "";
      const std::string hsdp_text =
          cfg.parallel.zero_shard_group > 0
              ? detail::concat(" (hybrid: shard groups of ", cfg.parallel.zero_shard_group,
                               " dp ranks)")
              : "";
      std::printf("mesh: tp %d, cp %d%s, dp %d, pp %d; zero_stage %lld%s\n", mesh.size(Axis::tp),
                  mesh.size(Axis::cp), cp_text.c_str(), mesh.size(Axis::dp), mesh.size(Axis::pp),
                  static_cast<long long>(cfg.parallel.zero_stage), hsdp_text.c_str());
    }
    TrainOptions opts;
    opts.dump_dir = args->dump_dir;
    opts.dump_final = args->dump_final;
    opts.quiet = args->quiet;
    opts.stop_after = args->stop_after;
    opts.overwrite = args->overwrite;
    TrainResult r;
    try {
      r = train(cfg, opts, mesh);
    } catch (const std::exception& e) {
      if (!runtime.distributed()) throw;
      // A failure on some ranks only (a file one rank cannot write, a device error) would leave
      // the others waiting in their next collective, and this rank in freeing its communicators:
      // the job would hang without a word. Say which rank failed and why, then end every rank.
      std::fprintf(stderr, "error: rank %d of %d: %s\n", mesh.rank(), mesh.shape().world(),
                   e.what());
      std::fflush(stderr);
      runtime.abort_world(dynamic_cast<const ConfigError*>(&e) ? 2 : 1);
    }
    const std::string saved =
        r.last_checkpoint.empty() ? "no checkpoint saved" : "last checkpoint " + r.last_checkpoint;
    if (!r.error.empty()) {
      // Every rank saw it alike (the values are all-reduced): rank 0 says it, all exit 1.
      if (rank0) std::fprintf(stderr, "error: %s (%s)\n", r.error.c_str(), saved.c_str());
      return 1;
    }
    if (!r.stopped.empty()) {
      if (rank0)
        std::printf("stopped: %s after step %lld%s; %s%s; exit %d\n", r.stopped.c_str(),
                    static_cast<long long>(r.steps),
                    r.dropped_step > 0
                        ? detail::concat(" (inside step ", r.dropped_step, ", after ",
                                         r.dropped_after, " of its ", r.micro_batches,
                                         " micro-batches per rank: dropped, it runs again on "
                                         "resume)")
                              .c_str()
                        : "",
                    saved.c_str(),
                    cfg.checkpoint.dir.empty()
                        ? " ([checkpoint] dir is not set, so nothing can resume)"
                        : "; resume with checkpoint.load = \"auto\"",
                    kExitStopped);
      return kExitStopped;
    }
    if (rank0)  // also with -q: the one line that says how the run ended
      std::printf("done: %lld steps, final loss %.4f, metrics in %s\n",
                  static_cast<long long>(r.steps), r.final_loss, cfg.train.run_dir.c_str());
    return 0;
  };
}

}  // namespace llmt::app
