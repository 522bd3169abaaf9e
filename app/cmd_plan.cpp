// `llmtrain plan --config F [--set k=v]... [--world N] [--schedule [--svg OUT.svg] [--p2p]]`: the
// pipeline layout of a config, its parameter count, FLOPs per step and the training state each
// rank allocates (exact, by category), and, with --schedule, each pp rank's actions, the simulated
// bubble and peak in-flight micro-batches against the formulas, and the timeline as SVG. Works from
// the config alone: nothing model-sized is allocated and MPI is not started.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <regex>
#include <thread>

#include "app/commands.h"
#include "checkpoints/layout.h"
#include "config/json.h"
#include "core/check.h"
#include "engine/schedule/schedule.h"
#include "plan/cost_model.h"
#include "plan/search.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/rank_model.h"
#include "train/trainer.h"

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
    case PipeSchedule::zb_v:
      return "(p-1)/(6m), m >= 2p-2";
    case PipeSchedule::dualpipe_v:
      return "(p-1)/(6m), m >= 2p-1 (its F&B pairs run one after the other)";
  }
  return "";
}

const char* const kAxisNames[] = {"tp", "cp", "dp", "pp"};

std::string bytes_text(const AxisBytes& b) {
  std::string s;
  auto add = [&](const char* name, double v) {
    if (v > 0) s += concat(s.empty() ? "" : ", ", name, " ", static_cast<long long>(v + 0.5));
  };
  add("all_reduce", b.all_reduce);
  add("reduce_scatter", b.reduce_scatter);
  add("all_gather", b.all_gather);
  add("send", b.send);
  add("recv", b.recv);
  add("all_to_all", b.all_to_all);
  return s;
}

std::string pct(double f) {
  return concat(static_cast<double>(static_cast<long long>(f * 1000 + 0.5)) / 10, "%");
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf,
                s >= 1      ? "%.3g s"
                : s >= 1e-3 ? "%.3g ms"
                            : "%.3g us",
                s >= 1      ? s
                : s >= 1e-3 ? s * 1e3
                            : s * 1e6);
  return buf;
}

std::string hardware_line(const HardwareProfile& hw) {
  std::string s = concat(hw.name, " (", hw.description, "; ", hw.source, ")");
  for (const std::string& d : hw.detected) s += concat("\n  detected: ", d);
  return s;
}

