// Hardware profiles (the built-in files parse, bad ones are refused naming the key) and the cost
// model's arithmetic on layouts whose answers follow from the formulas by hand. The bytes per
// axis and the activation bytes against a real run are tests/mpi/plan_memory.py's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>

#include "core/check.h"
#include "core/peak_flops.h"
#include "engine/model/model_spec.h"
#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "plan/search.h"

namespace llmt {
namespace {

using detail::concat;

constexpr const char* kGpu = R"([hardware]
name = "test-gpu"
description = "round numbers"
peak_fp32 = 1e12
peak_bf16 = 8e12
peak_fp16 = 8e12
memory_gib = 16
memory_bandwidth = 1e12
intra_node_bandwidth = 100e9
inter_node_bandwidth = 10e9
devices_per_node = 4
matmul_efficiency = 0.5
)";

std::string error_of(const std::string& text) {
  try {
    parse_hardware(text, "bad.toml", 1);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Hardware, BuiltInProfilesParse) {
  const std::vector<std::string> names = hardware_names();
  for (const char* want : {"a100-80gb", "cpu", "h100-80gb-sxm", "h200"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  const HardwareProfile h100 = load_hardware("h100-80gb-sxm", 1);
  EXPECT_DOUBLE_EQ(h100.peak(DType::bf16), 989.4e12);
  EXPECT_DOUBLE_EQ(h100.peak(DType::f32), 66.9e12);
  EXPECT_EQ(h100.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(h100.memory_bytes, 80.0 * (1 << 30));
  EXPECT_EQ(h100.source, "built in");
  const HardwareProfile a100 = load_hardware("a100-80gb", 1);
  EXPECT_DOUBLE_EQ(a100.peak(DType::f16), 312e12);
  // The cpu profile's peak and memory come from this machine.
  const HardwareProfile cpu = load_hardware("cpu", 1);
  EXPECT_GT(cpu.peak(DType::f32), 1e9);
  EXPECT_EQ(cpu.peak(DType::bf16), cpu.peak(DType::f32));
  EXPECT_GT(cpu.memory_bytes, 1e8);
  EXPECT_EQ(cpu.detected.size(), 2u);
  // The shipped file and the compiled-in copy are the same profile.
  const HardwareProfile file = load_hardware(LLMT_CONFIGS_DIR "/hardware/h200.toml", 1);
  const HardwareProfile built = load_hardware("h200", 1);
  EXPECT_EQ(file.memory_bytes, built.memory_bytes);
  EXPECT_EQ(file.peak_bf16, built.peak_bf16);
}

TEST(Hardware, ProfilesAgreeWithTheTrainersPeak) {
  // The trainer's MFU takes a GPU's peak from the driver's name (peak_flops.h); the profiles
  // must give the same figure for the same GPU, or plan and train would disagree on MFU.
  const struct {
    const char* profile;
    GpuInfo gpu;
  } cases[] = {{"a100-80gb", {"NVIDIA A100-SXM4-80GB", 8, 0, 108, 1.41e9}},
               {"h100-80gb-sxm", {"NVIDIA H100 80GB HBM3", 9, 0, 132, 1.98e9}},
               {"h200", {"NVIDIA H200", 9, 0, 132, 1.98e9}}};
  for (const auto& c : cases) {
    const HardwareProfile h = load_hardware(c.profile, 1);
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      EXPECT_DOUBLE_EQ(h.peak(t), gpu_peak_flops(c.gpu, t)) << c.profile;
  }
}

TEST(Hardware, BadProfilesAreRefusedNamingTheKey) {
  const std::string ok = kGpu;
  EXPECT_EQ(error_of(ok), "");
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string t = ok;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  EXPECT_NE(error_of(replace("memory_bandwidth = 1e12\n", ""))
                .find("hardware.memory_bandwidth is missing"),
            std::string::npos);
  EXPECT_NE(
      error_of(replace("matmul_efficiency = 0.5", "matmul_efficiency = 1.5")).find("at most 1"),
      std::string::npos);
  EXPECT_NE(error_of(replace("intra_node_bandwidth = 100e9", "intra_node_bandwidth = 0"))
                .find("hardware.intra_node_bandwidth=0 must be > 0"),
            std::string::npos);
  // comm_overlap is optional (1 when absent) and a fraction.
  EXPECT_EQ(parse_hardware(ok, "ok.toml", 1).comm_overlap, 1.0);
  EXPECT_EQ(parse_hardware(ok + "comm_overlap = 0\n", "ok.toml", 1).comm_overlap, 0.0);
  EXPECT_NE(error_of(ok + "comm_overlap = 1.5\n").find("hardware.comm_overlap=1.5"),
            std::string::npos);
  const std::string typo = error_of(replace("peak_bf16", "peak_bf61"));
  EXPECT_NE(typo.find("peak_bf61"), std::string::npos) << typo;
  EXPECT_NE(typo.find("peak_bf16"), std::string::npos) << typo;  // did you mean
  EXPECT_NE(error_of(replace("peak_fp32 = 1e12", "peak_fp32 = \"fast\"")).find("peak_fp32"),
            std::string::npos);
  try {
    load_hardware("h100", 1);
    FAIL() << "an unknown profile name was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("h100-80gb-sxm"), std::string::npos) << e.what();
  }
}

Config tiny(const std::vector<std::string>& sets) {
  std::vector<std::string> all{
      "model.arch=\"gpt2\"",  "model.n_layers=4", "model.d_model=64",         "model.n_heads=4",
      "model.vocab_size=256", "model.seq_len=32", "train.global_batch_size=8"};
  all.insert(all.end(), sets.begin(), sets.end());
  return parse_config_string("", "tiny", all);
}

TEST(CostModel, SingleRankIsComputePlusOptimizer) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const StepCost c = predict_step(tiny({}), 1, hw);
  ASSERT_EQ(c.stages.size(), 1u);
  const StageCost& s = c.stages[0];
  EXPECT_DOUBLE_EQ(s.compute_s, s.flops / (1e12 * 0.5));  // fp32 peak x efficiency
  EXPECT_GT(s.other_ops_bytes, 0);
  EXPECT_DOUBLE_EQ(s.other_ops_s, s.other_ops_bytes / 1e12);  // at the memory bandwidth
  EXPECT_DOUBLE_EQ(c.step_s, s.compute_s + s.other_ops_s + s.optimizer_s);
  for (int a = 0; a < kNumAxes; ++a) EXPECT_EQ(s.bytes[a].total(), 0) << a;
  EXPECT_EQ(c.bubble, 0);
  EXPECT_DOUBLE_EQ(c.mfu, c.model_flops / (c.step_s * 1e12));
  EXPECT_LT(c.mfu, 0.5);
  EXPECT_TRUE(c.fits);
}

// model_flops counts matmuls only (ModelSpec::matmul_weights), as the stages' compute does: without
// recompute, on one rank, the step's model FLOPs are the rank's FLOPs, for a tied GPT-2 with
// biases and learned positions, an untied Llama (its input embedding a lookup) and a Llama MoE
// (top-2 of 4 experts).
TEST(CostModel, ModelFlopsAreTheRanksMatmulFlops) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{},
        {"model.arch=\"llama\"", "model.tie_embeddings=false"},
        {"model.arch=\"llama\"", "model.moe.num_experts=4", "model.moe.top_k=2",
         "model.moe.d_ff_expert=64"}}) {
    const StepCost c = predict_step(tiny(sets), 1, hw);
    ASSERT_EQ(c.stages.size(), 1u);
    EXPECT_NEAR(c.stages[0].flops / c.model_flops, 1.0, 1e-12) << concat(sets.size());
  }
}

// The other ops' bytes are the ops the rank's model runs in a step (ops::Recording): GELU's
// forward reads the fc1 output (N, 4C) and writes its activation (N, 4C) once per layer and
// micro-batch, at their storage type (4 bytes, 2 in bf16), over F/tp columns under tp; a full
// recompute replays it once more per layer but the last (whose forward leaves its set valid);
// the pipeline's stages share the layers, each counting its own.
TEST(CostModel, OtherOpsAreTheOpsTheModelRuns) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const double L = 4, N = 2 * 32, F = 4 * 64;  // micro-batch 2 of 32 positions
  const auto gelu = [&](const std::vector<std::string>& sets, int world) {
    std::vector<std::string> all{"train.micro_batch_size=2"};
    all.insert(all.end(), sets.begin(), sets.end());
    const StepCost c = predict_step(tiny(all), world, hw);
    double bytes = 0;
    for (const StageCost& s : c.stages) {
      const auto it = s.other_ops_by_op.find("gelu_forward");
      if (it != s.other_ops_by_op.end()) bytes += it->second;
      EXPECT_NEAR(s.other_ops_s, s.other_ops_bytes / 1e12, 1e-18);
    }
    return bytes / c.micro_batches;  // per micro-batch, over the stages
  };
  EXPECT_DOUBLE_EQ(gelu({}, 1), L * N * F * (4 + 4));
  EXPECT_DOUBLE_EQ(gelu({"train.precision=\"bf16\""}, 1), L * N * F * (2 + 2));
  EXPECT_DOUBLE_EQ(gelu({"parallel.tp=2", "parallel.dp=1"}, 2), L * N * F / 2 * (4 + 4));
  EXPECT_DOUBLE_EQ(gelu({"train.recompute=\"full\""}, 1), (2 * L - 1) * N * F * (4 + 4));
  EXPECT_DOUBLE_EQ(gelu({"parallel.pp=2", "parallel.dp=1"}, 2), L * N * F * (4 + 4));
}

