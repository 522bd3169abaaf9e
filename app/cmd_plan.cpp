// `llmtrain plan --config F [--set k=v]... [--world N] [--schedule [--svg OUT.svg] [--p2p]]`: the
// pipeline layout of a config, its parameter count, FLOPs per step and the training state each
// rank allocates (exact, by category), and, with --schedule, each pp rank's actions, the simulated
// bubble and peak in-flight micro-batches against the formulas, and the timeline as SVG. Works from
// the config alone: nothing model-sized is allocated and MPI is not started.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "app/commands.h"
#include "checkpoints/layout.h"
#include "engine/core/check.h"
#include "engine/schedule/schedule.h"
#include "engine/train/config.h"
#include "engine/train/memory_estimate.h"

namespace llmt::app {

namespace {

using detail::concat;

// Transformer layers of each global stage: parallel.pp_layers, or n_layers split evenly (parsing
// has checked that either is possible).
std::vector<int64_t> stage_layers(const Config& cfg, int stages) {
  if (!cfg.parallel.pp_layers.empty()) return cfg.parallel.pp_layers;
  return std::vector<int64_t>(stages, cfg.model.n_layers / stages);
}

std::string formula_text(PipeSchedule kind) {
  switch (kind) {
    case PipeSchedule::gpipe:
    case PipeSchedule::one_f_one_b:
      return "(p-1)/m";
    case PipeSchedule::interleaved:
      return "(p-1)/(v*m)";
    case PipeSchedule::zb_h1:
      return "(p-1)/(3m)";
  }
  return "";
}

}  // namespace

Run add_plan_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    int world = 0;
    bool schedule = false;
    bool p2p = false;
    std::string svg;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Show the pipeline layout and schedule of a config without allocating or training");
  cmd->add_option("-c,--config", args->config, "TOML config file")->required();
  cmd->add_option("--set", args->overrides, "Override a key: section.key=value (repeatable)");
  cmd->add_option("--world", args->world,
                  "Number of ranks (fixes dp = -1 and checks the layout); default tp*cp*pp*dp "
                  "with dp = -1 read as 1. MPI is not started")
      ->check(CLI::PositiveNumber);
  CLI::Option* schedule =
      cmd->add_flag("--schedule", args->schedule,
                    "Print each pp rank's actions, the bubble fraction and the peak in-flight "
                    "micro-batches (simulated and by formula)");
  cmd->add_flag("--p2p", args->p2p, "With --schedule: list the sends and receives too")
      ->needs(schedule);
  cmd->add_option("--svg", args->svg, "With --schedule: write the timeline here as SVG")
      ->needs(schedule);
  return [args]() {
    const Config cfg = parse_config(args->config, args->overrides);
    const ParallelConfig& par = cfg.parallel;
    int world = args->world;
    if (world > 0) {
      validate_layout(cfg, world);
    } else {
      world = static_cast<int>(par.tp * par.cp * par.pp * (par.dp == -1 ? 1 : par.dp));
    }
    const MeshShape mesh = mesh_shape(par, world);
    const int p = mesh.size(Axis::pp), dp = mesh.size(Axis::dp);
    const int v = static_cast<int>(par.virtual_stages);
    const int64_t gbs = cfg.train.global_batch_size;
    const int64_t mbs = cfg.train.micro_batch_size > 0 ? cfg.train.micro_batch_size : gbs;
    if (gbs % (mbs * dp) != 0)
      throw ConfigError(concat("train.global_batch_size=", gbs, " is not divisible by dp(", dp,
                               ")*train.micro_batch_size(", mbs, ")=", mbs * dp,
                               ": each dp rank runs a whole number of micro-batches"));
    const int m = static_cast<int>(gbs / (mbs * dp));
    if (par.pp_schedule == PipeSchedule::interleaved && m % p != 0)
      throw ConfigError(concat(
          "parallel.pp_schedule=\"interleaved\" needs the micro-batches per step, "
          "train.global_batch_size(",
          gbs, ") / (train.micro_batch_size(", mbs, ")*dp(", dp, ")) = ", m,
          ", to be a multiple of parallel.pp=", p, "; change the batch sizes or the schedule"));

    std::printf("plan: %s\n", args->config.c_str());
    std::printf("mesh: world %d = tp %d * cp %d * dp %d * pp %d%s\n", world, mesh.size(Axis::tp),
                mesh.size(Axis::cp), dp, p,
                args->world > 0 || par.dp != -1 ? "" : " (dp = -1 read as 1; pass --world N)");
    std::printf(
        "pipeline: schedule %s, pp %d, virtual_stages %d, micro-batches per step m = %lld / "
        "(%lld * dp %d) = %d\n",
        schedule_name(par.pp_schedule), p, v, static_cast<long long>(gbs),
        static_cast<long long>(mbs), dp, m);
    // Global stage s = chunk * p + rank (schedule.h); layers counted from 0.
    const std::vector<int64_t> layers = stage_layers(cfg, p * v);
    std::vector<int64_t> first(p * v + 1, 0);
    for (int s = 0; s < p * v; ++s) first[s + 1] = first[s] + layers[s];
    for (int r = 0; r < p; ++r) {
      std::string line = concat("  rank ", r, ":");
      for (int c = 0; c < v; ++c) {
        const int s = stage_of(ScheduleShape{p, v, m}, r, c);
        line += concat(c > 0 ? ";" : "", " stage ", s);
        line += layers[s] > 0 ? concat(" layers ", first[s], "-", first[s + 1] - 1) : " no layers";
        if (s == 0) line += " + embeddings";
        if (s == p * v - 1) line += " + head and loss";
      }
      std::printf("%s\n", line.c_str());
    }
    // The training state each rank allocates, exactly (rank_state_bytes): the ranks of dp and
    // cp coordinate 0, one per (tp, pp) coordinate; the others of a group hold the same or less.
    const ModelSpec spec = ModelSpec::from_config(cfg.model);
    std::printf("parameters: %lld; training FLOPs per step %.4g\n",
                static_cast<long long>(spec.num_params()),
                spec.flops_per_token() * static_cast<double>(gbs * cfg.model.seq_len));
    std::printf("state per rank, bytes as allocated (dp and cp coordinate 0; ZeRO stage %lld):\n",
                static_cast<long long>(par.zero_stage));
    const ckpt::WriteLayout layout{mesh, v, par.pp_layers};
    const int group = mesh.size(Axis::dp) * mesh.size(Axis::cp);
    // Ranks whose figures equal the line above are counted, not printed (a 3072-rank mesh has
    // 512 (tp, pp) coordinates but a handful of distinct stages).
    MemoryEstimate shown;
    int same = 0, same_first = 0, same_last = 0;
    auto flush = [&] {
      if (same > 0)
        std::printf("  ranks %d-%d: %d more with the figures above\n", same_first, same_last, same);
      same = 0;
    };
    for (int r = 0; r < world; ++r) {
      const auto c = mesh.coords(r);
      if (c[static_cast<int>(Axis::dp)] != 0 || c[static_cast<int>(Axis::cp)] != 0) continue;
      const MemoryEstimate e = rank_state_bytes(ckpt::rank_spec(spec, layout, r), par.zero_stage,
                                                group, 0, cfg.train.precision != Precision::fp32);
      if (r > 0 && e.params == shown.params && e.grads == shown.grads &&
          e.optimizer == shown.optimizer) {
        if (same++ == 0) same_first = r;
        same_last = r;
        continue;
      }
      flush();
      shown = e;
      std::printf("  rank %d (tp %d, pp %d): params %.0f, grads %.0f, optimizer %.0f (%s)\n", r,
                  c[static_cast<int>(Axis::tp)], c[static_cast<int>(Axis::pp)], e.params, e.grads,
                  e.optimizer, gib(e.total()).c_str());
    }
    flush();
    if (mesh.size(Axis::cp) > 1) {
      // Context parallelism: the groups, each rank's positions, and the cp bytes of a step on a
      // rank of the stage with the most layers (cp_bytes_per_layer, checked against the
      // communicator's counters by tests/mpi/cp_volume.py).
      const int cp = mesh.size(Axis::cp), tp = mesh.size(Axis::tp);
      const int64_t T = cfg.model.seq_len, c = T / (2 * cp);
      const int64_t heads = cfg.model.n_heads,
                    kv = cfg.model.n_kv_heads > 0 ? cfg.model.n_kv_heads : heads;
      const int u = ulysses_degree(par.cp_impl, cp, static_cast<int>(par.cp_ulysses));
      if (par.cp_impl == CpImpl::hybrid)
        std::printf("context parallel: all-to-all over %d consecutive cp ranks, ring over %d\n",
                    u, cp / u);
      std::printf("context parallel: cp %d, %s; rank r of a cp group holds positions [r*%lld, "
                  "(r+1)*%lld) and [(2cp-1-r)*%lld, (2cp-r)*%lld) of each sequence\n",
                  cp, std::string(cp_impl_name(par.cp_impl)).c_str(), static_cast<long long>(c),
                  static_cast<long long>(c), static_cast<long long>(c), static_cast<long long>(c));
      std::string groups;
      int listed = 0;
      for (int r = 0; r < world && groups.size() < 200; ++r) {
        if (mesh.coords(r)[static_cast<int>(Axis::cp)] != 0) continue;
        groups += " {";
        const std::vector<int> g = mesh.group(r, Axis::cp);
        for (size_t i = 0; i < g.size(); ++i) groups += concat(i ? "," : "", g[i]);
        groups += "}";
        ++listed;
      }
      const int n_groups = world / cp;
      if (listed < n_groups) groups += concat(" ... (", n_groups, " groups)");
      std::printf("  cp groups:%s\n", groups.c_str());
      const int64_t most = *std::max_element(layers.begin(), layers.end());
      const CpBytes b =
          cp_bytes_per_layer(par.cp_impl, cp, static_cast<int>(par.cp_ulysses), mbs, T,
                             heads / tp, kv / tp, cfg.model.d_model / heads);
      const double per_step = static_cast<double>(most * m);
      std::printf("  cp bytes per step per rank (%lld layers x %d micro-batches): send %.0f, "
                  "recv %.0f, all_to_all %.0f\n",
                  static_cast<long long>(most), m, b.send * per_step, b.recv * per_step,
                  b.all_to_all * per_step);
    }
    if (!args->schedule) return 0;

    const ScheduleShape shape{p, v, m};
    Schedule sched;
    try {
      sched = make_schedule(par.pp_schedule, shape);
    } catch (const Error& e) {
      throw ConfigError(concat("parallel.pp_schedule=\"", schedule_name(par.pp_schedule),
                               "\", parallel.pp=", p, ", parallel.virtual_stages=", v, ": ",
                               e.what()));
    }
    const ActionCosts costs;
    const Simulation sim = simulate(sched, costs);
    std::printf(
        "actions per rank (F forward, B backward, Bi/Bw its input/weight-gradient parts%s%s):\n",
        v > 1 ? "; .c = model chunk c" : "",
        args->p2p ? "; ra/sa recv/send activation, rg/sg gradient, <from >to rank" : "");
    for (int r = 0; r < p; ++r)
      std::printf("  rank %d: %s\n", r, format_actions(sched.ranks[r], v, args->p2p).c_str());
    std::printf(
        "bubble fraction (idle/busy, costs F=%g B=%g Bi=%g Bw=%g): simulated %.4f, formula %s = "
        "%.4f\n",
        costs.forward, costs.backward, costs.backward_input, costs.backward_weight,
        sim.bubble_fraction, formula_text(par.pp_schedule).c_str(),
        formula_bubble_fraction(par.pp_schedule, shape));
    std::string peaks, formula;
    for (int r = 0; r < p; ++r) {
      peaks += concat(" ", sim.peak_in_flight[r]);
      formula += concat(" ", formula_peak_in_flight(par.pp_schedule, shape, r));
    }
    std::printf("peak in-flight %s per rank:%s (formula%s)\n",
                v > 1 ? "(micro-batch, chunk) activations" : "micro-batches", peaks.c_str(),
                formula.c_str());
    std::printf("makespan: %.2f time units for %d micro-batches\n", sim.makespan, m);
    if (!args->svg.empty()) {
      std::ofstream out(args->svg);
      out << schedule_svg(sched, sim);
      out.close();
      if (!out) throw Error(concat("cannot write the SVG timeline to ", args->svg));
      std::printf("timeline: %s\n", args->svg.c_str());
    }
    return 0;
  };
}

}  // namespace llmt::app