// The cost model's figures per pipeline rank, and the predicted step.
void print_cost(const StepCost& c, const HardwareProfile& hw) {
  std::printf(
      "memory per rank (state exact as above; activations as each rank's model lays them out, "
      "at the peak in-flight micro-batches; comm buffers estimated), of %s usable on %s:\n",
      gib(kUsableMemoryFraction * hw.memory_bytes).c_str(), hw.name.c_str());
  // Pipeline ranks whose line equals the one above are counted, not printed.
  auto print_lines = [&](auto line_of) {
    std::string shown;
    int same = 0, first = 0, last = 0;
    auto flush = [&] {
      if (same > 0) std::printf("  pp %d-%d: %d more with the figures above\n", first, last, same);
      same = 0;
    };
    for (const StageCost& s : c.stages) {
      const std::string line = line_of(s);
      if (s.pp_rank > 0 && line == shown) {
        if (same++ == 0) first = s.pp_rank;
        last = s.pp_rank;
        continue;
      }
      flush();
      shown = line;
      std::printf("  rank %d (pp %d): %s\n", s.rank, s.pp_rank, line.c_str());
    }
    flush();
  };
  print_lines([](const StageCost& s) {
    return concat("activations ", static_cast<long long>(s.memory.activations), " (", s.in_flight,
                  " in flight), comm ", static_cast<long long>(s.memory.comm), "; peak ",
                  gib(s.peak), " (the categories' peaks add up to ", gib(s.memory.total()), ")");
  });
  std::printf("bytes per step per rank, as the communicators count them:\n");
  print_lines([](const StageCost& s) {
    std::string line;
    for (int a = 0; a < kNumAxes; ++a) {
      const std::string b = bytes_text(s.bytes[a]);
      if (!b.empty()) line += concat(line.empty() ? "" : "; ", kAxisNames[a], ": ", b);
    }
    return line.empty() ? std::string("none") : line;
  });
  const StageCost& w = c.stages[static_cast<size_t>(c.slowest)];
  std::printf("predicted on %s:\n", hardware_line(hw).c_str());
  // The other ops' largest three by bytes.
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [op, bytes] : w.other_ops_by_op) ops.emplace_back(bytes, op);
  std::sort(ops.begin(), ops.end(), std::greater<>());
  std::string largest;
  for (size_t i = 0; i < std::min<size_t>(3, ops.size()); ++i)
    largest += concat(i ? ", " : "; most: ", ops[i].second, " ",
                      pct(ops[i].first / std::max(w.other_ops_bytes, 1.0)));
  std::printf(
      "  slowest rank %d: compute %s (%.4g FLOPs at %s of a %.4g FLOP/s peak), other ops %s "
      "(%.4g bytes at %.4g B/s%s%s), exposed tp %s, cp %s, pp %s, ep %s; bubble %.4f; dp %s, "
      "optimizer %s\n",
      w.rank, seconds(w.compute_s).c_str(), w.flops, pct(hw.matmul_efficiency).c_str(), c.peak,
      seconds(w.other_ops_s).c_str(), w.other_ops_bytes, hw.memory_bandwidth, largest.c_str(),
      w.rounding_bytes > 0 ? concat("; not charged: 16-bit rounding passes, ",
                                    seconds(w.rounding_bytes / hw.memory_bandwidth))
                                 .c_str()
                           : "",
      seconds(w.comm_s[0]).c_str(), seconds(w.comm_s[1]).c_str(), seconds(w.comm_s[3]).c_str(),
      seconds(w.ep_s).c_str(), c.bubble, seconds(w.comm_s[2]).c_str(),
      seconds(w.optimizer_s).c_str());
  if (w.memory.offloaded > 0)
    std::printf("  offloaded to nvme: %s in files; a step reads and writes %.4g bytes of them%s\n",
                gib(w.memory.offloaded).c_str(), w.offload_io_bytes,
                hw.nvme_bandwidth > 0
                    ? concat(": ", seconds(w.offload_s), " at ", hw.nvme_bandwidth, " B/s").c_str()
                    : " (no time charged: the profile has no nvme_bandwidth)");
  std::printf("  step %s, %.4g tokens/s, MFU %s (HFU %s with recompute)%s\n",
              seconds(c.step_s).c_str(), c.tokens_per_s, pct(c.mfu).c_str(), pct(c.hfu).c_str(),
              c.fits ? "" : "; DOES NOT FIT the device memory");
}