// Full recompute replays a layer's forward (a third of its 6 x 12 C^2 + 6 C T FLOPs a token) in
// backward unless the replay set still holds it: without pp the last layer's forward leaves it
// for its backward (L - 1 replays a micro-batch). Under 1F1B at pp 2 the first stage's backward
// follows another micro-batch's forward (both its layers replay), the last stage's its own
// forward (one). Selective recompute of the core replays the core's forward (2 C T) likewise.
TEST(CostModel, RecomputeAddsFlopsNotModelFlops) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const StepCost none = predict_step(tiny({}), 1, hw);
  const StepCost full = predict_step(tiny({"train.recompute=\"full\""}), 1, hw);
  EXPECT_EQ(none.model_flops, full.model_flops);
  EXPECT_EQ(none.hardware_flops, none.model_flops);
  EXPECT_GT(full.step_s, none.step_s);
  EXPECT_LT(full.stages[0].memory.activations, none.stages[0].memory.activations);
  EXPECT_NEAR(full.hfu / full.mfu, full.hardware_flops / full.model_flops, 1e-12);
  const double C = 64, T = 32, tokens = 8 * T, L = 4, core = 2 * C * T;
  const double layer = (6 * 12 * C * C + 6 * C * T) / 3;
  EXPECT_DOUBLE_EQ(full.hardware_flops - full.model_flops, tokens * (L - 1) * layer);
  const StepCost pp2 = predict_step(tiny({"train.recompute=\"full\"", "parallel.pp=2",
                                          "parallel.dp=1", "train.micro_batch_size=2"}),
                                    2, hw);
  EXPECT_DOUBLE_EQ(pp2.stages[0].recompute_flops, tokens * 2 * layer);
  EXPECT_DOUBLE_EQ(pp2.stages[1].recompute_flops, tokens * 1 * layer);
  const StepCost sel = predict_step(tiny({"train.recompute=\"selective\""}), 1, hw);
  EXPECT_DOUBLE_EQ(sel.hardware_flops - sel.model_flops, tokens * (L - 1) * core);
}

// Selective recompute of the norms and the activation replays no matmul (hardware FLOPs are the
// model's) but their ops: per micro-batch GELU's forward runs once per layer in the forward and
// once more in backward for fc2's weight gradient, but for the last layer, whose output the
// scratch still holds; LayerNorm's forward likewise for the two norms of each layer (the
// scratch then holds the last layer's norm_2), plus the final norm. The attention core's
// recompute is a matmul replay.
TEST(CostModel, RecomputingNormsAndActivationReplaysTheirOpsNotMatmuls) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const double L = 4, N = 2 * 32, C = 64, F = 4 * 64;
  const auto cost = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> all{"train.micro_batch_size=2"};
    all.insert(all.end(), sets.begin(), sets.end());
    return predict_step(tiny(all), 1, hw);
  };
  const auto per_mb = [](const StepCost& c, const char* op) {
    return c.stages[0].other_ops_by_op.at(op) / c.micro_batches;
  };
  const StepCost none = cost({});
  const StepCost cheap =
      cost({"train.recompute=\"selective\"", "train.recompute_modules=[\"layernorm\", \"act\"]"});
  const StepCost core = cost({"train.recompute=\"selective\""});
  EXPECT_EQ(cheap.hardware_flops, cheap.model_flops);
  EXPECT_GT(core.hardware_flops, core.model_flops);
  EXPECT_LT(cheap.stages[0].memory.activations, none.stages[0].memory.activations);
  EXPECT_DOUBLE_EQ(per_mb(none, "gelu_forward"), L * N * F * (4 + 4));
  EXPECT_DOUBLE_EQ(per_mb(cheap, "gelu_forward"), (2 * L - 1) * N * F * (4 + 4));
  // LayerNorm's forward: reads (N, C) and its weight and bias (C), writes (N, C) and its mean
  // and rstd (N).
  const double norm = N * C * (4 + 4) + 2 * C * 4 + 2 * N * 4;
  EXPECT_DOUBLE_EQ(per_mb(none, "layernorm_forward"), (2 * L + 1) * norm);
  EXPECT_DOUBLE_EQ(per_mb(cheap, "layernorm_forward"), (2 * L + 1 + 2 * L - 1) * norm);
}

// Recomputing latent attention's up projections ("mla_up_proj") replays q_b's and kv_b's forward
// GEMMs in backward for every layer of a micro-batch but the last, whose forward left its qkv in
// the scratch: hardware FLOPs exceed the model's by 2 x their weights a token and such layer (q_b
// 24 x 4 heads x 12, kv_b 16 x 4 x (8 + 6)); with the core recomputed too, by the core's forward
// as well.
TEST(CostModel, RecomputingTheUpProjectionsReplaysTheirGemms) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const auto cost = [&](const char* modules) {
    return predict_step(
        tiny({"model.arch=\"llama\"", "model.n_kv_heads=4", "model.attention=\"mla\"",
              "model.mla.q_lora_rank=24", "model.mla.kv_lora_rank=16",
              "model.mla.qk_nope_head_dim=8", "model.mla.qk_rope_head_dim=4",
              "model.mla.v_head_dim=6", "train.recompute=\"selective\"", modules}),
        1, hw);
  };
  const double tokens = 8 * 32, layers = 4, up = 2.0 * (24 * 4 * 12 + 16 * 4 * (8 + 6));
  const StepCost up_only = cost("train.recompute_modules=[\"mla_up_proj\"]");
  EXPECT_DOUBLE_EQ(up_only.hardware_flops - up_only.model_flops, tokens * (layers - 1) * up);
  const StepCost core = cost("train.recompute_modules=[\"core_attn\"]");
  const StepCost both = cost("train.recompute_modules=[\"core_attn\", \"mla_up_proj\"]");
  EXPECT_DOUBLE_EQ(both.hardware_flops - core.hardware_flops, tokens * (layers - 1) * up);
  EXPECT_LT(up_only.stages[0].memory.activations, core.stages[0].memory.activations);
}

// Recomputing the routed experts' activation ("moe_act") under ep leaves it out of the rows a
// layer keeps from its forward to its weight backward: every rank's concurrent peak falls (and
// stays within the categories' peaks summed; it did not when the replay still held the rows
// whole), and the activations by the activation's bytes of the rows in flight.
TEST(CostModel, RecomputingTheRoutedActivationLeavesTheReceivedRowsWithoutIt) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const auto cost = [&](const char* modules) {
    return predict_step(
        tiny({"model.moe.num_experts=4", "model.moe.d_ff_expert=64", "parallel.ep=2",
              "parallel.pp=2", "parallel.dp=2", "train.micro_batch_size=1",
              "train.recompute=\"selective\"", modules}),
        4, hw);
  };
  const StepCost kept = cost("train.recompute_modules=[\"layernorm\"]");
  const StepCost dropped = cost("train.recompute_modules=[\"layernorm\", \"moe_act\"]");
  ASSERT_EQ(kept.stages.size(), 2u);
  // One layer's received rows at balanced routing: N k rows of the activation, Fe wide, fp32.
  const double gr = 32.0 * 2 * 64 * 4;
  for (size_t i = 0; i < 2; ++i) {
    const MemoryEstimate& a = kept.stages[i].memory;
    const MemoryEstimate& b = dropped.stages[i].memory;
    EXPECT_LT(dropped.stages[i].peak, kept.stages[i].peak) << i;
    EXPECT_LE(dropped.stages[i].peak, b.total()) << i;
    // 1F1B: pp rank i holds 2 - i micro-batches of its 2 MoE layers at the peak.
    EXPECT_DOUBLE_EQ(a.activations - b.activations, (2.0 - static_cast<double>(i)) * 2 * gr) << i;
  }
}

