// Typed configuration: one struct per TOML section, so each component takes only its own
// section (AdamW takes OptimizerConfig, not the whole Config). parse_config() reads TOML (with
// `include = [...]` bases and `--set section.key=value` overrides) strictly: an unknown key, a
// wrong type or an impossible value throws llmt::ConfigError naming the dotted key, the file and
// line:column, and the numbers involved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoints/checkpoint_config.h"
#include "core/dtype.h"
#include "data/data_config.h"
#include "engine/comm/comm_config.h"
#include "engine/data_parallel/offload_config.h"
#include "engine/model/model_config.h"
#include "engine/optim/optimizer_config.h"
#include "engine/parallel/mesh.h"
#include "engine/parallel/parallel_config.h"
#include "engine/parallel/parallel_layers.h"

namespace llmt {

enum class Precision : uint8_t { fp32, bf16, fp16 };
// The weight gradients' storage: fp32 (accumulated and reduced in fp32, as Megatron's distributed
// optimizer keeps its main gradients), or the compute type (16-bit gradients and 16-bit
// reductions under bf16/fp16; the same as fp32 under fp32 precision).
enum class GradDType : uint8_t { fp32, compute };
// What a step whose loss or gradient norm is not finite does (fp16 overflow aside, which the
// loss scaler skips): stop the run before the update (exit 1), or skip the update.
enum class OnNonfinite : uint8_t { stop, skip };

// [train]
struct TrainConfig {
  int64_t steps = 100;
  int64_t global_batch_size = 8;  // sequences per optimizer step
  int64_t micro_batch_size = 0;   // sequences per forward/backward; 0 = global_batch_size
  Precision precision = Precision::fp32;
  GradDType grad_dtype = GradDType::fp32;
  uint64_t seed = 1234;
  std::string run_dir = "runs/default";  // unless given: runs/<config file stem>
  // "auto": cuda when built in and a GPU is visible, else cpu; "cpu"; "cuda" (one GPU per rank)
  std::string device = "auto";
  int64_t threads = 0;                    // OpenMP threads per rank; 0 = all cores
  int64_t eval_interval = 0;              // validation loss every this many steps; 0 = never
  int64_t eval_iters = 10;                // global batches of the valid split per validation
  Recompute recompute = Recompute::none;  // activation recompute (docs/model.md)
  int64_t recompute_layers = 0;  // recompute the first N layers of each model chunk; 0 = all
  // What selective recompute reruns: "core_attn" (default), "layernorm", "act" (docs/model.md).
  RecomputeModules recompute_modules;
  // Full recompute under tp without sequence parallelism: each tp rank saves 1/tp of a recomputed
  // layer's input and pipeline stages send 1/tp of their output (Megatron's
  // distribute-saved-activations and PTD-P's scatter/gather); docs/model.md.
  bool distribute_saved_activations = false;
  // FP8 GEMM inputs of the transformer layers' linears, emulated (parallel_layers.h's Fp8Recipe,
  // docs/model.md): "none", "tensorwise" or "blockwise" (tiles of fp8_block); 16-bit only.
  Fp8Scaling fp8 = Fp8Scaling::none;
  int64_t fp8_block = 128;
  OnNonfinite on_nonfinite = OnNonfinite::stop;
  // Stop (exit 1) after this many skipped steps in a row (fp16 overflow, on_nonfinite = "skip");
  // 0 = never.
  int64_t max_skipped_steps = 25;
  // Wall-clock seconds the run may take: it stops, saves and exits 75 before the next step would
  // end past it (as on SIGTERM); 0 = no limit.
  double time_limit = 0;
};

// [log]
struct LogConfig {
  int64_t interval = 1;                   // progress line every `interval` steps
  bool progress = true;                   // print the progress line
  std::string metrics = "metrics.jsonl";  // relative to train.run_dir; "" disables
  bool tensorboard = false;               // TensorBoard event files in <train.run_dir>/tensorboard
  double peak_flops = 0;  // FLOP/s of one rank for MFU; 0 = this CPU's fp32 FMA peak estimate
};

// [plan]: what `llmtrain plan` assumes when its flags do not say (training ignores it): the
// hardware profile a paper config was trained on and its world size.
struct PlanConfig {
  std::string hardware;  // a built-in profile name or a profile file; "" = cpu
  int64_t world = 0;     // ranks; 0 = the layout's own (tp * cp * pp * dp, dp = -1 read as 1)
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  OptimizerConfig optimizer;
  ParallelConfig parallel;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;
  CommConfig comm;
  OffloadConfig offload;
  PlanConfig plan;
  std::string source_path;  // the top-level TOML file
};

// Reads `path`, applies includes and `overrides` ("section.key=value", value in TOML syntax or a
// bare string), fills preset defaults, validates. Throws ConfigError.
Config parse_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from TOML text (tests); `name` is used in messages.
Config parse_config_string(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides = {});
// The fully resolved config as TOML (every key, defaults included).
std::string to_toml(const Config& c);
// Every key of every section, dotted ("model.moe.top_k"), in the order to_toml prints them.
std::vector<std::string> config_keys();

// Checks the [parallel] layout against the world size (before MPI starts or anything is
// allocated): tp*cp*dp*pp == world, heads / kv heads / vocab divisible by tp, seq_len by tp with
// sequence_parallel, global_batch_size by dp*micro_batch_size. Throws ConfigError listing every
// problem with all its factors.
void validate_layout(const Config& c, int world);
// The --set values that make a config's data parallelism plain DDP: zero_stage 0 and every ZeRO
// option back at its default, offload.params too (each refuses zero_stage 0). For the commands that
// run a stored config at a layout of their own (eval, generate) and for plan --search's candidates.
const std::vector<std::string>& ddp_overrides();
// The --set values that run a config on one pipeline stage: pp 1 and every pipeline option back at
// its default (a schedule's own options refuse another schedule). For eval and generate.
const std::vector<std::string>& no_pipeline_overrides();
// train.recompute_modules as written in TOML: ["layernorm", "act"].
std::string recompute_modules_text(RecomputeModules m);
// The --set values that turn [offload] off whole (both targets, the folder and the chunk size at
// their defaults): for the commands that run a stored config without an update (eval, generate).
const std::vector<std::string>& no_offload_overrides();
// The fewest ranks the [parallel] layout runs on: tp*cp*pp*dp, dp = -1 counted as 1 (the commands
// that meet a world too small say how to get more: mpirun for train and eval, --world offline).
int64_t layout_min_ranks(const ParallelConfig& p);
// The mesh degrees of a validated layout (dp = -1 resolved against `world`).
MeshShape mesh_shape(const ParallelConfig& p, int world);
// "rank  tp cp dp pp" lines, one per global rank.
std::string rank_map(const MeshShape& shape);

// Derived numbers.
int64_t grad_accum_steps(const Config& c);  // global_batch_size / micro_batch_size
std::string_view precision_name(Precision p);

}  // namespace llmt