void print_json(const StepCost& c, const HardwareProfile& hw, const ModelSpec& spec) {
  std::string s = concat("{\"hardware\": ", json_string(hw.name), ", \"world\": ", c.world,
                         ", \"parameters\": ", spec.num_params() - spec.num_mtp_params(),
                         ", \"active_parameters\": ", spec.num_active_params(),
                         ", \"mtp_parameters\": ", spec.num_mtp_params(),
                         ", \"micro_batches\": ", c.micro_batches);
  auto num = [](double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  s += concat(", \"model_flops\": ", num(c.model_flops),
              ", \"hardware_flops\": ", num(c.hardware_flops), ", \"bubble\": ", num(c.bubble),
              ", \"step_s\": ", num(c.step_s), ", \"tokens_per_s\": ", num(c.tokens_per_s),
              ", \"mfu\": ", num(c.mfu), ", \"hfu\": ", num(c.hfu), ", \"peak\": ", num(c.peak),
              ", \"fits\": ", c.fits ? "true" : "false", ", \"stages\": [");
  for (size_t i = 0; i < c.stages.size(); ++i) {
    const StageCost& st = c.stages[i];
    s += concat(
        i ? ", " : "", "{\"rank\": ", st.rank, ", \"pp_rank\": ", st.pp_rank,
        ", \"layers\": ", st.layers, ", \"flops\": ", num(st.flops),
        ", \"in_flight\": ", st.in_flight, ", \"memory\": {\"params\": ", num(st.memory.params),
        ", \"grads\": ", num(st.memory.grads), ", \"optimizer\": ", num(st.memory.optimizer),
        ", \"activations\": ", num(st.memory.activations), ", \"comm\": ", num(st.memory.comm),
        ", \"offloaded\": ", num(st.memory.offloaded), ", \"peak\": ", num(st.peak),
        "}, \"bytes\": {");
    for (int a = 0; a < kNumAxes; ++a) {
      const AxisBytes& b = st.bytes[a];
      s += concat(a ? ", " : "", "\"", kAxisNames[a], "\": {\"all_reduce\": ", num(b.all_reduce),
                  ", \"reduce_scatter\": ", num(b.reduce_scatter),
                  ", \"all_gather\": ", num(b.all_gather), ", \"send\": ", num(b.send),
                  ", \"recv\": ", num(b.recv), ", \"all_to_all\": ", num(b.all_to_all), "}");
    }
    s += concat("}, \"compute_s\": ", num(st.compute_s), ", \"other_ops_s\": ", num(st.other_ops_s),
                ", \"rounding_bytes\": ", num(st.rounding_bytes), ", \"other_ops_bytes\": {");
    bool first = true;
    for (const auto& [op, bytes] : st.other_ops_by_op)
      s += concat(std::exchange(first, false) ? "" : ", ", "\"", op, "\": ", num(bytes));
    s += "}, \"comm_s\": {";
    for (int a = 0; a < kNumAxes; ++a)
      s += concat(a ? ", " : "", "\"", kAxisNames[a], "\": ", num(st.comm_s[a]));
    s += concat("}, \"ep_s\": ", num(st.ep_s), ", \"optimizer_s\": ", num(st.optimizer_s),
                ", \"offload_io_bytes\": ", num(st.offload_io_bytes),
                ", \"offload_s\": ", num(st.offload_s), ", \"step_s\": ", num(st.step_s), "}");
  }
  s += "]}";
  std::printf("%s\n", s.c_str());
}

// Threads one rank computes with, for the cpu profile's detected peak: train.threads, else the
// machine's cores shared by the ranks.
int plan_threads(const Config& cfg, int world) {
  if (cfg.train.threads > 0) return static_cast<int>(cfg.train.threads);
  const unsigned cores = std::thread::hardware_concurrency();
  return std::max(1, static_cast<int>(cores) / std::max(1, world));
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
    std::string hardware;  // "": the config's plan.hardware, else cpu
    bool json = false;
    bool search = false;
    int top = 10;
    std::string write;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Predict a config's run without allocating or training: the rank map, memory per rank "
      "(params, grads, optimizer, activations), bytes per mesh axis, step time and MFU on a "
      "hardware profile; --search ranks every layout that fits, --schedule draws the pipeline");
  cmd->add_option("-c,--config", args->config, "TOML config file")->required();
  cmd->add_option("--set", args->overrides, "Override a key: section.key=value (repeatable)");
  cmd->add_option("--world", args->world,
                  "Number of ranks (fixes dp = -1 and checks the layout); default the config's "
                  "plan.world, else tp*cp*pp*dp with dp = -1 read as 1. MPI is not started")
      ->check(CLI::PositiveNumber);
  CLI::Option* schedule =
      cmd->add_flag("--schedule", args->schedule,
                    "Print each pp rank's actions, the bubble fraction and the peak in-flight "
                    "micro-batches (simulated and by formula)");
  cmd->add_flag("--p2p", args->p2p, "With --schedule: list the sends and receives too")
      ->needs(schedule);
  cmd->add_option("--svg", args->svg, "With --schedule: write the timeline here as SVG")
      ->needs(schedule);
  cmd->add_option("--hardware", args->hardware,
                  concat(
                      "Hardware profile for the predicted step time and MFU: a built-in name (",
                      [] {
                        std::string n;
                        for (const std::string& h : hardware_names())
                          n += (n.empty() ? "" : ", ") + h;
                        return n;
                      }(),
                      ") or a profile file (configs/hardware/*.toml shows the keys); default: the "
                      "config's plan.hardware, else cpu"));
  cmd->add_flag("--json", args->json,
                "Print the cost model's figures (memory, bytes per axis, times, MFU per pipeline "
                "rank), or with --search the ranked layouts and their --set lists, as one JSON "
                "object instead of the text report");
  CLI::Option* search =
      cmd->add_flag("--search", args->search,
                    "Cost every layout of the model at --world N (tp within a node, sp, cp, pp "
                    "schedules, ZeRO stage, recompute, micro-batch size), drop those that do not "
                    "fit the device memory, print the fastest by predicted step time");
  cmd->add_option("--top", args->top, "With --search: how many layouts to print")
      ->needs(search)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--write", args->write,
                  "With --search: write the best layout as a TOML fragment to `include`")
      ->needs(search);
  return [args]() {
    const Config cfg = parse_config(args->config, args->overrides);
    // What the flags leave unsaid, the config's [plan] says (a paper config: the hardware and
    // world size it was trained on).
    if (args->hardware.empty()) {
      args->hardware = cfg.plan.hardware.empty() ? "cpu" : cfg.plan.hardware;
      // A profile the config's [plan] names is refused naming that key, not a flag never given.
      if (!cfg.plan.hardware.empty()) {
        try {
          load_hardware(args->hardware, 1);
        } catch (const ConfigError& e) {
          throw ConfigError(concat("plan.hardware = \"", cfg.plan.hardware, "\" (", args->config,
                                   "): ", e.what()));
        }
      }
    }
    if (args->world <= 0 && cfg.plan.world > 0) args->world = static_cast<int>(cfg.plan.world);
    if (args->search) {
      if (args->world <= 0) throw ConfigError("plan --search needs --world N");
      const HardwareProfile hw = load_hardware(args->hardware, plan_threads(cfg, args->world));
      const SearchResult r = search_layouts(args->config, args->overrides, cfg, args->world, hw,
                                            static_cast<size_t>(args->top));
      if (args->json) {
        // {"valid": V, "fitting": F, "ranked": [{"sets": [...], "step_s": ..., ...}, ...]}
        std::string j =
            concat("{\"hardware\": ", json_string(hw.name), ", \"world\": ", args->world,
                   ", \"valid\": ", r.valid, ", \"fitting\": ", r.fitting, ", \"ranked\": [");
        for (size_t i = 0; i < r.ranked.size(); ++i) {
          const Candidate& c = r.ranked[i];
          std::string sets;
          for (const std::string& x : c.sets)
            sets += concat(sets.empty() ? "" : ", ", json_string(x));
          char nums[160];
          std::snprintf(nums, sizeof nums, "\"step_s\": %.17g, \"mfu\": %.17g, \"memory\": %.17g",
                        c.cost.step_s, c.cost.mfu,
                        c.cost.stages[static_cast<size_t>(c.cost.most_memory)].peak);
          j += concat(i ? ", " : "", "{\"layout\": ", json_string(layout_text(c.cfg, args->world)),
                      ", \"sets\": [", sets, "], ", nums, "}");
        }
        std::printf("%s]}\n", j.c_str());
        return 0;
      }
      std::printf("search: %s at world %d on %s\n", args->config.c_str(), args->world,
                  hardware_line(hw).c_str());
      std::printf(
          "%lld valid layouts, %lld fit %s per device; the fastest %zu by predicted "
          "step time:\n",
          static_cast<long long>(r.valid), static_cast<long long>(r.fitting),
          gib(kUsableMemoryFraction * hw.memory_bytes).c_str(), r.ranked.size());
      for (size_t i = 0; i < r.ranked.size(); ++i) {
        const Candidate& c = r.ranked[i];
        const StageCost& m = c.cost.stages[static_cast<size_t>(c.cost.most_memory)];
        std::printf("  %2zu. step %s, MFU %s, memory %s: %s\n", i + 1,
                    seconds(c.cost.step_s).c_str(), pct(c.cost.mfu).c_str(), gib(m.peak).c_str(),
                    layout_text(c.cfg, args->world).c_str());
      }
      if (r.ranked.empty())
        throw ConfigError(concat("no layout of ", args->config, " fits ", hw.name, " at world ",
                                 args->world, ": more ranks, or a device with more memory"));
      if (!args->write.empty()) {
        std::ofstream out(args->write);
        out << layout_fragment(r.ranked[0], args->world, hw);
        out.close();
        if (!out) throw Error(concat("cannot write the layout to ", args->write));
        std::printf("best layout written to %s (include = [\"%s\"] in a config)\n",
                    args->write.c_str(), args->write.c_str());
      }
      return 0;
    }
    const ParallelConfig& par = cfg.parallel;
    int world = args->world;
    // dp = -1 without --world: the smallest dp the layout allows (1, or what ep needs: ep
    // consecutive ranks of the dp x cp group share out the experts).
    const int64_t min_dp = par.ep / std::gcd(par.ep, par.cp);
    if (world <= 0)
      world = static_cast<int>(par.tp * par.cp * par.pp * (par.dp == -1 ? min_dp : par.dp));
    validate_layout(cfg, world);
    const MeshShape mesh = mesh_shape(par, world);
    const int p = mesh.size(Axis::pp), dp = mesh.size(Axis::dp);
    const int v = static_cast<int>(par.virtual_stages);
    // (validate_layout has checked that the batch splits into whole micro-batches per dp rank,
    // and into a multiple of pp under the interleaved schedule.)
    const int64_t gbs = cfg.train.global_batch_size;
    const int64_t mbs = cfg.train.micro_batch_size > 0 ? cfg.train.micro_batch_size : gbs;
    const int m = static_cast<int>(gbs / (mbs * dp));

    if (args->json) {
      const HardwareProfile hw = load_hardware(args->hardware, plan_threads(cfg, world));
      print_json(predict_step(cfg, world, hw), hw, ModelSpec::from_config(cfg.model));
      return 0;
    }
    std::printf("plan: %s\n", args->config.c_str());
    std::printf("mesh: world %d = tp %d * cp %d * dp %d * pp %d%s\n", world, mesh.size(Axis::tp),
                mesh.size(Axis::cp), dp, p,
                args->world > 0 || par.dp != -1
                    ? ""
                    : concat(" (dp = -1 read as ", min_dp, "; pass --world N)").c_str());
    std::printf(
        "pipeline: schedule %s, pp %d, virtual_stages %d, micro-batches per step m = %lld / "
        "(%lld * dp %d) = %d\n",
        schedule_name(par.pp_schedule), p, v, static_cast<long long>(gbs),
        static_cast<long long>(mbs), dp, m);
    // Global stage of each chunk (schedule.h: c * p + rank, or the V of ZB-V); layers from 0.
    const std::vector<int64_t> layers = stage_layers(cfg, p * v);
    std::vector<int64_t> first(p * v + 1, 0);
    for (int s = 0; s < p * v; ++s) first[s + 1] = first[s] + layers[s];
    for (int r = 0; r < p; ++r) {
      std::string line = concat("  rank ", r, ":");
      for (int c = 0; c < v; ++c) {
        ScheduleShape order{p, v, m};
        order.v_shape = v_shaped(par.pp_schedule);
        const int s = stage_of(order, r, c);
        line += concat(c > 0 ? ";" : "", " stage ", s);
        line += layers[s] > 0 ? concat(" layers ", first[s], "-", first[s + 1] - 1) : " no layers";
        if (s == 0) line += " + embeddings";
        if (s == p * v - 1)
          line += cfg.model.mtp_depth > 0 ? " + head, loss and multi-token prediction"
                                          : " + head and loss";
      }
      std::printf("%s\n", line.c_str());
    }
    // The training state each rank allocates, exactly (rank_state_bytes): the ranks of dp and
    // cp coordinate 0, one per (tp, pp) coordinate; the others of a group hold the same or less.
    const ModelSpec spec = ModelSpec::from_config(cfg.model);
    std::printf("parameters: %s; training FLOPs per step %.4g\n", params_text(spec).c_str(),
                spec.flops_per_token() * static_cast<double>(gbs * cfg.model.seq_len));
    std::printf("state per rank, bytes as allocated (dp and cp coordinate 0; ZeRO stage %lld%s):\n",
                static_cast<long long>(par.zero_stage),
                par.zero_shard_group > 0
                    ? concat(", sharded over groups of ", par.zero_shard_group, " dp ranks, ",
                             zero_replicas(par, mesh.size(Axis::dp)), " replicas")
                          .c_str()
                    : "");
    const ModelLayout layout = model_layout(par, mesh);
    // ZeRO's group: dp x cp, or under hybrid sharding one replica's chunk of it.
    const int group = mesh.size(Axis::dp) * mesh.size(Axis::cp) /
                      static_cast<int>(zero_replicas(par, mesh.size(Axis::dp)));
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
      const MemoryEstimate e = rank_state_bytes(
          parallelize(spec, layout, r), par.zero_stage, group, 0,
          cfg.train.precision != Precision::fp32, cfg.optimizer.type,
          static_cast<int>(dtype_size(grad_dtype(cfg.train))),
          static_cast<int>(zero_secondary_group(par, mesh.size(Axis::cp))),
          cfg.offload.optimizer == OffloadTarget::nvme, cfg.offload.params == OffloadTarget::nvme);
      if (r > 0 && e.params == shown.params && e.grads == shown.grads &&
          e.optimizer == shown.optimizer) {
        if (same++ == 0) same_first = r;
        same_last = r;
        continue;
      }
      flush();
      shown = e;
      std::printf("  rank %d (tp %d, pp %d): params %.0f, grads %.0f, optimizer %.0f (%s)%s\n", r,
                  c[static_cast<int>(Axis::tp)], c[static_cast<int>(Axis::pp)], e.params, e.grads,
                  e.optimizer, gib(e.total()).c_str(),
                  e.offloaded > 0 ? concat("; in nvme files ", gib(e.offloaded)).c_str() : "");
    }
    flush();
    // ZeRO cuts each parameter into whole rows of dim 0: one with fewer rows than the ranks of its
    // group (an expert stack's experts, a router's rows, over a large group) leaves ranks holding
    // padded shards only, so sharding it saves nothing there (rank 0's stage shown).
    if (par.zero_stage >= 1) {
      const ModelSpec rs = parallelize(spec, layout, 0);
      std::map<std::string, std::string> thin;  // layers.* name -> "R rows over N ranks"
      for (size_t i = 0; i < rs.params.size(); ++i) {
        const int64_t rows = rs.cut_rows(i);
        const int n = rs.row_group(i, group, 0).size;
        if (rows < n)
          thin[std::regex_replace(rs.params[i].name, std::regex("^layers\\.[0-9]+\\."),
                                  "layers.*.")] =
              concat(rows, rows == 1 ? " row" : " rows", " over ", n, " ranks");
      }
      std::string list;
      for (const auto& [name, what] : thin)
        list += concat(list.empty() ? "" : ", ", name, " (", what, ")");
      if (!thin.empty())
        std::printf(
            "ZeRO shards whole rows of dim 0, and %zu parameter%s fewer rows than the "
            "ranks sharding them, so the ranks past the last row hold a padded row only "
            "(sharding saves nothing there): %s\n",
            thin.size(), thin.size() == 1 ? " has" : "s have", list.c_str());
    }
    const HardwareProfile hw = load_hardware(args->hardware, plan_threads(cfg, world));
    const StepCost cost = predict_step(cfg, world, hw);
    if (mesh.size(Axis::cp) > 1) {
      // Context parallelism: the groups, each rank's positions, and the cp bytes of a step on a
      // rank of the stage with the most layers (the cost model's, from cp_bytes_per_layer and the
      // replays of the cores' forwards; checked against the communicator's counters by
      // tests/mpi/cp_volume.py).
      const int cp = mesh.size(Axis::cp), tp = mesh.size(Axis::tp);
      const int64_t T = cfg.model.seq_len, c = T / (2 * cp);
      const int64_t kv = spec.n_kv_heads;
      const int u = ulysses_degree(par.cp_impl, cp, static_cast<int>(par.cp_ulysses));
      if (par.cp_impl == CpImpl::hybrid)
        std::printf("context parallel: all-to-all over %d consecutive cp ranks, ring over %d\n", u,
                    cp / u);
      std::printf(
          "context parallel: cp %d, %s; rank r of a cp group holds positions [r*%lld, "
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
      const int64_t payload = cp_kv_payload(cfg);
      if (cp_payload(cp, payload) > 0)
        std::printf(
            par.cp_impl == CpImpl::ring
                ? "  the ring moves each position's kv latent and RoPE key (%lld values, not K/V's "
                  "%lld), and each rank expands the blocks it receives\n"
            : par.cp_impl == CpImpl::ulysses
                ? "  the all-to-all moves the queries; the group all-gathers each position's kv "
                  "latent and RoPE key (%lld values, not K/V's %lld), and each rank expands its "
                  "heads' K/V\n"
                : "  the all-to-all moves the queries; each group all-gathers each position's kv "
                  "latent and RoPE key (%lld values, not K/V's %lld), the ring passes a group's, "
                  "and each rank expands its heads' K/V\n",
            static_cast<long long>(payload), static_cast<long long>(2 * kv / tp * spec.head_dim));
      else if (cfg.model.mla_attention())
        std::printf("  %s latent attention's K/V (%s)\n",
                    par.cp_impl == CpImpl::ring ? "the ring moves" : "the all-to-all moves",
                    par.cp_latent ? "the schedule defers the weight gradients the latent's "
                                    "expansion adds in the input half"
                                  : "parallel.cp_latent = false");
      const StageCost& st = *std::max_element(
          cost.stages.begin(), cost.stages.end(),
          [](const StageCost& a, const StageCost& b) { return a.layers < b.layers; });
      const AxisBytes& b = st.bytes[static_cast<int>(Axis::cp)];
      std::printf(
          "  cp bytes per step per rank (%lld layers x %d micro-batches%s): send %.0f, "
          "recv %.0f, all_to_all %.0f, all_gather %.0f, reduce_scatter %.0f\n",
          static_cast<long long>(st.layers), m,
          cfg.train.recompute != Recompute::none ? ", with the recomputed cores' forwards" : "",
          b.send, b.recv, b.all_to_all, b.all_gather, b.reduce_scatter);
    }
    print_cost(cost, hw);
    if (!args->schedule) return 0;

    Schedule sched;
    try {
      sched = make_schedule(par.pp_schedule,
                            ScheduleShape{p, v, m, false, static_cast<int>(par.pp_max_deferred)});
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
        sim.bubble_fraction,
        (formula_text(par.pp_schedule) +
         (par.pp_max_deferred >= 0 ? " without parallel.pp_max_deferred" : ""))
            .c_str(),
        formula_bubble_fraction(par.pp_schedule, sched.shape));
    std::string peaks, formula;
    for (int r = 0; r < p; ++r) {
      peaks += concat(" ", sim.peak_in_flight[r]);
      formula += concat(" ", formula_peak_in_flight(par.pp_schedule, sched.shape, r));
    }
    std::printf("peak in-flight %s per rank:%s (formula%s)\n",
                v > 1 ? "(micro-batch, chunk) activations" : "micro-batches", peaks.c_str(),
                formula.c_str());
    std::printf("makespan: %.2f time units for %d micro-batches\n", sim.makespan, m);
    if (par.pp_schedule == PipeSchedule::dualpipe_v) {
      // DualPipe's table times each pair as one block F&B (overlapped: less than F + B).
      ActionCosts block = costs;
      block.forward_backward = costs.forward + costs.backward;
      const Simulation paired = simulate(sched, block);
      const double idle = *std::max_element(paired.idle.begin(), paired.idle.end());
      // One chunk's F, B and W: half the rank's.
      const double fb = block.forward_backward / 2, b = costs.backward / 2,
                   w = costs.backward_weight / 2;
      std::printf(
          "F&B pairs (forward of one micro-batch, backward of another; the executor runs the two "
          "one after the other, as above): timed as one block of F&B = F + B = %g, the most a rank "
          "idles is %.2f, DualPipe's (p-1)(F&B+B-3W) = %.2f\n",
          fb, idle, (p - 1) * (fb + b - 3 * w));
    }
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