TEST(CostModel, BandwidthFollowsTheNode) {
  // tp 4 fits the 4-device node; tp 2 x dp 4 puts the dp group across nodes.
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const StepCost tp4 = predict_step(tiny({"parallel.tp=4", "parallel.dp=1"}), 4, hw);
  const StageCost& s = tp4.stages[0];
  EXPECT_DOUBLE_EQ(s.comm_s[0], s.bytes[0].total() / 100e9);
  const StepCost dp8 =
      predict_step(tiny({"parallel.tp=2", "parallel.dp=4", "train.micro_batch_size=1"}), 8, hw);
  const StageCost& d = dp8.stages[0];
  const double ddp_s = d.bytes[static_cast<int>(Axis::dp)].all_reduce / 10e9;
  EXPECT_DOUBLE_EQ(
      d.comm_s[static_cast<int>(Axis::dp)],
      std::max(0.0, ddp_s - (d.compute_s + d.other_ops_s) / dp8.micro_batches * 2 / 3));
}

// ZeRO-1 reduces each unit as the last micro-batch's backward completes it (ZeroSequence), so its
// reduce-scatter hides behind that backward as DDP's all-reduce does; the all-gather of the
// updated weights (Zero::step) waits. Where the profile's collectives hide behind nothing
// (comm_overlap = 0, the cpu profile) both are exposed.
TEST(CostModel, ZeroOneReduceScatterHidesBehindTheLastBackward) {
  for (const double overlap : {1.0, 0.0}) {
    const HardwareProfile hw =
        parse_hardware(concat(kGpu, "comm_overlap = ", overlap, "\n"), "gpu", 1);
    const StepCost c = predict_step(tiny({"parallel.tp=2", "parallel.dp=4", "parallel.zero_stage=1",
                                          "train.micro_batch_size=1"}),
                                    8, hw);
    const StageCost& s = c.stages[0];
    const AxisBytes& g = s.bytes[static_cast<int>(Axis::dp)];
    ASSERT_GT(g.reduce_scatter, 0);
    const double bwd = overlap * (s.compute_s + s.other_ops_s) / c.micro_batches * 2 / 3;
    EXPECT_DOUBLE_EQ(s.comm_s[static_cast<int>(Axis::dp)],
                     std::max(0.0, g.reduce_scatter / 10e9 - bwd) + g.all_gather / 10e9)
        << overlap;
  }
}

// Hybrid sharding at dp 8 over two 4-device nodes, shard groups of 4: ZeRO's reduce-scatter and
// all-gather run inside the node over 4 ranks (at the intra-node bandwidth), each unit's shard is
// all-reduced across the 2 replicas (inter-node), and the state is sharded 4 ways, not 8.
// Collectives hide behind nothing here (comm_overlap = 0), so the times are the bytes over the
// bandwidths.
TEST(CostModel, HybridShardingKeepsZerosCollectivesInsideTheNode) {
  const HardwareProfile hw = parse_hardware(concat(kGpu, "comm_overlap = 0\n"), "gpu", 1);
  for (const int stage : {1, 2, 3}) {
    const std::vector<std::string> zero{"parallel.dp=8", concat("parallel.zero_stage=", stage),
                                        "train.micro_batch_size=1"};
    std::vector<std::string> hybrid = zero;
    hybrid.push_back("parallel.zero_shard_group=4");
    const StageCost plain = predict_step(tiny(zero), 8, hw).stages[0];
    const StageCost hsdp = predict_step(tiny(hybrid), 8, hw).stages[0];
    const AxisBytes &p = plain.bytes[static_cast<int>(Axis::dp)],
                    &h = hsdp.bytes[static_cast<int>(Axis::dp)];
    // The state: the optimizer's rows over 4 ranks instead of 8 (padding aside).
    EXPECT_NEAR(hsdp.memory.optimizer / plain.memory.optimizer, 2, 0.05) << stage;
    // One pass of the shards moves (n - 1) shards: 3 of a quarter of the model against 7 of
    // an eighth.
    EXPECT_NEAR(h.reduce_scatter / p.reduce_scatter, (3.0 / 4) / (7.0 / 8), 0.02) << stage;
    EXPECT_NEAR(h.all_gather / p.all_gather, (3.0 / 4) / (7.0 / 8), 0.02) << stage;
    // The replicas' all-reduce: this rank's shard (a quarter of the model), 2 (R - 1) / R of it.
    EXPECT_EQ(p.all_reduce, 0) << stage;
    EXPECT_NEAR(h.all_reduce / (4 * hsdp.memory.optimizer / 8), 1, 1e-9) << stage;
    EXPECT_DOUBLE_EQ(hsdp.comm_s[static_cast<int>(Axis::dp)],
                     (h.reduce_scatter + h.all_gather) / 100e9 + h.all_reduce / 10e9)
        << stage;
    EXPECT_DOUBLE_EQ(plain.comm_s[static_cast<int>(Axis::dp)],
                     (p.reduce_scatter + p.all_gather) / 10e9)
        << stage;
  }
}

// hpZ at dp 8 over two 4-device nodes, secondary groups of 4: ZeRO-3's first gather of each unit
// after the update crosses the nodes, every later one (the backward, the second micro-batch) runs
// inside the node from the secondary copy, which the params hold beside the shards (a quarter
// of the model in the compute type). Times at comm_overlap = 0 are the bytes over the bandwidths.
TEST(CostModel, HierarchicalPartitionGathersInsideTheNodeAfterTheFirst) {
  const HardwareProfile hw = parse_hardware(concat(kGpu, "comm_overlap = 0\n"), "gpu", 1);
  const std::vector<std::string> zero{"parallel.dp=8", "parallel.zero_stage=3",
                                      "train.micro_batch_size=1", "train.global_batch_size=16"};
  std::vector<std::string> hpz = zero;
  hpz.push_back("parallel.zero_hierarchical_partition=4");
  const StageCost plain = predict_step(tiny(zero), 8, hw).stages[0];
  const StageCost h = predict_step(tiny(hpz), 8, hw).stages[0];
  const AxisBytes &p = plain.bytes[static_cast<int>(Axis::dp)],
                  &q = h.bytes[static_cast<int>(Axis::dp)];
  const double psi = static_cast<double>(ModelSpec::from_config(tiny(zero).model).num_params());
  EXPECT_NEAR((h.memory.params - plain.memory.params) / (4 * psi / 4), 1, 0.02);
  EXPECT_EQ(q.reduce_scatter, p.reduce_scatter);
  // The first gather of each unit: one pass of the shards over the 8 ranks, as one of the two
  // micro-batches' reduce-scatters (fp32: the same bytes). Every later gather plain ZeRO-3 makes
  // over 8 ranks (the 7 other ranks' eighths: 7/8 of the unit) hpZ makes within 4 (3/4).
  const double cross = q.reduce_scatter / 2, within = q.all_gather - cross;
  EXPECT_NEAR(within / (p.all_gather - cross), (3.0 / 4) / (7.0 / 8), 1e-9);
  EXPECT_NEAR(h.comm_s[static_cast<int>(Axis::dp)],
              q.reduce_scatter / 10e9 + cross / 10e9 + within / 100e9,
              1e-12 * h.comm_s[static_cast<int>(Axis::dp)]);
}

// qgZ: ZeRO-3's reduce-scatters become int4 all-to-alls, 33 words per block of 256 gradients
// (the scale and 32 words of codes) where fp32 moves 256 (within a block per shard: the tiny
// model's shards end in partial blocks). One hop over the 8 ranks moves 7/8 of the blocks,
// across the nodes; with hpZ's groups of 4 (a node), or qgZ's own, the first hop moves 6 of every 7
// of those bytes (3/4 of 8 shards' blocks) inside the node and only the second (1/2 of 2 sums'
// blocks) across.
TEST(CostModel, QuantisedGradientsCrossTheNodesInInt4Once) {
  const HardwareProfile hw = parse_hardware(concat(kGpu, "comm_overlap = 0\n"), "gpu", 1);
  const std::vector<std::string> zero{"parallel.dp=8", "parallel.zero_stage=3",
                                      "train.micro_batch_size=1", "train.global_batch_size=16"};
  std::vector<std::string> qg = zero, hpz = zero;
  qg.push_back("parallel.zero_quantized_gradients=true");
  hpz.push_back("parallel.zero_hierarchical_partition=4");
  std::vector<std::string> both = hpz;
  both.push_back("parallel.zero_quantized_gradients=true");
  const StageCost plain = predict_step(tiny(zero), 8, hw).stages[0],
                  one = predict_step(tiny(qg), 8, hw).stages[0],
                  h = predict_step(tiny(hpz), 8, hw).stages[0],
                  two = predict_step(tiny(both), 8, hw).stages[0];
  const auto dp = [](const StageCost& s) { return s.bytes[static_cast<int>(Axis::dp)]; };
  EXPECT_EQ(dp(one).reduce_scatter, 0);
  EXPECT_EQ(dp(one).all_gather, dp(plain).all_gather);
  EXPECT_NEAR(dp(one).all_to_all / dp(plain).reduce_scatter, 33.0 / 256, 0.01);
  EXPECT_DOUBLE_EQ(dp(two).all_to_all, dp(one).all_to_all);
  EXPECT_EQ(one.memory.grads, plain.memory.grads);  // the shards stay fp32
  const auto comm = [](const StageCost& s) { return s.comm_s[static_cast<int>(Axis::dp)]; };
  const double a2a = dp(one).all_to_all, rs = dp(plain).reduce_scatter;
  EXPECT_NEAR(comm(one), comm(plain) - rs / 10e9 + a2a / 10e9, 1e-12 * comm(plain));
  EXPECT_NEAR(comm(two), comm(h) - rs / 10e9 + a2a * 6 / 7 / 100e9 + a2a / 7 / 10e9,
              1e-12 * comm(h));
  EXPECT_LT(comm(two), comm(one));
  // The same two hops in qgZ's own groups of 4 (zero_quantized_gradients_group), without hpZ's
  // secondary copy (params as plain ZeRO-3's) and its gathers.
  std::vector<std::string> own = qg;
  own.push_back("parallel.zero_quantized_gradients_group=4");
  const StageCost hops = predict_step(tiny(own), 8, hw).stages[0];
  EXPECT_DOUBLE_EQ(dp(hops).all_to_all, dp(one).all_to_all);
  EXPECT_EQ(hops.memory.params, plain.memory.params);
  EXPECT_LT(plain.memory.params, h.memory.params);
  EXPECT_NEAR(comm(hops), comm(plain) - rs / 10e9 + a2a * 6 / 7 / 100e9 + a2a / 7 / 10e9,
              1e-12 * comm(plain));
}

// [offload] "nvme": ZeRO-3's shards and AdamW's state leave the device's memory for the files
// (the rest unchanged); a step moves each offloaded byte in and out once in the update and reads
// the shards at every gather (2 micro-batches: forward and backward of each), timed at the
// profile's nvme_bandwidth when it has one.
TEST(CostModel, OffloadMovesTheStateIntoFilesAndTimesItsTransfers) {
  const std::vector<std::string> zero{"parallel.dp=2", "parallel.zero_stage=3",
                                      "train.micro_batch_size=2", "train.global_batch_size=8"};
  std::vector<std::string> off = zero;
  for (const char* s : {"offload.optimizer=nvme", "offload.params=nvme", "offload.nvme_dir=/tmp"})
    off.push_back(s);
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1),
                        disk = parse_hardware(concat(kGpu, "nvme_bandwidth = 1e9\n"), "gpu", 1);
  const StageCost plain = predict_step(tiny(zero), 2, hw).stages[0],
                  moved = predict_step(tiny(off), 2, hw).stages[0],
                  timed = predict_step(tiny(off), 2, disk).stages[0];
  EXPECT_EQ(moved.memory.optimizer, 0);
  EXPECT_EQ(moved.memory.params, 0);
  EXPECT_EQ(moved.memory.grads, plain.memory.grads);
  EXPECT_EQ(moved.memory.offloaded, plain.memory.params + plain.memory.optimizer);
  EXPECT_NEAR(moved.peak, plain.peak - moved.memory.offloaded, 1e-6 * plain.peak);
  // Each unit gathered before its forward and its backward, the root once a micro-batch.
  const double shards = plain.memory.params;
  EXPECT_GT(moved.offload_io_bytes, 2 * moved.memory.offloaded + 2 * shards);
  EXPECT_LE(moved.offload_io_bytes, 2 * moved.memory.offloaded + 4 * shards);
  EXPECT_EQ(moved.offload_s, 0);
  EXPECT_DOUBLE_EQ(timed.offload_s, timed.offload_io_bytes / 1e9);
  EXPECT_DOUBLE_EQ(timed.step_s - moved.step_s, timed.offload_s);
}

// train.fp8 is emulated: the layers' linears (GPT-2 tiny: qkv, proj, fc1, fc2 = 12 C^2 a layer)
// multiply dequantised fp32 values, timed at the fp32 peak; the rest (attention core, head)
// at bf16's. Full recompute replays those GEMMs' forward too (2 FLOPs a weight).
TEST(CostModel, Fp8EmulationTimesItsGemmsAtTheFp32Peak) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const double C = 64, L = 4, tokens = 8 * 32;
  for (const bool full : {false, true}) {
    std::vector<std::string> sets{"train.precision=\"bf16\""};
    if (full) sets.push_back("train.recompute=\"full\"");
    const StageCost base = predict_step(tiny(sets), 1, hw).stages[0];
    sets.push_back("train.fp8=\"blockwise\"");
    const StageCost fp8 = predict_step(tiny(sets), 1, hw).stages[0];
    EXPECT_DOUBLE_EQ(fp8.flops, base.flops) << full;
    // (Full recompute replays the forward of every layer but the last: L - 1 a micro-batch.)
    const double f = tokens * 12 * C * C * (6 * L + (full ? 2 * (L - 1) : 0));
    EXPECT_NEAR(fp8.compute_s, base.compute_s + f / (1e12 * 0.5) - f / (8e12 * 0.5),
                1e-12 * base.compute_s)
        << full;
    EXPECT_GT(fp8.other_ops_bytes, base.other_ops_bytes);  // the quantisation passes
  }
}

// The concurrent peak replays the step: never above the sum of the categories' peaks, and below
// it where ZeRO-1's reductions (during the last micro-batch's backward) and the pipeline's
// activations (most of them freed by then) do not coincide. tests/mpi/plan_memory.py checks it
// against the allocator.
TEST(CostModel, ConcurrentPeakReplaysTheStep) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  for (const auto& [sets, world] :
       {std::pair{std::vector<std::string>{}, 1},
        std::pair{std::vector<std::string>{"parallel.dp=2", "parallel.zero_stage=3",
                                           "train.micro_batch_size=2"},
                  2},
        std::pair{std::vector<std::string>{"parallel.pp=2", "parallel.pp_schedule=\"zb-h1\"",
                                           "train.micro_batch_size=1"},
                  2}}) {
    for (const StageCost& s : predict_step(tiny(sets), world, hw).stages) {
      EXPECT_GT(s.peak, s.memory.params + s.memory.optimizer) << world;
      EXPECT_LE(s.peak, s.memory.total() * (1 + 1e-12)) << world;
    }
  }
  const StepCost c = predict_step(tiny({"parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1",
                                        "train.precision=\"bf16\"", "train.micro_batch_size=1"}),
                                  4, hw);
  EXPECT_LT(c.stages[0].peak, c.stages[0].memory.total());
}

// ZB-V against ZB-H1 and 1F1B on pp 2 (GPT-2, tied embeddings): half ZB-H1's bubble; rank 0 holds
// the embeddings and the head (one wte: no embedding all-reduce) and sends every micro-batch's
// activation and gradient once, where under 1F1B it sends the activation only (fp32: 2x the
// bytes, the paper's "2x communication"); rank 1's turn between its chunks moves nothing.
TEST(CostModel, ZbVHalvesTheBubbleAndDoublesRankZerosSends) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  auto with = [&](const std::string& schedule, int v) {
    return predict_step(
        tiny({"parallel.pp=2", "train.micro_batch_size=1",
              "parallel.pp_schedule=\"" + schedule + "\"", concat("parallel.virtual_stages=", v)}),
        2, hw);
  };
  const StepCost v = with("zb-v", 2), h1 = with("zb-h1", 1), f1 = with("1f1b", 1);
  EXPECT_DOUBLE_EQ(v.bubble * 2, h1.bubble);
  const AxisBytes &pv = v.stages[0].bytes[static_cast<int>(Axis::pp)],
                  &pf = f1.stages[0].bytes[static_cast<int>(Axis::pp)];
  EXPECT_EQ(pv.all_reduce, 0);
  EXPECT_GT(pf.all_reduce, 0);  // 1F1B: wte's gradient summed with the last stage's copy
  EXPECT_DOUBLE_EQ(pv.send, 2 * pf.send);
  EXPECT_DOUBLE_EQ(pv.recv, 2 * pf.recv);
  EXPECT_DOUBLE_EQ(v.stages[1].bytes[static_cast<int>(Axis::pp)].send, pv.send);
}

// DualPipeV as llmtrain runs it (each F&B pair's forward, then its backward): ZB-V's bubble and
// stages (rank 0 holds both ends, so no embedding all-reduce), one more chunk unit in flight (2p+1)
// on each rank; fewer than 2pp-1 micro-batches are refused as the config rules refuse them.
TEST(CostModel, DualPipeVHasZbVsBubbleAndOneUnitMore) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  auto with = [&](const std::string& schedule, const std::string& mbs) {
    return predict_step(
        tiny({"parallel.pp=2", "train.micro_batch_size=" + mbs,
              "parallel.pp_schedule=\"" + schedule + "\"", "parallel.virtual_stages=2"}),
        2, hw);
  };
  const StepCost d = with("dualpipev", "1"), v = with("zb-v", "1");
  EXPECT_GE(d.micro_batches, 3);
  EXPECT_DOUBLE_EQ(d.bubble, v.bubble);
  EXPECT_EQ(d.stages[0].bytes[static_cast<int>(Axis::pp)].all_reduce, 0);
  for (size_t r = 0; r < d.stages.size(); ++r) {
    EXPECT_EQ(d.stages[r].in_flight, 5) << r;
    EXPECT_GE(d.stages[r].memory.activations, v.stages[r].memory.activations) << r;
  }
  const int64_t gbs = tiny({}).train.global_batch_size;
  EXPECT_THROW(with("dualpipev", std::to_string(gbs / 2)), ConfigError);  // 2 micro-batches
}

// Latent attention's cp ring (pp 2, cp 2, fp32) moves each position's kv latent and RoPE key
// (P = 16 + 4 values) where ZB-H1, which defers the weight half the payload's contraction needs,
// moves the K/V (2 H D = 2 x 4 x 12): the bytes scale by P / 2HD; in exchange each layer runs
// the kv_b GEMM on the other rank's block four more times (forward; backward: expand, input and
// weight gradients), 2 Ckv H (Dn+Dv) FLOPs a token each.
TEST(CostModel, LatentCpRingMovesTheLatentAndExpandsTheBlocks) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  auto with = [&](const std::string& schedule) {
    return predict_step(
        tiny({"model.arch=\"llama\"", "model.n_kv_heads=4", "model.attention=\"mla\"",
              "model.mla.q_lora_rank=24", "model.mla.kv_lora_rank=16",
              "model.mla.qk_nope_head_dim=8", "model.mla.qk_rope_head_dim=4",
              "model.mla.v_head_dim=6", "parallel.cp=2", "parallel.pp=2",
              "parallel.pp_schedule=\"" + schedule + "\"", "train.micro_batch_size=1"}),
        4, hw);
  };
  const StepCost latent = with("1f1b"), kv = with("zb-h1");
  const AxisBytes &l = latent.stages[0].bytes[static_cast<int>(Axis::cp)],
                  &k = kv.stages[0].bytes[static_cast<int>(Axis::cp)];
  EXPECT_GT(l.send, 0);
  EXPECT_DOUBLE_EQ(l.send / k.send, 20.0 / 96.0);
  EXPECT_DOUBLE_EQ(l.recv, l.send);
  // 2 layers a stage, 8 sequences of 16 positions a rank a step.
  const double expand = 2.0 * 16 * 4 * (8 + 6), extra = 4 * expand * 2 * 8 * 16;
  EXPECT_DOUBLE_EQ(latent.stages[0].flops - kv.stages[0].flops, extra);
  EXPECT_DOUBLE_EQ(latent.stages[0].recompute_flops, extra);
}

// Latent attention under Ulysses: the all-to-all moves the queries alone, the payload (kv latent
// and RoPE key, P = 20 values a position) is all-gathered in forward and again in backward and
// its gradient reduce-scattered, where the K/V Ulysses (parallel.cp_latent = false) sends q/k/v.
// Each core forward expands the rank's H/u heads at every position of the group in place of the
// layer's own kv_b forward (qkv is built without K/V), and the backward expands them again: one
// more kv_b GEMM a token a layer.
TEST(CostModel, LatentUlyssesGathersTheLatentAndExpandsItsHeads) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  auto with = [&](bool latent) {
    return predict_step(
        tiny({"model.arch=\"llama\"", "model.n_kv_heads=4", "model.attention=\"mla\"",
              "model.mla.q_lora_rank=24", "model.mla.kv_lora_rank=16",
              "model.mla.qk_nope_head_dim=8", "model.mla.qk_rope_head_dim=4",
              "model.mla.v_head_dim=6", "parallel.cp=2", "parallel.cp_impl=\"ulysses\"",
              concat("parallel.cp_latent=", latent ? "true" : "false"), "parallel.pp=2",
              "train.micro_batch_size=1"}),
        4, hw);
  };
  const StepCost latent = with(true), kv = with(false);
  const AxisBytes &l = latent.stages[0].bytes[static_cast<int>(Axis::cp)],
                  &k = kv.stages[0].bytes[static_cast<int>(Axis::cp)];
  // A micro-batch of 1 x 16 positions a rank, 4 heads of D = 12, fp32; 2 layers x 8 micro-batches.
  const double q = 4.0 * 16 * 4 * 12, qkv = 3 * q, o = q, e = 4.0 * 16 * 20, n = 2 * 8;
  EXPECT_DOUBLE_EQ(k.all_to_all, n * 0.5 * (3 * qkv + 2 * o));
  EXPECT_DOUBLE_EQ(l.all_to_all, n * 0.5 * (3 * q + 2 * o));
  EXPECT_DOUBLE_EQ(l.all_gather, n * 2 * e);
  EXPECT_DOUBLE_EQ(l.reduce_scatter, n * e);
  EXPECT_EQ(k.all_gather + k.reduce_scatter, 0.0);
  EXPECT_LT(l.total(), 0.7 * k.total());  // 0.68 at these dims
  const double expand = 2.0 * 16 * 4 * (8 + 6), extra = expand * 2 * 8 * 16;
  EXPECT_DOUBLE_EQ(latent.stages[0].flops - kv.stages[0].flops, extra);
  EXPECT_DOUBLE_EQ(latent.stages[0].recompute_flops, extra);
  // Each saved qkv keeps the queries and one key head (H + 1 of the 3H heads): 2H - 1 heads of
  // 16 positions x D fewer per layer and micro-batch in flight.
  EXPECT_EQ(latent.stages[0].in_flight, kv.stages[0].in_flight);
  EXPECT_DOUBLE_EQ(kv.stages[0].memory.activations - latent.stages[0].memory.activations,
                   latent.stages[0].in_flight * 2 * 16 * (2 * 4 - 1) * 12 * 4.0);
}

// A search shares each rank model's figures between layouts (ActivationCache); a layout costed
// after others that share its rank model gives what it gives alone, also where the schedule
// changes what the model holds (under ep with ZB-H1 the received rows' gradients are a stash).
TEST(CostModel, CachedFiguresAreTheLayoutsOwn) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const std::vector<std::string> moe{"model.moe.num_experts=4",
                                     "model.moe.top_k=2",
                                     "model.moe.d_ff_expert=64",
                                     "train.micro_batch_size=1",
                                     "parallel.pp=2",
                                     "parallel.ep=2",
                                     "parallel.dp=2"};
  auto with = [&](const std::string& schedule) {
    std::vector<std::string> sets = moe;
    sets.push_back("parallel.pp_schedule=\"" + schedule + "\"");
    const bool v = schedule == "zb-v" || schedule == "dualpipev";
    sets.push_back(concat("parallel.virtual_stages=", v ? 2 : 1));
    return tiny(sets);
  };
  // (Under DualPipeV the whole backwards hold the gradients for a moment, the split ones stash.)
  for (const auto& [first, second] : {std::pair{"1f1b", "zb-h1"}, std::pair{"zb-v", "dualpipev"}}) {
    ActivationCache cache;
    predict_step(with(first), 4, hw, &cache);
    const StepCost cached = predict_step(with(second), 4, hw, &cache);
    const StepCost alone = predict_step(with(second), 4, hw);
    for (size_t i = 0; i < alone.stages.size(); ++i) {
      EXPECT_DOUBLE_EQ(cached.stages[i].peak, alone.stages[i].peak) << second << " " << i;
      EXPECT_DOUBLE_EQ(cached.stages[i].memory.activations, alone.stages[i].memory.activations)
          << second << " " << i;
      EXPECT_DOUBLE_EQ(cached.stages[i].step_s, alone.stages[i].step_s) << second << " " << i;
    }
  }
}

// Expert parallelism's dispatch and combine all-to-alls (their bytes counted with dp) are timed,
// all exposed, on every micro-batch's path, at the bandwidth of the ep group's span (tp x ep
// ranks): within the 4-device node at ep 4, across nodes under tp 2 x ep 4.
TEST(CostModel, ExpertAllToAllsAreTimedAtTheirGroupsBandwidth) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const std::vector<std::string> moe{"model.moe.num_experts=4", "model.moe.top_k=2",
                                     "model.moe.d_ff_expert=64", "train.micro_batch_size=1"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), moe.begin(), moe.end());
    return tiny(sets);
  };
  for (const auto& [sets, world, bw] :
       {std::tuple{std::vector<std::string>{"parallel.ep=4", "parallel.dp=4"}, 4, 100e9},
        std::tuple{std::vector<std::string>{"parallel.tp=2", "parallel.ep=4", "parallel.dp=4",
                                            "parallel.sequence_parallel=true"},
                   8, 10e9}}) {
    const StepCost c = predict_step(with(sets), world, hw);
    const StageCost& s = c.stages[0];
    const double a2a = s.bytes[static_cast<int>(Axis::dp)].all_to_all;
    ASSERT_GT(a2a, 0) << world;
    EXPECT_DOUBLE_EQ(s.ep_s, a2a / bw) << world;
    EXPECT_DOUBLE_EQ(s.pipeline_s, s.compute_s + s.other_ops_s +
                                       s.comm_s[static_cast<int>(Axis::tp)] +
                                       s.comm_s[static_cast<int>(Axis::cp)] + s.ep_s)
        << world;
    EXPECT_DOUBLE_EQ(c.step_s, s.pipeline_s + s.comm_s[static_cast<int>(Axis::dp)] + s.optimizer_s);
  }
  // Without ep there is no all-to-all and nothing to time.
  const StepCost none = predict_step(with({"parallel.dp=4"}), 4, hw);
  EXPECT_EQ(none.stages[0].ep_s, 0);
}

TEST(CostModel, PipelineBubbleAndStages) {
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const StepCost c =
      predict_step(tiny({"parallel.pp=2", "parallel.dp=1", "train.micro_batch_size=1"}), 2, hw);
  ASSERT_EQ(c.stages.size(), 2u);
  EXPECT_DOUBLE_EQ(c.bubble, 1.0 / 8);  // (p-1)/m
  EXPECT_EQ(c.stages[0].in_flight, 2);  // 1F1B: p - rank
  EXPECT_EQ(c.stages[1].in_flight, 1);
  EXPECT_TRUE(c.stages[0].embedding && !c.stages[0].head);
  EXPECT_TRUE(c.stages[1].head && !c.stages[1].embedding);
  EXPECT_GT(c.stages[1].flops, c.stages[0].flops);  // the head's matmul
  // The pipeline runs at the slowest stage's pace, idle for the bubble.
  for (const StageCost& s : c.stages) EXPECT_GE(s.pipeline_s, s.compute_s * (1 + c.bubble));
}

TEST(CostModel, ZeroStagesAtNd64) {
  // The ZeRO paper's example (Psi parameters over Nd = 64 data-parallel ranks), in llmtrain's
  // accounting: fp32 master params 4 Psi (+ a compute copy stored in 16 bits, 2 Psi, in 16-bit
  // precision), grads 4 Psi (2 Psi with train.grad_dtype = "compute": the paper's 16-bit
  // gradients), AdamW 8 Psi; stage 1 shards the optimizer (and in 16-bit the masters beside the
  // whole compute copy), 2 the gradients, 3 everything (docs/papers.md compares with the paper's
  // figures: with 16-bit gradients stages 0-2 are its 2 + 2 + 12). A Llama-shaped 6.7B model.
  const HardwareProfile hw = load_hardware("a100-80gb", 1);
  for (const char* precision : {"fp32", "bf16", "bf16-grads"}) {
    const bool b16 = std::string(precision) != "fp32";
    const bool g16 = std::string(precision) == "bf16-grads";
    for (int stage = 0; stage <= 3; ++stage) {
      const Config cfg =
          parse_config_string("", "zero",
                              {"model.arch=\"llama\"", "model.n_layers=32", "model.d_model=4096",
                               "model.n_heads=32", "model.vocab_size=32000", "model.seq_len=2048",
                               "train.global_batch_size=64", "train.micro_batch_size=1",
                               b16 ? "train.precision=\"bf16\"" : "train.precision=\"fp32\"",
                               g16 ? "train.grad_dtype=\"compute\"" : "train.grad_dtype=\"fp32\"",
                               concat("parallel.zero_stage=", stage), "parallel.dp=64"});
      const StepCost c = predict_step(cfg, 64, hw);
      const double psi = static_cast<double>(ModelSpec::from_config(cfg.model).num_params());
      const double nd = 64, gb = g16 ? 2 : 4;
      const MemoryEstimate& m = c.stages[0].memory;
      const double params = stage == 3          ? 4 * psi / nd
                            : b16 && stage >= 1 ? 2 * psi + 4 * psi / nd
                                                : (b16 ? 6 : 4) * psi;
      const double grads = stage >= 2 ? gb * psi / nd : gb * psi;
      const double opt = stage >= 1 ? 8 * psi / nd : 8 * psi;
      // Shards are padded to whole rows per rank: at most 64 rows of each tensor.
      EXPECT_NEAR(m.params / params, 1, 2e-3) << precision << " stage " << stage;
      EXPECT_NEAR(m.grads / grads, 1, 2e-3) << precision << " stage " << stage;
      EXPECT_NEAR(m.optimizer / opt, 1, 2e-3) << precision << " stage " << stage;
      if (g16 && stage < 3) {
        // The paper's 2 + 2 + 12 (K = 12: fp32 masters and Adam's two moments).
        const double paper = stage == 0   ? 16 * psi
                             : stage == 1 ? 4 * psi + 12 * psi / nd
                                          : 2 * psi + 14 * psi / nd;
        EXPECT_NEAR((m.params + m.grads + m.optimizer) / paper, 1, 2e-3) << "stage " << stage;
      }
    }
  }
}

// The cpu profile's peak is the same on every load (its clock measured once and cached:
// kernels/threads.h, host_cpu_peak), so plan's figures and --search's ranking on it are too.
TEST(CostModel, CpuProfileIsTheSameOnEveryLoad) {
  const HardwareProfile a = load_hardware("cpu", 1), b = load_hardware("cpu", 1);
  EXPECT_EQ(a.peak(DType::f32), b.peak(DType::f32));
  const StepCost ca = predict_step(tiny({}), 1, a), cb = predict_step(tiny({}), 1, b);
  EXPECT_EQ(ca.step_s, cb.step_s);
}

TEST(CostModel, SearchRanksFittingLayouts) {
  // A model whose state needs 3 of the 16 GiB devices at least: nothing fits on one or two,
  // the search at 8 finds layouts that fit and ranks them by predicted time.
  const HardwareProfile hw = parse_hardware(kGpu, "gpu", 1);
  const std::string path = LLMT_CONFIGS_DIR "/papers/gpt2-1558m.toml";
  const std::vector<std::string> sets{"train.global_batch_size=64"};
  const Config base = parse_config(path, sets);
  const SearchResult r = search_layouts(path, sets, base, 8, hw, 5);
  EXPECT_GT(r.valid, r.fitting);
  ASSERT_EQ(r.ranked.size(), 5u);
  for (size_t i = 1; i < r.ranked.size(); ++i)
    EXPECT_LE(r.ranked[i - 1].cost.step_s, r.ranked[i].cost.step_s);
  for (const Candidate& c : r.ranked) {
    EXPECT_TRUE(c.cost.fits);
    const StepCost again = predict_step(c.cfg, 8, hw);  // the config as re-parsed
    EXPECT_DOUBLE_EQ(again.step_s, c.cost.step_s) << layout_text(c.cfg, 8);
    // Each key once in the --set list (parallel.ep was listed twice).
    std::set<std::string> keys;
    for (const std::string& kv : c.sets)
      EXPECT_TRUE(keys.insert(kv.substr(0, kv.find('='))).second) << kv;
  }
  EXPECT_EQ(search_layouts(path, sets, base, 1, hw, 5).ranked.size(), 0u);
}

// A tiny GPT-2 of `layers` layers in a file of its own (searched layouts re-parse their path), in a
// directory removed at the end of the test.
class CostModelSearch : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           concat("llmt_test_search_",
                  testing::UnitTest::GetInstance()->current_test_info()->name(), "_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  std::string model(int64_t layers) const {
    return write(concat("gpt2-", layers, ".toml"),
                 concat("[model]\narch = \"gpt2\"\nn_layers = ", layers,
                        "\nd_model = 64\nn_heads = 4\nvocab_size = 256\nseq_len = 32\n\n[train]\n"
                        "global_batch_size = 24\n"));
  }
  // Every fitting layout of the model at `world`, fastest first.
  SearchResult search(const std::string& path, int world) const {
    return search_layouts(path, {}, parse_config(path, {}), world, hw_, 1000000);
  }
  // The (pp, virtual stages, layers per stage) of the ranked layouts.
  static std::set<std::tuple<int64_t, int64_t, std::vector<int64_t>>> splits(
      const SearchResult& r) {
    std::set<std::tuple<int64_t, int64_t, std::vector<int64_t>>> out;
    for (const Candidate& c : r.ranked)
      out.insert({c.cfg.parallel.pp, c.cfg.parallel.virtual_stages, c.cfg.parallel.pp_layers});
    return out;
  }
  std::filesystem::path dir_;
  HardwareProfile hw_ = parse_hardware(kGpu, "gpu", 1);
};

// Layers that do not divide over the stages are split with the first and last stage lighter (the
// rest on the middle stages); layers that do are also tried with the first and last stage one
// layer lighter, when every stage keeps a layer.
// A config with ZeRO++'s quantised weights: the search's ZeRO 0-2 candidates turn them off (they
// need stage 3, which they would refuse), its stage-3 candidates keep them and their block, and
// every ranked layout parses from its own overrides.
TEST_F(CostModelSearch, KeepsQuantisedWeightsAndGradientsOnStageThreeOnly) {
  const std::string path = model(4);
  const std::vector<std::string> qw{"parallel.zero_stage=3",
                                    "parallel.zero_quantized_weights=true",
                                    "parallel.zero_quantized_gradients=true",
                                    "parallel.zero_quantized_gradients_group=2",
                                    "parallel.zero_quant_block=64",
                                    "offload.params=nvme",
                                    "offload.nvme_dir=/tmp"};
  const SearchResult r = search_layouts(path, qw, parse_config(path, qw), 4, hw_, 1000000);
  ASSERT_FALSE(r.ranked.empty());
  int stage3 = 0;
  for (const Candidate& c : r.ranked) {
    const ParallelConfig& p = c.cfg.parallel;
    EXPECT_EQ(p.zero_quantized_weights, p.zero_stage == 3) << layout_text(c.cfg, 4);
    EXPECT_EQ(p.zero_quantized_gradients, p.zero_stage == 3) << layout_text(c.cfg, 4);
    EXPECT_EQ(c.cfg.offload.params == OffloadTarget::nvme, p.zero_stage == 3)
        << layout_text(c.cfg, 4);
    EXPECT_EQ(p.zero_quant_block, p.zero_stage == 3 ? 64 : 256) << layout_text(c.cfg, 4);
    // qgZ's first hop kept where its groups of 2 cut the candidate's dp ranks.
    const int64_t dp = mesh_shape(p, 4).size(Axis::dp);
    EXPECT_EQ(p.zero_quantized_gradients_group, p.zero_stage == 3 && dp % 2 == 0 ? 2 : 0)
        << layout_text(c.cfg, 4);
    // Without ZeRO-3 no "nvme" is left: the folder goes too (a rule refuses it unused), and the
    // printed overrides on the user's config give the candidate's [offload].
    EXPECT_EQ(c.cfg.offload.nvme_dir, p.zero_stage == 3 ? "/tmp" : "") << layout_text(c.cfg, 4);
    std::vector<std::string> sets = qw;
    sets.insert(sets.end(), c.sets.begin(), c.sets.end());
    const Config again = parse_config(path, sets);
    EXPECT_EQ(again.offload.params, c.cfg.offload.params) << layout_text(c.cfg, 4);
    EXPECT_EQ(again.offload.nvme_dir, c.cfg.offload.nvme_dir) << layout_text(c.cfg, 4);
    EXPECT_EQ(again.parallel.zero_quantized_gradients_group, p.zero_quantized_gradients_group);
    stage3 += p.zero_stage == 3;
  }
  EXPECT_GT(stage3, 0);
  EXPECT_LT(stage3, static_cast<int>(r.ranked.size()));
  // --write's fragment on a config that sets them gives each candidate's ZeRO++ keys and
  // [offload] (a stage-1 candidate included on that config would otherwise keep qwZ/qgZ and the
  // shards' offload, and be refused).
  const std::string base = write(
      "zeropp.toml", concat("include = [\"", path, "\"]\n[parallel]\n", "zero_stage = 3\n",
                            "zero_quantized_weights = true\n", "zero_quantized_gradients = true\n",
                            "zero_quantized_gradients_group = 2\n", "zero_quant_block = 64\n",
                            "[offload]\nparams = \"nvme\"\nnvme_dir = \"/tmp\"\n"));
  const SearchResult z = search_layouts(base, {}, parse_config(base, {}), 4, hw_, 1000000);
  std::set<bool> checked;
  for (const Candidate& c : z.ranked) {
    const ParallelConfig& p = c.cfg.parallel;
    if (!checked.insert(p.zero_stage == 3).second) continue;
    const std::string frag = write("zeropp-best.toml", layout_fragment(c, 4, hw_));
    const std::string cfg =
        write("zeropp-run.toml", concat("include = [\"", base, "\", \"", frag, "\"]\n"));
    const Config again = parse_config(cfg, {});
    EXPECT_EQ(again.parallel.zero_quantized_weights, p.zero_quantized_weights)
        << layout_text(c.cfg, 4);
    EXPECT_EQ(again.parallel.zero_quantized_gradients, p.zero_quantized_gradients);
    EXPECT_EQ(again.parallel.zero_quantized_gradients_group, p.zero_quantized_gradients_group);
    EXPECT_EQ(again.parallel.zero_quant_block, p.zero_quant_block);
    EXPECT_EQ(again.offload.params, c.cfg.offload.params);
    EXPECT_EQ(again.offload.nvme_dir, p.zero_stage == 3 ? "/tmp" : "");
  }
  EXPECT_EQ(checked.size(), 2u);
}

// The search tries selective recompute of the attention core and of the norms and the activation
// (besides none and full), and each candidate re-parses to its own modules from the user's
// overrides plus its own, also where the user's config lists modules a candidate without
// selective recompute would refuse; --write's fragment and the layout text name them.
TEST_F(CostModelSearch, TriesRecomputeOfTheNormsAndTheActivation) {
  const std::string path = model(4);
  const std::vector<std::string> user{"train.recompute=\"selective\"",
                                      "train.recompute_modules=[\"act\"]"};
  const SearchResult r = search_layouts(path, user, parse_config(path, user), 2, hw_, 1000000);
  std::set<std::pair<Recompute, int>> seen;
  for (const Candidate& c : r.ranked) {
    const TrainConfig& t = c.cfg.train;
    seen.insert({t.recompute, t.recompute_modules.bits});
    std::vector<std::string> sets = user;
    sets.insert(sets.end(), c.sets.begin(), c.sets.end());
    EXPECT_EQ(parse_config(path, sets).train.recompute_modules, t.recompute_modules)
        << layout_text(c.cfg, 2);
    const bool cheap = t.recompute == Recompute::selective && !t.recompute_modules.core_attn();
    EXPECT_EQ(layout_text(c.cfg, 2).find("recompute selective [\"layernorm\", \"act\"]") !=
                  std::string::npos,
              cheap)
        << layout_text(c.cfg, 2);
    EXPECT_EQ(layout_fragment(c, 2, hw_).find("recompute_modules = ") != std::string::npos,
              t.recompute == Recompute::selective);
  }
  const int core = 1 << static_cast<int>(RecomputeModule::core_attn);
  const int cheap = (1 << static_cast<int>(RecomputeModule::layernorm)) |
                    (1 << static_cast<int>(RecomputeModule::act));
  for (const auto& want :
       {std::pair{Recompute::none, core}, std::pair{Recompute::selective, core},
        std::pair{Recompute::selective, cheap}, std::pair{Recompute::full, core}})
    EXPECT_EQ(seen.count(want), 1u) << static_cast<int>(want.first) << "/" << want.second;
  EXPECT_EQ(seen.size(), 4u);  // not the user's ["act"]: the search chooses the modules
}

// With latent attention (a query latent) the search also tries selective recompute of all of it,
// the attention core and the up projections with the norms and the activation ("mla_up_proj",
// DeepSeek-V3's choice with the core); each such candidate re-parses and its fragment lists the
// modules. A multi-head attention model's search never lists them
// (TriesRecomputeOfTheNormsAndTheActivation: four kinds).
TEST_F(CostModelSearch, TriesRecomputingLatentAttentionsUpProjections) {
  const std::string path =
      write("mla.toml",
            "[model]\narch = \"llama\"\nn_layers = 4\nd_model = 64\nn_heads = 4\nn_kv_heads = 4\n"
            "vocab_size = 256\nseq_len = 32\nattention = \"mla\"\n[model.mla]\nq_lora_rank = 24\n"
            "kv_lora_rank = 16\nqk_nope_head_dim = 8\nqk_rope_head_dim = 4\nv_head_dim = 6\n"
            "[train]\nglobal_batch_size = 24\n");
  const SearchResult r = search(path, 2);
  const int all = (1 << static_cast<int>(RecomputeModule::core_attn)) |
                  (1 << static_cast<int>(RecomputeModule::layernorm)) |
                  (1 << static_cast<int>(RecomputeModule::act)) |
                  (1 << static_cast<int>(RecomputeModule::mla_up_proj));
  int seen = 0;
  for (const Candidate& c : r.ranked) {
    if (!c.cfg.train.recompute_modules.mla_up_proj()) continue;
    ++seen;
    EXPECT_EQ(c.cfg.train.recompute_modules.bits, all);
    EXPECT_EQ(parse_config(path, c.sets).train.recompute_modules, c.cfg.train.recompute_modules);
    EXPECT_NE(layout_fragment(c, 2, hw_).find("\"mla_up_proj\""), std::string::npos);
  }
  EXPECT_GT(seen, 0);
}

// On a latent-attention model (8192 positions: the search tries cp from there) the search tries
// the ring, Ulysses and hybrid (at cp 4: all-to-all groups of 2) each moving the latent and
// moving the K/V; each such fragment names its choice and parses back to the candidate's layout.
TEST_F(CostModelSearch, TriesTheLatentAndTheKvUnderEveryCpImplementation) {
  const std::string path =
      write("mla.toml",
            "[model]\narch = \"llama\"\nn_layers = 2\nd_model = 64\nn_heads = 4\nn_kv_heads = 4\n"
            "vocab_size = 256\nseq_len = 8192\nattention = \"mla\"\n[model.mla]\nq_lora_rank = 24\n"
            "kv_lora_rank = 16\nqk_nope_head_dim = 8\nqk_rope_head_dim = 4\nv_head_dim = 6\n"
            "[train]\nglobal_batch_size = 2\n");
  std::set<std::tuple<CpImpl, int64_t, bool>> seen;
  for (const Candidate& c : search(path, 4).ranked) {
    const ParallelConfig& p = c.cfg.parallel;
    if (p.cp == 1) continue;
    seen.insert({p.cp_impl, p.cp_ulysses, p.cp_latent});
    const std::string fragment = layout_fragment(c, 4, hw_);
    EXPECT_NE(fragment.find(p.cp_latent ? "cp_latent = true" : "cp_latent = false"),
              std::string::npos);
    EXPECT_EQ(p.cp_impl == CpImpl::hybrid, fragment.find("cp_ulysses = 2") != std::string::npos);
    const Config parsed = parse_config(path, c.sets);
    EXPECT_EQ(parsed.parallel.cp_impl, p.cp_impl);
    EXPECT_EQ(parsed.parallel.cp_ulysses, p.cp_ulysses);
  }
  EXPECT_EQ(seen, (std::set<std::tuple<CpImpl, int64_t, bool>>{{CpImpl::ring, 0, true},
                                                               {CpImpl::ring, 0, false},
                                                               {CpImpl::ulysses, 0, true},
                                                               {CpImpl::ulysses, 0, false},
                                                               {CpImpl::hybrid, 2, true},
                                                               {CpImpl::hybrid, 2, false}}));
}

// On a model whose every MLP is routed experts (no dense layer, no shared experts) "act" has
// nothing to rerun (a run refuses it): the search's variant recomputes the norms and the routed
// experts' activation ("moe_act"), and its candidates re-parse.
TEST_F(CostModelSearch, RecomputesNoDenseActivationWhereEveryMlpIsRouted) {
  const std::string path = model(4);
  const std::vector<std::string> moe{"model.moe.num_experts=4", "model.moe.d_ff_expert=64"};
  const SearchResult r = search_layouts(path, moe, parse_config(path, moe), 2, hw_, 1000000);
  const int norms = (1 << static_cast<int>(RecomputeModule::layernorm)) |
                    (1 << static_cast<int>(RecomputeModule::moe_act));
  int seen = 0;
  for (const Candidate& c : r.ranked) {
    EXPECT_FALSE(c.cfg.train.recompute == Recompute::selective &&
                 c.cfg.train.recompute_modules.act())
        << layout_text(c.cfg, 2);
    seen += c.cfg.train.recompute == Recompute::selective &&
            c.cfg.train.recompute_modules.bits == norms;
  }
  EXPECT_GT(seen, 0);
}

// With routed experts the search tries DualPipeV as DualPipe splits its backwards and deferring
// at most one weight half (parallel.pp_max_deferred), each candidate re-parsing from its
// overrides and --write writing the cap; a dense model's search leaves DualPipeV out.
TEST_F(CostModelSearch, TriesDualPipeVWithRoutedExperts) {
  const std::string path = model(4);
  const std::vector<std::string> moe{"model.moe.num_experts=4", "model.moe.d_ff_expert=64"};
  const SearchResult r = search_layouts(path, moe, parse_config(path, moe), 2, hw_, 1000000);
  std::set<int64_t> caps;
  for (const Candidate& c : r.ranked) {
    const ParallelConfig& p = c.cfg.parallel;
    if (p.pp_schedule != PipeSchedule::dualpipe_v) {
      EXPECT_EQ(p.pp_max_deferred, -1) << layout_text(c.cfg, 2);
      continue;
    }
    caps.insert(p.pp_max_deferred);
    std::vector<std::string> sets = moe;
    sets.insert(sets.end(), c.sets.begin(), c.sets.end());
    EXPECT_EQ(parse_config(path, sets).parallel.pp_max_deferred, p.pp_max_deferred);
    EXPECT_EQ(layout_fragment(c, 2, hw_).find("pp_max_deferred = 1") != std::string::npos,
              p.pp_max_deferred == 1);
    EXPECT_EQ(layout_text(c.cfg, 2).find("dualpipev v2 deferring at most 1") != std::string::npos,
              p.pp_max_deferred == 1)
        << layout_text(c.cfg, 2);
  }
  EXPECT_EQ(caps, (std::set<int64_t>{-1, 1}));
  for (const Candidate& c : search(path, 2).ranked)
    EXPECT_NE(c.cfg.parallel.pp_schedule, PipeSchedule::dualpipe_v) << layout_text(c.cfg, 2);
}

TEST_F(CostModelSearch, TriesUnevenPipelineSplits) {
  using Split = std::tuple<int64_t, int64_t, std::vector<int64_t>>;
  const auto s70 = splits(search(model(70), 12));
  for (const Split& want : {Split{12, 1, {5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5}},
                            Split{6, 1, {11, 12, 12, 12, 12, 11}}, Split{2, 2, {17, 18, 18, 17}}})
    EXPECT_EQ(s70.count(want), 1u) << std::get<0>(want) << " x v" << std::get<1>(want);
  std::vector<int64_t> v2(24, 3);
  v2.front() = v2.back() = 2;
  EXPECT_EQ(s70.count({12, 2, v2}), 1u);
  EXPECT_EQ(s70.count({12, 1, {}}), 0u);  // 70 layers do not split evenly over 12 stages
  // 61 layers (DeepSeek-V3's) over 2 stages: the last one lighter.
  const auto s61 = splits(search(model(61), 8));
  EXPECT_EQ(s61.count({2, 1, {31, 30}}), 1u);
  EXPECT_EQ(s61.count({8, 1, {7, 8, 8, 8, 8, 8, 7, 7}}), 1u);
  const auto s8 = splits(search(model(8), 4));
  for (const Split& want : {Split{4, 1, {}}, Split{4, 1, {1, 3, 3, 1}}, Split{2, 1, {}},
                            Split{2, 2, {}}, Split{2, 2, {1, 3, 3, 1}}, Split{2, 4, {}}})
    EXPECT_EQ(s8.count(want), 1u) << std::get<0>(want) << " x v" << std::get<1>(want);
  const size_t pp2 = std::count_if(s8.begin(), s8.end(), [](const Split& s) {
    return std::get<0>(s) == 2 && std::get<1>(s) != 2;  // 2 stages, or 8 of one layer each
  });
  EXPECT_EQ(pp2, 2u);
}

// A layout with an uneven split predicts the same step when planned again from its overrides and
// from the fragment `--write` saves, and the ranking stays sorted.
TEST_F(CostModelSearch, UnevenLayoutsPlanTheSameFromTheirFragment) {
  const std::string path = model(70);
  const SearchResult r = search(path, 12);
  for (size_t i = 1; i < r.ranked.size(); ++i)
    EXPECT_LE(r.ranked[i - 1].cost.step_s, r.ranked[i].cost.step_s);
  int checked = 0;
  for (const Candidate& c : r.ranked) {
    if (c.cfg.parallel.pp_layers.empty()) continue;
    const std::string text = layout_text(c.cfg, 12);
    EXPECT_NE(text.find(" layers ["), std::string::npos) << text;
    EXPECT_DOUBLE_EQ(predict_step(parse_config(path, c.sets), 12, hw_).step_s, c.cost.step_s)
        << text;
    const std::string frag = write(concat("best", checked, ".toml"), layout_fragment(c, 12, hw_));
    const std::string cfg = write(concat("searched", checked, ".toml"),
                                  concat("include = [\"", path, "\", \"", frag, "\"]\n"));
    const Config again = parse_config(cfg, {});
    EXPECT_EQ(again.parallel.pp_layers, c.cfg.parallel.pp_layers) << text;
    EXPECT_DOUBLE_EQ(predict_step(again, 12, hw_).step_s, c.cost.step_s) << text;
    if (++checked == 3) break;
  }
  EXPECT_EQ(checked, 3);
}

}  // namespace
}  // namespace llmt
