// Config parsing: presets, includes, --set overrides, the to_toml round trip, and the exact
// content of every error (dotted key, file:line:col, numbers). Also runs the e2e bad-config cases
// of tests/e2e/bad_configs through parse_config, so they are checked without the binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/check.h"
#include "train/config.h"
#include "train/memory_estimate.h"

namespace llmt {
namespace {

namespace fs = std::filesystem;

// The message of the ConfigError that parsing throws; fails the test when nothing is thrown.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {},
                     const std::string& name = "t.toml") {
  try {
    parse_config_string(text, name, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for:\n" << text;
  return "";
}

std::string file_error_of(const fs::path& path, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(path.string(), overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for " << path;
  return "";
}

void expect_contains(const std::string& msg, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) {
    EXPECT_NE(msg.find(p), std::string::npos) << "missing: " << p << "\nin: " << msg;
  }
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

uint64_t bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

// How expect_same compares one key's member in two configs: exactly, floats bit for bit.
template <typename T>
bool same(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    return bits(a) == bits(b);
  } else {
    return a == b;
  }
}
bool same(const std::vector<DataSourceConfig>& a, const std::vector<DataSourceConfig>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](auto& x, auto& y) {
           return x.path == y.path && bits(x.weight) == bits(y.weight);
         });
}

// One comparison per config key, named by its dotted key; EqualityCoversEveryKey checks that the
// names are exactly config_keys(), so a new key without a comparison here fails the suite.
using SameFn = std::function<bool(const Config&, const Config&)>;
#define LLMT_KEY(key, member)                                                      \
  {                                                                                \
    key, [](const Config& a, const Config& b) { return same(a.member, b.member); } \
  }
const std::vector<std::pair<std::string, SameFn>>& key_comparisons() {
  static const std::vector<std::pair<std::string, SameFn>> table{
      LLMT_KEY("model.arch", model.arch),
      LLMT_KEY("model.vocab_size", model.vocab_size),
      LLMT_KEY("model.n_layers", model.n_layers),
      LLMT_KEY("model.d_model", model.d_model),
      LLMT_KEY("model.n_heads", model.n_heads),
      LLMT_KEY("model.n_kv_heads", model.n_kv_heads),
      LLMT_KEY("model.d_ff", model.d_ff),
      LLMT_KEY("model.seq_len", model.seq_len),
      LLMT_KEY("model.norm", model.norm),
      LLMT_KEY("model.activation", model.activation),
      LLMT_KEY("model.position", model.position),
      LLMT_KEY("model.bias", model.bias),
      LLMT_KEY("model.tie_embeddings", model.tie_embeddings),
      LLMT_KEY("model.norm_eps", model.norm_eps),
      LLMT_KEY("model.rope_theta", model.rope_theta),
      LLMT_KEY("model.dropout", model.dropout),
      LLMT_KEY("model.init_std", model.init_std),
      LLMT_KEY("model.attention", model.attention),
      LLMT_KEY("model.mtp_depth", model.mtp_depth),
      LLMT_KEY("model.mtp_loss_weight", model.mtp_loss_weight),
      LLMT_KEY("model.rope_scaling.rope_type", model.rope_scaling.rope_type),
      LLMT_KEY("model.rope_scaling.factor", model.rope_scaling.factor),
      LLMT_KEY("model.rope_scaling.original_max_position_embeddings",
               model.rope_scaling.original_max_position_embeddings),
      LLMT_KEY("model.rope_scaling.low_freq_factor", model.rope_scaling.low_freq_factor),
      LLMT_KEY("model.rope_scaling.high_freq_factor", model.rope_scaling.high_freq_factor),
      LLMT_KEY("model.rope_scaling.beta_fast", model.rope_scaling.beta_fast),
      LLMT_KEY("model.rope_scaling.beta_slow", model.rope_scaling.beta_slow),
      LLMT_KEY("model.rope_scaling.mscale", model.rope_scaling.mscale),
      LLMT_KEY("model.rope_scaling.mscale_all_dim", model.rope_scaling.mscale_all_dim),
      LLMT_KEY("model.rope_scaling.attention_factor", model.rope_scaling.attention_factor),
      LLMT_KEY("model.mla.q_lora_rank", model.mla.q_lora_rank),
      LLMT_KEY("model.mla.kv_lora_rank", model.mla.kv_lora_rank),
      LLMT_KEY("model.mla.qk_nope_head_dim", model.mla.qk_nope_head_dim),
      LLMT_KEY("model.mla.qk_rope_head_dim", model.mla.qk_rope_head_dim),
      LLMT_KEY("model.mla.v_head_dim", model.mla.v_head_dim),
      LLMT_KEY("model.moe.num_experts", model.moe.num_experts),
      LLMT_KEY("model.moe.top_k", model.moe.top_k),
      LLMT_KEY("model.moe.d_ff_expert", model.moe.d_ff_expert),
      LLMT_KEY("model.moe.router", model.moe.router),
      LLMT_KEY("model.moe.normalize", model.moe.normalize),
      LLMT_KEY("model.moe.n_group", model.moe.n_group),
      LLMT_KEY("model.moe.topk_group", model.moe.topk_group),
      LLMT_KEY("model.moe.routed_scaling_factor", model.moe.routed_scaling_factor),
      LLMT_KEY("model.moe.balance", model.moe.balance),
      LLMT_KEY("model.moe.aux_loss_coef", model.moe.aux_loss_coef),
      LLMT_KEY("model.moe.bias_update_rate", model.moe.bias_update_rate),
      LLMT_KEY("model.moe.z_loss_coef", model.moe.z_loss_coef),
      LLMT_KEY("model.moe.capacity_factor", model.moe.capacity_factor),
      LLMT_KEY("model.moe.shared_experts", model.moe.shared_experts),
      LLMT_KEY("model.moe.d_ff_shared", model.moe.d_ff_shared),
      LLMT_KEY("model.moe.first_dense_layers", model.moe.first_dense_layers),
      LLMT_KEY("model.moe.every", model.moe.every),
      LLMT_KEY("train.steps", train.steps),
      LLMT_KEY("train.global_batch_size", train.global_batch_size),
      LLMT_KEY("train.micro_batch_size", train.micro_batch_size),
      LLMT_KEY("train.precision", train.precision),
      LLMT_KEY("train.grad_dtype", train.grad_dtype),
      LLMT_KEY("train.seed", train.seed),
      LLMT_KEY("train.run_dir", train.run_dir),
      LLMT_KEY("train.device", train.device),
      LLMT_KEY("train.threads", train.threads),
      LLMT_KEY("train.eval_interval", train.eval_interval),
      LLMT_KEY("train.eval_iters", train.eval_iters),
      LLMT_KEY("train.recompute", train.recompute),
      LLMT_KEY("train.recompute_layers", train.recompute_layers),
      LLMT_KEY("train.recompute_modules", train.recompute_modules),
      LLMT_KEY("train.distribute_saved_activations", train.distribute_saved_activations),
      LLMT_KEY("train.fp8", train.fp8),
      LLMT_KEY("train.fp8_block", train.fp8_block),
      LLMT_KEY("train.on_nonfinite", train.on_nonfinite),
      LLMT_KEY("train.max_skipped_steps", train.max_skipped_steps),
      LLMT_KEY("train.time_limit", train.time_limit),
      LLMT_KEY("optimizer.type", optimizer.type),
      LLMT_KEY("optimizer.lr", optimizer.lr),
      LLMT_KEY("optimizer.min_lr", optimizer.min_lr),
      LLMT_KEY("optimizer.warmup_steps", optimizer.warmup_steps),
      LLMT_KEY("optimizer.decay", optimizer.decay),
      LLMT_KEY("optimizer.decay_steps", optimizer.decay_steps),
      LLMT_KEY("optimizer.beta1", optimizer.beta1),
      LLMT_KEY("optimizer.beta2", optimizer.beta2),
      LLMT_KEY("optimizer.eps", optimizer.eps),
      LLMT_KEY("optimizer.weight_decay", optimizer.weight_decay),
      LLMT_KEY("optimizer.grad_clip", optimizer.grad_clip),
      LLMT_KEY("optimizer.initial_loss_scale", optimizer.initial_loss_scale),
      LLMT_KEY("optimizer.loss_scale_window", optimizer.loss_scale_window),
      LLMT_KEY("optimizer.muon.momentum", optimizer.muon.momentum),
      LLMT_KEY("optimizer.muon.nesterov", optimizer.muon.nesterov),
      LLMT_KEY("optimizer.muon.ns_steps", optimizer.muon.ns_steps),
      LLMT_KEY("parallel.tp", parallel.tp),
      LLMT_KEY("parallel.cp", parallel.cp),
      LLMT_KEY("parallel.cp_impl", parallel.cp_impl),
      LLMT_KEY("parallel.cp_ulysses", parallel.cp_ulysses),
      LLMT_KEY("parallel.cp_latent", parallel.cp_latent),
      LLMT_KEY("parallel.dp", parallel.dp),
      LLMT_KEY("parallel.ep", parallel.ep),
      LLMT_KEY("parallel.pp", parallel.pp),
      LLMT_KEY("parallel.pp_schedule", parallel.pp_schedule),
      LLMT_KEY("parallel.virtual_stages", parallel.virtual_stages),
      LLMT_KEY("parallel.pp_layers", parallel.pp_layers),
      LLMT_KEY("parallel.pp_max_deferred", parallel.pp_max_deferred),
      LLMT_KEY("parallel.zero_stage", parallel.zero_stage),
      LLMT_KEY("parallel.zero_shard_group", parallel.zero_shard_group),
      LLMT_KEY("parallel.zero_quantized_weights", parallel.zero_quantized_weights),
      LLMT_KEY("parallel.zero_quantized_gradients", parallel.zero_quantized_gradients),
      LLMT_KEY("parallel.zero_quantized_gradients_group", parallel.zero_quantized_gradients_group),
      LLMT_KEY("parallel.zero_quant_block", parallel.zero_quant_block),
      LLMT_KEY("parallel.zero_hierarchical_partition", parallel.zero_hierarchical_partition),
      LLMT_KEY("parallel.sequence_parallel", parallel.sequence_parallel),
      LLMT_KEY("parallel.bucket_mb", parallel.bucket_mb),
      LLMT_KEY("data.source", data.source),
      LLMT_KEY("data.seed", data.seed),
      LLMT_KEY("data.path", data.path),
      LLMT_KEY("data.sources", data.sources),
      LLMT_KEY("data.split", data.split),
      LLMT_KEY("data.tokenizer", data.tokenizer),
      LLMT_KEY("checkpoint.dir", checkpoint.dir),
      LLMT_KEY("checkpoint.interval", checkpoint.interval),
      LLMT_KEY("checkpoint.keep_last", checkpoint.keep_last),
      LLMT_KEY("checkpoint.load", checkpoint.load),
      LLMT_KEY("checkpoint.init_from", checkpoint.init_from),
      LLMT_KEY("checkpoint.async", checkpoint.async),
      LLMT_KEY("comm.timeout_s", comm.timeout_s),
      LLMT_KEY("offload.optimizer", offload.optimizer),
      LLMT_KEY("offload.params", offload.params),
      LLMT_KEY("offload.nvme_dir", offload.nvme_dir),
      LLMT_KEY("offload.buffer_mb", offload.buffer_mb),
      LLMT_KEY("log.interval", log.interval),
      LLMT_KEY("log.progress", log.progress),
      LLMT_KEY("log.metrics", log.metrics),
      LLMT_KEY("log.tensorboard", log.tensorboard),
      LLMT_KEY("log.peak_flops", log.peak_flops),
      LLMT_KEY("plan.hardware", plan.hardware),
      LLMT_KEY("plan.world", plan.world),
  };
  return table;
}
#undef LLMT_KEY

// Every key's member equal, floats bit for bit.
void expect_same(const Config& a, const Config& b) {
  for (const auto& [key, equal] : key_comparisons()) {
    EXPECT_TRUE(equal(a, b)) << key << " differs";
  }
}

TEST(ConfigToToml, EqualityCoversEveryKey) {
  std::vector<std::string> names;
  for (const auto& kv : key_comparisons()) names.push_back(kv.first);
  EXPECT_EQ(names, config_keys());
}

Config round_trip(const Config& c) {
  const std::string text = to_toml(c);
  Config back = parse_config_string(text, "resolved.toml");
  const std::string again = to_toml(back);
  EXPECT_EQ(again.substr(again.find("[model]")), text.substr(text.find("[model]")));
  return back;
}

// A fresh directory per test for include files.
class ConfigFiles : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("llmt_test_config_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& rel, const std::string& text) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
  fs::path dir_;
};

// ---- presets and derived defaults ----

TEST(ConfigPresets, EmptyFileIsGpt2WithDerivedDefaults) {
  const Config c = parse_config_string("", "empty.toml");
  EXPECT_EQ(c.source_path, "empty.toml");
  EXPECT_EQ(c.model.arch, Arch::gpt2);
  EXPECT_EQ(c.model.norm, NormKind::layernorm);
  EXPECT_EQ(c.model.activation, Activation::gelu);
  EXPECT_EQ(c.model.position, PositionKind::learned);
  EXPECT_TRUE(c.model.bias);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.d_ff, 4 * 768);
  EXPECT_EQ(c.model.n_kv_heads, 12);
  EXPECT_EQ(c.train.micro_batch_size, 8);
  EXPECT_EQ(c.optimizer.decay_steps, 100);
  EXPECT_EQ(c.data.seed, 1234u);
  EXPECT_EQ(grad_accum_steps(c), 1);
}

TEST(ConfigPresets, LlamaSwitchesAndDff) {
  const Config c =
      parse_config_string("[model]\narch = \"llama\"\nd_model = 4096\nn_heads = 32\n", "l.toml");
  EXPECT_EQ(c.model.norm, NormKind::rmsnorm);
  EXPECT_EQ(c.model.activation, Activation::swiglu);
  EXPECT_EQ(c.model.position, PositionKind::rope);
  EXPECT_FALSE(c.model.bias);
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.d_ff, 11008);  // Llama-7B: 256 * ceil(8*4096/3 / 256)
  // 8/3*C rounded up to a multiple of 256.
  const std::vector<std::pair<int, int>> dff = {
      {64, 256}, {96, 256}, {128, 512}, {512, 1536}, {768, 2048}};
  for (auto [d_model, d_ff] : dff) {
    const Config s = parse_config_string(
        "[model]\narch = \"llama\"\nn_heads = 2\nd_model = " + std::to_string(d_model), "l.toml");
    EXPECT_EQ(s.model.d_ff, d_ff) << "d_model=" << d_model;
  }
}

TEST(ConfigPresets, ExplicitKeysWin) {
  const Config l = parse_config_string(
      "[model]\narch = \"llama\"\nnorm = \"layernorm\"\nactivation = \"gelu\"\nposition = "
      "\"learned\"\n"
      "bias = true\ntie_embeddings = true\nd_ff = 1000\n",
      "l.toml");
  EXPECT_EQ(l.model.norm, NormKind::layernorm);
  EXPECT_EQ(l.model.activation, Activation::gelu);
  EXPECT_EQ(l.model.position, PositionKind::learned);
  EXPECT_TRUE(l.model.bias);
  EXPECT_TRUE(l.model.tie_embeddings);
  EXPECT_EQ(l.model.d_ff, 1000);
  const Config g = parse_config_string(
      "[model]\nnorm = \"rmsnorm\"\nposition = \"rope\"\nbias = false\n", "g.toml");
  EXPECT_EQ(g.model.arch, Arch::gpt2);
  EXPECT_EQ(g.model.norm, NormKind::rmsnorm);
  EXPECT_EQ(g.model.activation, Activation::gelu);
  EXPECT_EQ(g.model.position, PositionKind::rope);
  EXPECT_FALSE(g.model.bias);
  EXPECT_TRUE(g.model.tie_embeddings);
}

TEST(ConfigPresets, ZeroMeansDerivedElseExplicit) {
  const Config c = parse_config_string(
      "[model]\nn_heads = 12\nn_kv_heads = 4\n[train]\nsteps = 500\nglobal_batch_size = 32\n"
      "micro_batch_size = 4\nseed = 77\n[optimizer]\nwarmup_steps = 10\n",
      "d.toml");
  EXPECT_EQ(c.model.n_kv_heads, 4);
  EXPECT_EQ(c.train.micro_batch_size, 4);
  EXPECT_EQ(grad_accum_steps(c), 8);
  EXPECT_EQ(c.optimizer.decay_steps, 500);
  EXPECT_EQ(c.data.seed, 77u);
  const Config e =
      parse_config_string("[optimizer]\ndecay_steps = 50\n[data]\nseed = 5\n", "e.toml");
  EXPECT_EQ(e.optimizer.decay_steps, 50);
  EXPECT_EQ(e.data.seed, 5u);
}

TEST(ConfigPresets, DerivedNumbers) {
  EXPECT_EQ(precision_name(Precision::fp32), "fp32");
  EXPECT_EQ(precision_name(Precision::bf16), "bf16");
  EXPECT_EQ(precision_name(Precision::fp16), "fp16");
  Config c;
  c.train.global_batch_size = 12;
  EXPECT_EQ(grad_accum_steps(c), 1);  // micro 0 = global
  c.train.micro_batch_size = 3;
  EXPECT_EQ(grad_accum_steps(c), 4);
}

// ---- includes ----

TEST_F(ConfigFiles, IncludesMergeKeyByKeyIncludingFileWins) {
  write("base.toml",
        "[model]\nn_layers = 2\nd_model = 64\nn_heads = 4\n[train]\nsteps = 10\n"
        "[optimizer]\nlr = 0.01\n");
  write("sub/mid.toml",
        "include = [\"../base.toml\"]\n[model]\nn_layers = 3\n[train]\nglobal_batch_size = 16\n");
  write("sub/other.toml", "[optimizer]\nlr = 0.02\n[train]\nsteps = 20\n");
  const fs::path top =
      write("top.toml", "include = [\"sub/mid.toml\", \"sub/other.toml\"]\n[train]\nsteps = 30\n");
  const Config c = parse_config(top.string());
  EXPECT_EQ(c.source_path, top.string());
  EXPECT_EQ(c.model.n_layers, 3);            // mid over base
  EXPECT_EQ(c.model.d_model, 64);            // base
  EXPECT_EQ(c.model.n_heads, 4);             // base
  EXPECT_EQ(c.train.global_batch_size, 16);  // mid
  EXPECT_EQ(c.optimizer.lr, 0.02f);          // the later include over the earlier
  EXPECT_EQ(c.train.steps, 30);              // the including file over every base
  EXPECT_EQ(c.optimizer.decay_steps, 30);    // derived after merging
}

TEST_F(ConfigFiles, PresetAppliesAfterMerging) {
  write("base.toml", "[model]\narch = \"llama\"\nd_model = 256\nn_heads = 4\n");
  const fs::path top =
      write("top.toml", "include = [\"base.toml\"]\n[model]\nposition = \"learned\"\n");
  const Config c = parse_config(top.string());
  EXPECT_EQ(c.model.norm, NormKind::rmsnorm);
  EXPECT_EQ(c.model.position, PositionKind::learned);
  EXPECT_EQ(c.model.d_ff, 768);
  // And an arch given by --set re-derives the switches the files did not set.
  const Config g = parse_config(top.string(), {"model.arch=gpt2"});
  EXPECT_EQ(g.model.norm, NormKind::layernorm);
  EXPECT_EQ(g.model.d_ff, 1024);
  EXPECT_TRUE(g.model.bias);
}

TEST_F(ConfigFiles, DiamondIsNotACycle) {
  write("d.toml", "[model]\nn_layers = 5\n");
  write("b.toml", "include = [\"d.toml\"]\n");
  write("c.toml", "include = [\"d.toml\"]\n[train]\nsteps = 7\n");
  const fs::path a = write("a.toml", "include = [\"b.toml\", \"c.toml\"]\n");
  const Config c = parse_config(a.string());
  EXPECT_EQ(c.model.n_layers, 5);
  EXPECT_EQ(c.train.steps, 7);
}

TEST_F(ConfigFiles, ErrorsNameTheIncludedFile) {
  const fs::path base =
      write("base.toml", "[model]\nn_layers = 2\nd_model = \"wide\"\n[train]\nstep = 3\n");
  const fs::path top = write("top.toml", "include = [\"base.toml\"]\n[model]\nn_layers = 4\n");
  const std::string msg = file_error_of(top);
  expect_contains(
      msg,
      {"model.d_model at " + base.string() + ":3:1: expected an integer, found a string (\"wide\")",
       "unknown key train.step at " + base.string() + ":5:1 — did you mean train.steps?"});
  EXPECT_EQ(lines_of(msg).size(), 2u) << msg;
  // A rule broken by keys from two files names both places.
  write("heads.toml", "[model]\nn_heads = 12\n");
  const fs::path two = write("two.toml", "include = [\"heads.toml\"]\n[model]\nd_model = 100\n");
  expect_contains(file_error_of(two),
                  {"model.d_model=100 is not divisible by model.n_heads=12",
                   "model.d_model at " + two.string() + ":3:1",
                   "model.n_heads at " + (dir_ / "heads.toml").string() + ":2:1"});
}

TEST_F(ConfigFiles, IncludeCycles) {
  write("a.toml", "include = [\"b.toml\"]\n");
  write("b.toml", "\ninclude = [\"a.toml\"]\n");
  const std::string a = (dir_ / "a.toml").string(), b = (dir_ / "b.toml").string();
  EXPECT_EQ(file_error_of(dir_ / "a.toml"), "include cycle: " + a + " -> " + b + " -> " + a +
                                                " (include \"a.toml\" at " + b + ":2:12)");
  const fs::path self = write("self.toml", "include = [\"./self.toml\"]\n");
  expect_contains(file_error_of(self),
                  {"include cycle: " + self.string() + " -> " + self.string()});
}

TEST_F(ConfigFiles, IncludeProblems) {
  const fs::path missing = write("m.toml", "include = [\"nope.toml\"]\n");
  expect_contains(file_error_of(missing),
                  {"include \"nope.toml\" at " + missing.string() + ":1:12: cannot open " +
                       (dir_ / "nope.toml").string(),
                   "No such file"});
  const fs::path not_list = write("s.toml", "include = \"base.toml\"\n");
  expect_contains(file_error_of(not_list),
                  {"include at " + not_list.string() +
                   ":1:1: expected an array of file names, found a string (\"base.toml\")"});
  const fs::path not_name = write("n.toml", "include = [3]\n");
  expect_contains(file_error_of(not_name),
                  {"include at " + not_name.string() +
                   ":1:12: expected a file name (string), found an integer (3)"});
  const fs::path syntax = write("base_bad.toml", "[model]\nn_layers = [\n");
  const fs::path top = write("top.toml", "include = [\"base_bad.toml\"]\n");
  expect_contains(file_error_of(top), {"invalid TOML at " + syntax.string() + ":"});
  expect_contains(file_error_of(dir_ / "absent.toml"),
                  {"cannot open " + (dir_ / "absent.toml").string()});
}

// ---- --set overrides ----

TEST(ConfigOverrides, TypedValuesAndBareStrings) {
  const Config c = parse_config_string(
      "[train]\nsteps = 10\nrun_dir = \"runs/file\"\n", "o.toml",
      {"train.steps=50", "optimizer.lr=1e-3", "optimizer.min_lr=0", "model.bias=false",
       "log.peak_flops=1.5e12", "model.arch=llama", "train.run_dir=runs/x",
       "log.metrics=", "train.device=cuda", "train.steps=60"});
  EXPECT_EQ(c.train.steps, 60);  // the later --set wins
  EXPECT_EQ(c.optimizer.lr, 1e-3f);
  EXPECT_EQ(c.optimizer.min_lr, 0.0f);
  EXPECT_FALSE(c.model.bias);
  EXPECT_EQ(c.log.peak_flops, 1.5e12);
  EXPECT_EQ(c.model.arch, Arch::llama);
  EXPECT_EQ(c.model.norm, NormKind::rmsnorm);
  EXPECT_EQ(c.train.run_dir, "runs/x");
  EXPECT_EQ(c.log.metrics, "");
  EXPECT_EQ(c.train.device, "cuda");
}

TEST(ConfigOverrides, TextKeysKeepTheirText) {
  // A date, a number and a quoted TOML string, all into string keys.
  EXPECT_EQ(parse_config_string("", "o.toml", {"train.run_dir=2024-01-01"}).train.run_dir,
            "2024-01-01");
  EXPECT_EQ(parse_config_string("", "o.toml", {"train.run_dir=42"}).train.run_dir, "42");
  EXPECT_EQ(parse_config_string("", "o.toml", {"train.run_dir=\"a b\""}).train.run_dir, "a b");
  EXPECT_EQ(parse_config_string("", "o.toml", {"log.metrics=m=1.jsonl"}).log.metrics, "m=1.jsonl");
}

TEST(ConfigOverrides, Errors) {
  EXPECT_EQ(error_of("", {"model.n_layer=4"}),
            "unknown key model.n_layer at --set — did you mean model.n_layers?");
  EXPECT_EQ(error_of("", {"modle.n_layers=4"}),
            "unknown section [modle] at --set — did you mean [model]?");
  EXPECT_EQ(error_of("", {"train.steps=abc"}),
            "train.steps at --set: expected an integer, found a string (\"abc\")");
  EXPECT_EQ(error_of("", {"train.steps=4.0"}),
            "train.steps at --set: expected an integer, found a float (4.0)");
  EXPECT_EQ(error_of("", {"train.steps"}),
            "--set \"train.steps\": expected section.key=value, e.g. --set train.steps=10");
  EXPECT_EQ(error_of("", {"steps=3"}),
            "--set \"steps=3\": expected section.key=value, e.g. --set train.steps=10");
  // Several bad overrides: all reported.
  EXPECT_EQ(
      lines_of(error_of("", {"model.n_layer=4", "train.steps=x", "optimizer.lr=fast"})).size(), 3u);
}

// ---- to_toml ----

TEST(ConfigToToml, DefaultsAndPresetsRoundTrip) {
  for (const char* text :
       {"", "[model]\narch = \"llama\"\nd_model = 512\nn_heads = 8\nn_kv_heads = 2\n"}) {
    const Config c = parse_config_string(text, "p.toml");
    expect_same(round_trip(c), c);
  }
}

TEST(ConfigToToml, LatentAttentionRoundTrips) {
  const Config c = parse_config_string(R"(
[model]
arch = "llama"
attention = "mla"
[model.mla]
q_lora_rank = 48
kv_lora_rank = 32
qk_nope_head_dim = 16
qk_rope_head_dim = 8
v_head_dim = 12
[parallel]
cp_latent = false
)",
                                       "mla.toml");
  expect_same(round_trip(c), c);
  const Config d = parse_config_string("", "d.toml");
  EXPECT_NE(c.model.attention, d.model.attention);
  EXPECT_NE(c.parallel.cp_latent, d.parallel.cp_latent);
  EXPECT_EQ(c.model.mla.qk_head_dim(), 24);
  for (const auto& [mine, def] : {std::pair{c.model.mla.q_lora_rank, d.model.mla.q_lora_rank},
                                  {c.model.mla.kv_lora_rank, d.model.mla.kv_lora_rank},
                                  {c.model.mla.qk_nope_head_dim, d.model.mla.qk_nope_head_dim},
                                  {c.model.mla.qk_rope_head_dim, d.model.mla.qk_rope_head_dim},
                                  {c.model.mla.v_head_dim, d.model.mla.v_head_dim}})
    EXPECT_NE(mine, def);
}

TEST(ConfigToToml, EveryKeyNonDefaultRoundTrips) {
  const Config c = parse_config_string(R"(
[model]
arch = "llama"
vocab_size = 32000
n_layers = 4
d_model = 192
n_heads = 8
n_kv_heads = 4
d_ff = 500
seq_len = 80
norm = "layernorm"
activation = "gelu"
position = "learned"
bias = true
tie_embeddings = true
norm_eps = 1e-6
rope_theta = 500000.0
dropout = 0.1
init_std = 0.006
mtp_depth = 2
mtp_loss_weight = 0.1
[model.moe]
num_experts = 4
top_k = 1
d_ff_expert = 96
router = "sigmoid"
normalize = false
n_group = 2
topk_group = 1
routed_scaling_factor = 2.5
balance = "bias"
aux_loss_coef = 0.02
bias_update_rate = 0.002
z_loss_coef = 0.001
capacity_factor = 1.25
shared_experts = 1
d_ff_shared = 64
first_dense_layers = 1
every = 2
[train]
steps = 1000
global_batch_size = 24
micro_batch_size = 6
precision = "fp16"
grad_dtype = "compute"
seed = 9223372036854775807
run_dir = "runs/\"quoted\" \\ tab\t nl\n é \u0001"
device = "cuda"
threads = 3
eval_interval = 25
eval_iters = 4
recompute = "selective"
recompute_layers = 1
recompute_modules = ["layernorm", "core_attn", "act", "moe_act"]
fp8 = "blockwise"
fp8_block = 64
on_nonfinite = "skip"
max_skipped_steps = 7
time_limit = 3600.5
[optimizer]
type = "muon"
lr = 3e-4
min_lr = 3.3e-5
warmup_steps = 100
decay = "linear"
decay_steps = 900
beta1 = 0.85
beta2 = 0.999
eps = 1e-10
weight_decay = 0.0
grad_clip = 0.5
initial_loss_scale = 1024
loss_scale_window = 50
[optimizer.muon]
momentum = 0.9
nesterov = false
ns_steps = 6
[parallel]
tp = 2
cp = 4
cp_impl = "hybrid"
cp_ulysses = 2
dp = 2
ep = 2
pp = 2
pp_schedule = "dualpipev"
virtual_stages = 2
pp_layers = [1, 1, 1, 1]
pp_max_deferred = 0
zero_stage = 3
zero_shard_group = 1
zero_quantized_weights = true
zero_quantized_gradients = true
zero_quantized_gradients_group = 1
zero_quant_block = 64
zero_hierarchical_partition = 1
sequence_parallel = true
bucket_mb = 12.5
[checkpoint]
dir = "ck"
interval = 10
keep_last = 3
load = "auto"
init_from = "runs/base/checkpoints"
async = true
[comm]
timeout_s = 120.5
[offload]
optimizer = "nvme"
params = "nvme"
nvme_dir = "/var/tmp"
buffer_mb = 16.5
[data]
source = "synthetic"
seed = 11
path = "corpus/a"
split = "90,5,5"
tokenizer = "corpus/tok.model"
[[data.sources]]
path = "corpus/b"
weight = 0.3
[[data.sources]]
path = "/abs/c"
weight = 2
[log]
interval = 10
progress = false
metrics = ""
tensorboard = true
peak_flops = 989.5e12
[plan]
hardware = "h100-80gb-sxm"
world = 4096
)",
                                       "all.toml");
  EXPECT_EQ(c.train.run_dir, "runs/\"quoted\" \\ tab\t nl\n é \x01");
  EXPECT_EQ(c.optimizer.initial_loss_scale, 1024.0f);
  const Config back = round_trip(c);
  expect_same(back, c);
  const std::string text = to_toml(c);
  // Every key is set away from its default (the llama preset's, for the keys the preset sets), so
  // the round trip above exercises every key; but data.source, whose other value needs dataset
  // files, train.distribute_saved_activations, whose other value needs full recompute without
  // the sequence parallelism set here (DistributeSavedActivationsRoundTrips), latent
  // attention's keys (parallel.cp_latent among them), which need rope, no biases and no kv groups
  // (LatentAttentionRoundTrips), and [model.rope_scaling], which needs rope
  // (RopeScalingRoundTrips).
  const std::vector<std::string> keys = config_keys();
  const auto values = [&keys](const std::string& toml) {  // key -> its line, in key order
    std::vector<std::string> out;
    size_t next = 0;
    for (const std::string& line : lines_of(toml)) {
      if (line.empty() || line[0] == '#' || line[0] == '[' || next == keys.size()) continue;
      out.push_back(keys[next++] + ": " + line);
    }
    return out;
  };
  const std::vector<std::string> set = values(text);
  const std::vector<std::string> gpt2 = values(to_toml(parse_config_string("", "d.toml")));
  const std::vector<std::string> llama =
      values(to_toml(parse_config_string("[model]\narch = \"llama\"\n", "d.toml")));
  ASSERT_EQ(set.size(), keys.size());
  ASSERT_EQ(gpt2.size(), keys.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    if (keys[k] == "data.source" || keys[k] == "train.distribute_saved_activations" ||
        keys[k] == "model.attention" || keys[k].starts_with("model.mla.") ||
        keys[k].starts_with("model.rope_scaling.") || keys[k] == "parallel.cp_latent")
      continue;
    EXPECT_NE(set[k], keys[k] == "model.arch" ? gpt2[k] : llama[k]) << "left at default";
  }
  for (const char* line :
       {"[model]\narch = \"llama\"\n", "\nn_kv_heads = 4\n", "\nlr = 0.0003\n", "\ndropout = 0.1\n",
        "\nweight_decay = 0.0\n", "\nseed = 9223372036854775807\n", "\ndecay = \"linear\"\n",
        "\nsources = [{path = \"corpus/b\", weight = 0.3}, {path = \"/abs/c\", weight = 2.0}]\n"}) {
    expect_contains(text, {line});
  }
}

// [model.rope_scaling]: every key away from its default round-trips (YaRN's keys; llama3's two
// of its own in a second config), and what cannot be honoured is refused naming the keys.
TEST(ConfigToToml, RopeScalingRoundTrips) {
  const Config yarn = parse_config_string(R"(
[model]
arch = "llama"
[model.rope_scaling]
rope_type = "yarn"
factor = 40.0
original_max_position_embeddings = 4096
beta_fast = 16.0
beta_slow = 2.0
mscale = 0.707
mscale_all_dim = 0.5
attention_factor = 1.25
)",
                                          "y.toml");
  expect_same(round_trip(yarn), yarn);
  const Config llama3 = parse_config_string(
      "[model]\narch = \"llama\"\n[model.rope_scaling]\nrope_type = \"llama3\"\nfactor = 8.0\n"
      "original_max_position_embeddings = 8192\nlow_freq_factor = 2.0\nhigh_freq_factor = 5.0\n",
      "l.toml");
  expect_same(round_trip(llama3), llama3);
  const RopeScaling d;
  const RopeScaling& y = yarn.model.rope_scaling;
  const RopeScaling& l = llama3.model.rope_scaling;
  EXPECT_TRUE(y.rope_type != d.rope_type && y.factor != d.factor &&
              y.original_max_position_embeddings != d.original_max_position_embeddings &&
              y.beta_fast != d.beta_fast && y.beta_slow != d.beta_slow && y.mscale != d.mscale &&
              y.mscale_all_dim != d.mscale_all_dim && y.attention_factor != d.attention_factor);
  EXPECT_TRUE(l.low_freq_factor != d.low_freq_factor && l.high_freq_factor != d.high_freq_factor);
  expect_contains(error_of("[model.rope_scaling]\nrope_type = \"yarn\"\nfactor = 4.0\n"
                           "original_max_position_embeddings = 64\n"),
                  {"model.rope_scaling.rope_type=\"yarn\" scales RoPE's frequencies, but "
                   "model.position=\"learned\" has no RoPE"});
  expect_contains(error_of("[model]\narch = \"llama\"\n[model.rope_scaling]\nfactor = 8.0\n"),
                  {"[model.rope_scaling] sets a key, but its rope_type is \"none\""});
  expect_contains(error_of("[model]\narch = \"llama\"\n[model.rope_scaling]\n"
                           "rope_type = \"llama3\"\nfactor = 0.5\n"),
                  {"model.rope_scaling.factor=0.5 must be >= 1",
                   "model.rope_scaling.rope_type=\"llama3\" needs the pre-training context"});
  expect_contains(error_of("[model]\narch = \"llama\"\n[model.rope_scaling]\n"
                           "rope_type = \"llama3\"\nfactor = 8.0\n"
                           "original_max_position_embeddings = 8192\nhigh_freq_factor = 1.0\n"),
                  {"must satisfy 0 < low < high"});
  expect_contains(error_of("[model]\narch = \"llama\"\n[model.rope_scaling]\n"
                           "rope_type = \"yarn\"\nfactor = 8.0\n"
                           "original_max_position_embeddings = 4096\nbeta_fast = 1.0\n"),
                  {"must satisfy 0 < beta_slow < beta_fast"});
  expect_contains(
      error_of("[model]\narch = \"llama\"\n[model.rope_scaling]\nrope_type = \"ntk\"\n"),
      {"expected one of \"none\", \"linear\", \"llama3\", \"yarn\""});
}

TEST(ConfigToToml, DistributeSavedActivationsRoundTrips) {
  const Config c = parse_config_string(
      "[model]\nvocab_size = 256\n[train]\nrecompute = \"full\"\n"
      "distribute_saved_activations = true\n[parallel]\ntp = 2\n",
      "t.toml");
  EXPECT_TRUE(c.train.distribute_saved_activations);
  expect_contains(to_toml(c), {"\ndistribute_saved_activations = true\n"});
  expect_same(round_trip(c), c);
}

TEST(ConfigToToml, Fp8RoundTrips) {
  const Config c = parse_config_string(
      "[model]\nvocab_size = 256\n[train]\nprecision = \"bf16\"\nfp8 = \"blockwise\"\n"
      "fp8_block = 64\n",
      "t.toml");
  EXPECT_EQ(c.train.fp8, Fp8Scaling::blockwise);
  EXPECT_EQ(c.train.fp8_block, 64);
  expect_contains(to_toml(c), {"\nfp8 = \"blockwise\"\n", "\nfp8_block = 64\n"});
  expect_same(round_trip(c), c);
}

TEST(ConfigToToml, RandomFloatsRoundTripBitExactly) {
  std::mt19937 gen(123);
  std::uniform_real_distribution<double> exponent(-12, 12);
  for (int i = 0; i < 2000; ++i) {
    Config c = parse_config_string("", "r.toml");
    auto draw = [&] { return static_cast<float>(std::pow(10.0, exponent(gen))); };
    c.model.norm_eps = draw();
    c.model.rope_theta = draw();
    c.model.init_std = std::min(1.0f, draw());  // at most 1.0 (check_model_config)
    c.optimizer.lr = draw();
    c.optimizer.min_lr = c.optimizer.lr * std::uniform_real_distribution<float>(0, 1)(gen);
    c.optimizer.eps = draw();
    c.optimizer.weight_decay = draw();
    c.optimizer.grad_clip = draw();
    c.optimizer.initial_loss_scale = draw();
    c.model.dropout = std::uniform_real_distribution<float>(0, 1)(gen);
    c.log.peak_flops = std::pow(10.0, exponent(gen));
    const Config back = round_trip(c);
    expect_same(back, c);
    if (testing::Test::HasFailure()) {
      ADD_FAILURE() << to_toml(c);
      break;
    }
  }
}

// ---- unknown keys, types, enums ----

TEST(ConfigErrors, UnknownKeysAndSections) {
  EXPECT_EQ(error_of("[model]\n\n\nn_layer = 4\n", {}, "quick.toml"),
            "unknown key model.n_layer at quick.toml:4:1 — did you mean model.n_layers?");
  EXPECT_EQ(error_of("[model]\nsteps = 5\n"),
            "unknown key model.steps at t.toml:2:1 — did you mean train.steps?");
  EXPECT_EQ(error_of("steps = 5\n"), "unknown key steps at t.toml:1:1 — did you mean train.steps?");
  EXPECT_EQ(error_of("includes = [\"a.toml\"]\n"),
            "unknown key includes at t.toml:1:1 — did you mean include?");
  EXPECT_EQ(error_of("[model]\nzzzzzz = 1\n"), "unknown key model.zzzzzz at t.toml:2:1");
  EXPECT_EQ(error_of("\n[modle]\nn_layers = 4\n"),
            "unknown section [modle] at t.toml:2:2 — did you mean [model]?");
  EXPECT_EQ(error_of("[pipeline]\nstages = 2\n"), "unknown section [pipeline] at t.toml:1:2");
  EXPECT_EQ(error_of("[model.sub]\nx = 1\n"), "unknown key model.sub at t.toml:1:8");
  EXPECT_EQ(error_of("model = 5\n"),
            "model at t.toml:1:1: expected a table [model], found an integer (5)");
  EXPECT_EQ(error_of("[optimizer]\nlearning_rate = 1\n"),
            "unknown key optimizer.learning_rate at t.toml:2:1");
}

struct ErrorCase {
  const char* text;
  std::vector<std::string> parts;
};

class ConfigTypeErrors : public testing::TestWithParam<ErrorCase> {};

TEST_P(ConfigTypeErrors, NameKeyPlaceExpectedAndFound) {
  const std::string msg = error_of(GetParam().text);
  expect_contains(msg, GetParam().parts);
  EXPECT_EQ(lines_of(msg).size(), 1u) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    All, ConfigTypeErrors,
    testing::Values(
        ErrorCase{"[model]\nn_layers = \"four\"\n",
                  {"model.n_layers at t.toml:2:1: expected an integer, found a string (\"four\")"}},
        ErrorCase{"[train]\nsteps = 10.5\n",
                  {"train.steps at t.toml:2:1: expected an integer, found a float (10.5)"}},
        ErrorCase{
            "[train]\nseed = -1\n",
            {"train.seed at t.toml:2:1: expected a non-negative integer, found an integer (-1)"}},
        ErrorCase{
            "[data]\nseed = 1.0\n",
            {"data.seed at t.toml:2:1: expected a non-negative integer, found a float (1.0)"}},
        ErrorCase{"[optimizer]\nlr = \"1e-3\"\n",
                  {"optimizer.lr at t.toml:2:1: expected a number, found a string (\"1e-3\")"}},
        ErrorCase{"[optimizer]\nlr = nan\n",
                  {"optimizer.lr at t.toml:2:1: expected a finite number, found a float (nan)"}},
        ErrorCase{"[optimizer]\neps = inf\n",
                  {"optimizer.eps at t.toml:2:1: expected a finite number, found a float (inf)"}},
        ErrorCase{"[model]\nrope_theta = 1e39\n",
                  {"model.rope_theta at t.toml:2:1: expected a number within 32-bit float range",
                   "(1e+39)"}},
        ErrorCase{
            "[model]\nbias = 1\n",
            {"model.bias at t.toml:2:1: expected a boolean (true or false), found an integer (1)"}},
        ErrorCase{"[train]\nrun_dir = 5\n",
                  {"train.run_dir at t.toml:2:1: expected a string, found an integer (5)"}},
        ErrorCase{"[log]\nmetrics = [\"a\"]\n",
                  {"log.metrics at t.toml:2:1: expected a string, found an array"}},
        ErrorCase{"[log]\ninterval = { a = 1 }\n",
                  {"log.interval at t.toml:2:1: expected an integer, found a table"}},
        ErrorCase{
            "[train]\nsteps = 1979-05-27\n",
            {"train.steps at t.toml:2:1: expected an integer, found a date/time (1979-05-27)"}},
        ErrorCase{"[model]\narch = \"gpt3\"\n",
                  {"model.arch at t.toml:2:1: expected one of \"gpt2\", \"llama\", found a string "
                   "(\"gpt3\")"}},
        ErrorCase{"[model]\nnorm = \"batchnorm\"\n",
                  {"model.norm at t.toml:2:1: expected one of \"layernorm\", \"rmsnorm\", found"}},
        ErrorCase{"[model]\nactivation = \"relu\"\n",
                  {"model.activation at t.toml:2:1: expected one of \"gelu\", \"swiglu\", found"}},
        ErrorCase{"[model]\nposition = \"alibi\"\n",
                  {"model.position at t.toml:2:1: expected one of \"learned\", \"rope\", found"}},
        ErrorCase{"[optimizer]\ndecay = \"step\"\n",
                  {"optimizer.decay at t.toml:2:1: expected one of \"cosine\", \"linear\", "
                   "\"constant\", found"}},
        ErrorCase{"[train]\nprecision = \"fp8\"\n",
                  {"train.precision at t.toml:2:1: expected one of \"fp32\", \"bf16\", \"fp16\", "
                   "found a string (\"fp8\")"}},
        ErrorCase{"[data]\nsource = \"files\"\n",
                  {"data.source at t.toml:2:1: expected one of \"synthetic\", \"indexed\", found a "
                   "string (\"files\")"}},
        ErrorCase{"[train]\ndevice = \"gpu\"\n",
                  {"train.device at t.toml:2:1: expected one of \"auto\", \"cpu\", \"cuda\", found "
                   "a string "
                   "(\"gpu\")"}},
        ErrorCase{"[model]\narch = 2\n",
                  {"model.arch at t.toml:2:1: expected one of \"gpt2\", \"llama\", found an "
                   "integer (2)"}},
        ErrorCase{"[model]\nn_layers = 4\nd_model = = 64\n", {"invalid TOML at t.toml:3:11:"}}));

// ---- rules on the resolved config ----

class ConfigRules : public testing::TestWithParam<ErrorCase> {};

TEST_P(ConfigRules, NameKeysNumbersAndPlaces) {
  const std::string msg = error_of(GetParam().text);
  expect_contains(msg, GetParam().parts);
  EXPECT_EQ(lines_of(msg).size(), 1u) << msg;  // one mistake, one message: no cascades
}

INSTANTIATE_TEST_SUITE_P(
    All, ConfigRules,
    testing::Values(
        ErrorCase{"[model]\nvocab_size = 1\n",
                  {"model.vocab_size=1 must be >= 2 (model.vocab_size at t.toml:2:1)"}},
        ErrorCase{"[model]\nn_layers = 0\n",
                  {"model.n_layers=0 must be >= 1 (model.n_layers at t.toml:2:1)"}},
        ErrorCase{"[model]\nd_model = -8\n",
                  {"model.d_model=-8 must be >= 1 (model.d_model at t.toml:2:1)"}},
        ErrorCase{"[model]\nn_heads = 0\n",
                  {"model.n_heads=0 must be >= 1 (model.n_heads at t.toml:2:1)"}},
        ErrorCase{"[model]\nn_kv_heads = -2\n",
                  {"model.n_kv_heads=-2 must be >= 1, or 0 for model.n_heads (model.n_kv_heads at "
                   "t.toml:2:1)"}},
        ErrorCase{
            "[model]\nd_ff = -1\n",
            {"model.d_ff=-1 must be >= 1, or 0 for the arch default (model.d_ff at t.toml:2:1)"}},
        ErrorCase{"[model]\nseq_len = 0\n",
                  {"model.seq_len=0 must be >= 1 (model.seq_len at t.toml:2:1)"}},
        ErrorCase{"[model]\nd_model = 100\nn_heads = 12\n",
                  {"model.d_model=100 is not divisible by model.n_heads=12",
                   "(model.d_model at t.toml:2:1, model.n_heads at t.toml:3:1)"}},
        ErrorCase{"[model]\nd_model = 100\n",
                  {"model.d_model=100 is not divisible by model.n_heads=12",
                   "(model.d_model at t.toml:2:1)"}},
        ErrorCase{"[model]\nn_heads = 12\nn_kv_heads = 5\n",
                  {"model.n_heads=12 is not divisible by model.n_kv_heads=5",
                   "model.n_kv_heads at t.toml:3:1"}},
        ErrorCase{"[model]\nn_heads = 4\nn_kv_heads = 8\nd_model = 64\n",
                  {"model.n_heads=4 is not divisible by model.n_kv_heads=8"}},
        ErrorCase{"[model]\narch = \"llama\"\nd_model = 120\nn_heads = 8\n",
                  {"model.position=\"rope\" needs an even head dim, but model.d_model=120 / "
                   "model.n_heads=8 = 15",
                   "model.arch at t.toml:2:1"}},
        ErrorCase{"[model]\nposition = \"rope\"\nd_model = 36\nn_heads = 4\n",
                  {"model.d_model=36 / model.n_heads=4 = 9", "model.position at t.toml:2:1"}},
        ErrorCase{"[model]\nnorm_eps = 0.0\n",
                  {"model.norm_eps=0.0 must be > 0 (model.norm_eps at t.toml:2:1)"}},
        ErrorCase{"[model]\nrope_theta = -1.0\n", {"model.rope_theta=-1.0 must be > 0"}},
        ErrorCase{"[model]\ndropout = 1.0\n",
                  {"model.dropout=1.0 must be in [0, 1) (model.dropout at t.toml:2:1)"}},
        ErrorCase{"[model]\ndropout = -0.1\n", {"model.dropout=-0.1 must be in [0, 1)"}},
        ErrorCase{"[model]\ninit_std = -0.02\n", {"model.init_std=-0.02 must be >= 0.0"}},
        ErrorCase{"[train]\nsteps = -5\n",
                  {"train.steps=-5 must be >= 1 (train.steps at t.toml:2:1)"}},
        ErrorCase{"[train]\nglobal_batch_size = 0\n", {"train.global_batch_size=0 must be >= 1"}},
        ErrorCase{"[train]\nmicro_batch_size = -1\n",
                  {"train.micro_batch_size=-1 must be >= 1, or 0 for train.global_batch_size"}},
        ErrorCase{"[train]\nglobal_batch_size = 10\nmicro_batch_size = 4\n",
                  {"train.global_batch_size=10 is not divisible by train.micro_batch_size=4",
                   "train.micro_batch_size at t.toml:3:1"}},
        ErrorCase{"[train]\nglobal_batch_size = 4\nmicro_batch_size = 8\n",
                  {"train.global_batch_size=4 is not divisible by train.micro_batch_size=8"}},
        ErrorCase{"[train]\nrun_dir = \"\"\n",
                  {"train.run_dir must not be empty (train.run_dir at t.toml:2:1)"}},
        ErrorCase{"[train]\nthreads = -1\n",
                  {"train.threads=-1 must be >= 0 (train.threads at t.toml:2:1)"}},
        ErrorCase{"[optimizer]\nlr = 0.0\nmin_lr = 0.0\n", {"optimizer.lr=0.0 must be > 0"}},
        ErrorCase{"[optimizer]\nmin_lr = -1e-5\n", {"optimizer.min_lr=-1e-05 must be >= 0.0"}},
        ErrorCase{"[optimizer]\nlr = 0.001\nmin_lr = 0.01\n",
                  {"optimizer.min_lr=0.01 is above optimizer.lr=0.001 (optimizer.min_lr at "
                   "t.toml:3:1, optimizer.lr at t.toml:2:1)"}},
        ErrorCase{"[optimizer]\nwarmup_steps = -1\n", {"optimizer.warmup_steps=-1 must be >= 0"}},
        ErrorCase{"[optimizer]\ndecay_steps = -3\n",
                  {"optimizer.decay_steps=-3 must be >= 1, or 0 for train.steps"}},
        ErrorCase{"[train]\nsteps = 100\n[optimizer]\nwarmup_steps = 200\n",
                  {"optimizer.warmup_steps=200 exceeds optimizer.decay_steps=100 = train.steps "
                   "(optimizer.warmup_steps at t.toml:4:1, train.steps at t.toml:2:1)"}},
        ErrorCase{"[optimizer]\nwarmup_steps = 60\ndecay_steps = 50\n",
                  {"optimizer.warmup_steps=60 exceeds optimizer.decay_steps=50 "
                   "(optimizer.warmup_steps at t.toml:2:1, optimizer.decay_steps at t.toml:3:1)"}},
        ErrorCase{"[optimizer]\nbeta1 = 1.5\n", {"optimizer.beta1=1.5 must be in [0, 1)"}},
        ErrorCase{"[optimizer]\nbeta2 = 1\n",
                  {"optimizer.beta2=1.0 must be in [0, 1) (optimizer.beta2 at t.toml:2:1)"}},
        ErrorCase{"[optimizer]\neps = 0\n", {"optimizer.eps=0.0 must be > 0"}},
        ErrorCase{"[optimizer]\nweight_decay = -0.1\n",
                  {"optimizer.weight_decay=-0.1 must be >= 0.0"}},
        ErrorCase{"[optimizer]\ngrad_clip = -1\n", {"optimizer.grad_clip=-1.0 must be >= 0.0"}},
        ErrorCase{"[train]\ngrad_dtype = \"compute\"\n",
                  {"train.grad_dtype=\"compute\" stores gradients in the compute type, which "
                   "train.precision=\"fp32\" does not have",
                   "(train.grad_dtype at t.toml:2:1)"}},
        ErrorCase{"[model.moe]\nnum_experts = 6\nn_group = 4\n",
                  {"model.moe.num_experts=6 is not divisible by model.moe.n_group=4"}},
        ErrorCase{"[model.moe]\nnum_experts = 8\nn_group = 4\ntopk_group = 5\n",
                  {"model.moe.topk_group=5 must be in [1, model.moe.n_group=4], or 0 for every "
                   "group"}},
        ErrorCase{"[model.moe]\nnum_experts = 8\ntop_k = 3\nn_group = 4\ntopk_group = 1\n",
                  {"model.moe.top_k=3 exceeds the 2 experts a token may pick from: "
                   "model.moe.topk_group=1 of model.moe.n_group=4 groups of 2 experts"}},
        ErrorCase{"[model.moe]\nnum_experts = 8\nrouted_scaling_factor = 0\n",
                  {"model.moe.routed_scaling_factor=0.0 must be > 0"}},
        ErrorCase{"[model.mla]\nkv_lora_rank = 32\n",
                  {"[model.mla] is set, but model.attention=\"mha\" does not read it",
                   "(model.mla.kv_lora_rank at t.toml:2:1)"}},
        ErrorCase{"[model]\nattention = \"mla\"\nbias = false\n",
                  {"model.attention=\"mla\" needs model.position=\"rope\"",
                   "(model.attention at t.toml:2:1)"}},
        ErrorCase{"[model]\narch = \"llama\"\nattention = \"mla\"\nbias = true\n",
                  {"model.attention=\"mla\" has no biases", "model.bias at t.toml:4:1"}},
        ErrorCase{"[model]\narch = \"llama\"\nattention = \"mla\"\n[model.mla]\n"
                  "qk_rope_head_dim = 5\n",
                  {"model.mla.qk_rope_head_dim=5 must be even"}},
        ErrorCase{"[model]\narch = \"llama\"\nattention = \"mla\"\n[model.mla]\n"
                  "v_head_dim = 200\n",
                  {"model.mla.v_head_dim=200 exceeds model.mla.qk_nope_head_dim + "
                   "qk_rope_head_dim = 192"}},
        ErrorCase{"[model]\narch = \"llama\"\nattention = \"mla\"\nn_kv_heads = 4\n",
                  {"model.n_kv_heads=4 must be 0 or model.n_heads=12"}},
        ErrorCase{"[model]\narch = \"llama\"\nattention = \"mla\"\nvocab_size = 256\n"
                  "[parallel]\ntp = 2\n",
                  {"model.attention=\"mla\" with parallel.tp=2: each tp rank projects its own "
                   "rows"}},
        ErrorCase{"[model]\nmtp_loss_weight = 0.1\n",
                  {"model.mtp_loss_weight=0.1 is set, but model.mtp_depth=0 has no multi-token "
                   "prediction module to weigh"}},
        ErrorCase{"[model]\nmtp_depth = -1\n", {"model.mtp_depth=-1 must be >= 0"}},
        ErrorCase{"[model]\nmtp_depth = 1\nmtp_loss_weight = -0.5\n",
                  {"model.mtp_loss_weight=-0.5 must be >= 0"}},
        ErrorCase{"[model]\nmtp_depth = 8\nseq_len = 8\n",
                  {"model.mtp_depth=8 leaves no position of a sequence of model.seq_len=8"}},
        ErrorCase{"[model]\nmtp_depth = 1\nvocab_size = 256\n[parallel]\ntp = 2\n",
                  {"model.mtp_depth=1 with parallel.tp=2: each tp rank projects its own rows"}},
        ErrorCase{"[train]\ndistribute_saved_activations = true\nrecompute = \"selective\"\n"
                  "[parallel]\ntp = 2\n[model]\nvocab_size = 256\n",
                  {"train.distribute_saved_activations splits the input a fully recomputed layer "
                   "saves over tp, but train.recompute is not \"full\"",
                   "(train.distribute_saved_activations at t.toml:2:1, train.recompute at "
                   "t.toml:3:1)"}},
        ErrorCase{"[train]\ndistribute_saved_activations = true\nrecompute = \"full\"\n"
                  "[parallel]\ntp = 2\nsequence_parallel = true\n[model]\nvocab_size = 256\n",
                  {"needs parallel.tp > 1 without sequence parallelism (tp=2, "
                   "sequence_parallel=true;",
                   "parallel.sequence_parallel at t.toml:6:1"}},
        ErrorCase{"[train]\ndistribute_saved_activations = true\nrecompute = \"full\"\n",
                  {"needs parallel.tp > 1 without sequence parallelism (tp=1, "
                   "sequence_parallel=false;"}},
        ErrorCase{"[train]\ndistribute_saved_activations = true\nrecompute = \"full\"\n"
                  "[model]\nn_layers = 2\nvocab_size = 256\n[parallel]\ntp = 2\npp = 2\n"
                  "pp_layers = [2, 0]\n",
                  {"train.distribute_saved_activations needs a layer on every pipeline stage "
                   "(parallel.pp_layers has a 0)"}},
        ErrorCase{"[train]\nprecision = \"fp16\"\n[optimizer]\ninitial_loss_scale = 0\n",
                  {"optimizer.initial_loss_scale=0.0 must be > 0 with train.precision=\"fp16\"",
                   "optimizer.initial_loss_scale at t.toml:4:1, train.precision at t.toml:2:1"}},
        ErrorCase{"[train]\nprecision = \"fp16\"\n[optimizer]\nloss_scale_window = 0\n",
                  {"optimizer.loss_scale_window=0 must be >= 1 with train.precision=\"fp16\""}},
        ErrorCase{"[optimizer.muon]\nns_steps = 3\n",
                  {"optimizer.muon.ns_steps is set but optimizer.type = \"adamw\" does not use "
                   "it: set optimizer.type = \"muon\", or remove it"}},
        ErrorCase{"[optimizer]\ntype = \"muon\"\n[optimizer.muon]\nmomentum = 1.0\n",
                  {"optimizer.muon.momentum=1.0 must be in [0, 1)"}},
        ErrorCase{"[log]\ninterval = 0\n",
                  {"log.interval=0 must be >= 1 (log.interval at t.toml:2:1)"}},
        ErrorCase{"[log]\npeak_flops = -1\n", {"log.peak_flops=-1.0 must be >= 0.0"}}));

TEST(ConfigErrors, LossScaleIgnoredWithoutFp16) {
  const Config c = parse_config_string(
      "[train]\nprecision = \"bf16\"\n[optimizer]\ninitial_loss_scale = 0\n", "t.toml");
  EXPECT_EQ(c.train.precision, Precision::bf16);
}

TEST(ConfigErrors, AllProblemsReportedTogether) {
  const std::string read =
      error_of("[model]\nn_layer = 1\nd_model = \"x\"\n[train]\nsteps = 1.5\n[optimizre]\n");
  const auto read_lines = lines_of(read);
  ASSERT_EQ(read_lines.size(), 4u) << read;
  EXPECT_EQ(read_lines[0],
            "unknown key model.n_layer at t.toml:2:1 — did you mean model.n_layers?");
  EXPECT_EQ(read_lines[1], "unknown section [optimizre] at t.toml:6:2 — did you mean [optimizer]?");
  EXPECT_EQ(read_lines[2],
            "model.d_model at t.toml:3:1: expected an integer, found a string (\"x\")");
  EXPECT_EQ(read_lines[3], "train.steps at t.toml:5:1: expected an integer, found a float (1.5)");

  const std::string rules =
      error_of("[model]\nd_model = 100\n[train]\nsteps = 0\n[optimizer]\nbeta1 = 1.5\n");
  const auto rule_lines = lines_of(rules);
  ASSERT_EQ(rule_lines.size(), 3u) << rules;
  EXPECT_EQ(rule_lines[1], "train.steps=0 must be >= 1 (train.steps at t.toml:4:1)");
}

// ---- [data] and validation ----

// A dataset prefix with empty .idx/.bin files: enough for the config's existence checks.
void touch_dataset(const fs::path& prefix) {
  fs::create_directories(prefix.parent_path());
  std::ofstream(prefix.string() + ".idx");
  std::ofstream(prefix.string() + ".bin");
}

TEST_F(ConfigFiles, DataPathsAreRelativeToTheirConfigFile) {
  touch_dataset(dir_ / "corpus/web");
  touch_dataset(dir_ / "corpus/books");
  write("corpus/tok.model", "");
  write("base/base.toml",
        "[data]\nsource = \"indexed\"\ntokenizer = \"../corpus/tok.model\"\n"
        "[[data.sources]]\npath = \"../corpus/web\"\nweight = 3\n"
        "[[data.sources]]\npath = \"../corpus/books\"\nweight = 1\n");
  const fs::path top = write("configs/run.toml", "include = [\"../base/base.toml\"]\n");
  const Config c = parse_config(top.string());
  EXPECT_EQ(c.data.source, DataSource::indexed);
  ASSERT_EQ(c.data.sources.size(), 2u);
  EXPECT_EQ(c.data.sources[0].path, (dir_ / "corpus/web").string());
  EXPECT_EQ(c.data.sources[0].weight, 3.0);
  EXPECT_EQ(c.data.sources[1].path, (dir_ / "corpus/books").string());
  EXPECT_EQ(c.data.tokenizer, (dir_ / "corpus/tok.model").string());
  EXPECT_EQ(c.data.split, "98,1,1");
  // The resolved paths print as they are and read back unchanged.
  expect_same(round_trip(c), c);

  const fs::path one =
      write("configs/one.toml", "[data]\nsource = \"indexed\"\npath = \"../corpus/web\"\n");
  EXPECT_EQ(parse_config(one.string()).data.path, (dir_ / "corpus/web").string());
  // --set paths are relative to the current directory, an absolute one is kept.
  const std::string abs = (dir_ / "corpus/books").string();
  EXPECT_EQ(parse_config(one.string(), {"data.path=" + abs}).data.path, abs);
  EXPECT_EQ(file_error_of(one, {"data.path=corpus/web"}),
            "data.path=\"corpus/web\": corpus/web.idx not found (a path written in a config "
            "file is relative to that file's folder; one given with --set, to the current "
            "directory) (data.path at --set)");
}

// What every missing data file's message says of relative paths.
const std::string kPathHint =
    " (a path written in a config file is relative to that file's folder; one given with --set, "
    "to the current directory)";

TEST_F(ConfigFiles, MissingDataFilesNameTheKeyAndFile) {
  touch_dataset(dir_ / "d/ok");
  std::ofstream((dir_ / "d/half.idx").string());  // no .bin
  const fs::path cfg = write("run.toml",
                             "[data]\nsource = \"indexed\"\n"
                             "tokenizer = \"d/tok.model\"\n"
                             "[[data.sources]]\npath = \"d/ok\"\nweight = 1\n"
                             "[[data.sources]]\npath = \"d/half\"\nweight = 0\n"
                             "[[data.sources]]\npath = \"d/none\"\nweight = 2\n");
  const std::string d = (dir_ / "d").string(), at = cfg.string() + ":4:8";
  const auto lines = lines_of(file_error_of(cfg));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "data.sources entry 2: weight=0.0 must be > 0 (data.sources at " + at + ")");
  EXPECT_EQ(lines[1], "data.sources entry 2: path=\"" + d + "/half\": " + d +
                          "/half.bin not found" + kPathHint + " (data.sources at " + at + ")");
  EXPECT_EQ(lines[2], "data.sources entry 3: path=\"" + d + "/none\": " + d +
                          "/none.idx not found" + kPathHint + " (data.sources at " + at + ")");
  EXPECT_EQ(lines[3], "data.tokenizer=\"" + d + "/tok.model\": file not found" + kPathHint +
                          " (data.tokenizer at " + cfg.string() + ":3:1)");
  // A validation run needs documents in the valid split.
  const fs::path no_valid = write("nv.toml",
                                  "[train]\neval_interval = 10\n[data]\nsource = \"indexed\"\n"
                                  "path = \"d/ok\"\nsplit = \"100,0,0\"\n");
  EXPECT_EQ(file_error_of(no_valid),
            "train.eval_interval=10 needs a validation split, but data.split=\"100,0,0\" gives it "
            "no documents (train.eval_interval at " +
                no_valid.string() + ":2:1, data.split at " + no_valid.string() + ":6:1)");
  // The synthetic source uses none of them: switching to it needs no data files.
  EXPECT_EQ(parse_config(cfg.string(), {"data.source=synthetic"}).data.source,
            DataSource::synthetic);
}

INSTANTIATE_TEST_SUITE_P(
    Data, ConfigRules,
    testing::Values(
        ErrorCase{
            "[data]\nsource = \"indexed\"\n",
            {"data.source=\"indexed\" needs data.path (one dataset prefix) or "
             "[[data.sources]] entries {path, weight} (a blend) (data.source at t.toml:2:1)"}},
        ErrorCase{"[data]\nsource = \"indexed\"\npath = \"a\"\n[[data.sources]]\npath = \"b\"\n"
                  "weight = 1\n",
                  {"data.path and [[data.sources]] are both set: give one dataset in data.path or "
                   "a blend in [[data.sources]] (data.path at t.toml:3:1, data.sources at "
                   "t.toml:4:8)"}},
        ErrorCase{"[data]\nsplit = \"98,2\"\n",
                  {"data.split=\"98,2\" must be three comma-separated non-negative numbers with a "
                   "positive sum, the shares of train,valid,test, e.g. \"98,1,1\" (data.split at "
                   "t.toml:2:1)"}},
        ErrorCase{"[data]\nsplit = \"0,0,0\"\n", {"data.split=\"0,0,0\" must be three"}},
        ErrorCase{"[train]\neval_interval = -1\n",
                  {"train.eval_interval=-1 must be >= 0 (0 = no validation)"}},
        ErrorCase{"[train]\neval_interval = 5\neval_iters = 0\n",
                  {"train.eval_iters=0 must be >= 1 (train.eval_iters at t.toml:3:1)"}}));

INSTANTIATE_TEST_SUITE_P(
    Data, ConfigTypeErrors,
    testing::Values(
        ErrorCase{"[data]\nsources = \"a\"\n",
                  {"data.sources at t.toml:2:1: expected an array of tables ([[data.sources]]), "
                   "found a string (\"a\")"}},
        ErrorCase{"[data]\nsources = [1]\n",
                  {"data.sources at t.toml:2:1: entry 1: expected a table {path, weight}, found "
                   "an integer (1)"}},
        ErrorCase{"[[data.sources]]\npath = \"a\"\nweight = 1\n[[data.sources]]\npath = \"b\"\n",
                  {"data.sources at t.toml:1:8: entry 2: missing weight"}},
        ErrorCase{"[[data.sources]]\npath = \"a\"\nwieght = 1\n",
                  {"data.sources at t.toml:1:8: entry 1: unknown key wieght (an entry has path "
                   "and weight)"}},
        ErrorCase{"[[data.sources]]\npath = 3\nweight = 1\n",
                  {"data.sources at t.toml:1:8: entry 1 path: expected a string, found an "
                   "integer (3)"}}));

// ---- the e2e bad-config cases, through parse_config ----

struct BadCase {
  std::string name, file;
  std::vector<std::string> overrides, regexes;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Reads tests/e2e/bad_configs/expected.txt: name | file | overrides | regex [&& regex ...].
std::vector<BadCase> bad_cases() {
  std::ifstream in(std::string(LLMT_BAD_CONFIGS_DIR) + "/expected.txt");
  std::vector<BadCase> cases;
  for (std::string line; std::getline(in, line);) {
    if (trim(line).empty() || line[0] == '#') continue;
    std::vector<std::string> cols;
    size_t pos = 0;
    for (int i = 0; i < 3; ++i) {
      const size_t bar = line.find('|', pos);
      if (bar == std::string::npos) break;
      cols.push_back(trim(line.substr(pos, bar - pos)));
      pos = bar + 1;
    }
    EXPECT_EQ(cols.size(), 3u) << "cannot read: " << line;
    if (cols.size() != 3) continue;
    BadCase c{cols[0], cols[1], {}, {}};
    std::istringstream sets(cols[2]);
    for (std::string s; sets >> s;) c.overrides.push_back(s);
    std::string rest = trim(line.substr(pos));
    for (size_t amp; (amp = rest.find(" && ")) != std::string::npos; rest = rest.substr(amp + 4)) {
      c.regexes.push_back(trim(rest.substr(0, amp)));
    }
    c.regexes.push_back(trim(rest));
    cases.push_back(c);
  }
  return cases;
}

TEST(ConfigBadConfigs, EachCaseFailsWithItsMessage) {
  const std::vector<BadCase> cases = bad_cases();
  EXPECT_GE(cases.size(), 16u);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string msg = file_error_of(fs::path(LLMT_BAD_CONFIGS_DIR) / c.file, c.overrides);
    const std::vector<std::string> lines = lines_of("error: " + msg);
    for (const std::string& re : c.regexes) {
      const std::regex r(re);  // the ERE subset used there reads the same in ECMAScript
      const bool hit = std::any_of(lines.begin(), lines.end(),
                                   [&](const std::string& l) { return std::regex_search(l, r); });
      EXPECT_TRUE(hit) << "regex: " << re << "\nmessage: " << msg;
    }
  }
}

TEST(ConfigBadConfigs, TheBaseOfTheSetCasesIsValid) {
  const Config c = parse_config(std::string(LLMT_BAD_CONFIGS_DIR) + "/good.toml");
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.train.steps, 10);
}

// [train] recompute and recompute_layers: parsed, and every setting the model cannot honour
// refused with its numbers.
TEST(ConfigErrors, Recompute) {
  const Config c = parse_config_string(
      "[model]\nn_layers = 4\n[train]\nrecompute = \"full\"\nrecompute_layers = 2\n", "t.toml");
  EXPECT_EQ(c.train.recompute, Recompute::full);
  EXPECT_EQ(c.train.recompute_layers, 2);
  expect_contains(error_of("[train]\nrecompute = \"partial\"\n"),
                  {"expected one of \"none\", \"selective\", \"full\"", "(\"partial\")"});
  expect_contains(error_of("[model]\nn_layers = 4\n[train]\nrecompute = \"full\"\n"
                           "recompute_layers = -1\n"),
                  {"train.recompute_layers=-1 must be >= 0"});
  expect_contains(error_of("[model]\nn_layers = 4\n[train]\nrecompute = \"full\"\n"
                           "recompute_layers = 5\n"),
                  {"train.recompute_layers=5 exceeds model.n_layers=4"});
  expect_contains(error_of("[model]\nn_layers = 4\n[train]\nrecompute_layers = 2\n"),
                  {"train.recompute_layers=2 chooses layers to recompute, but "
                   "train.recompute=\"none\""});
}

// [train] recompute_modules: a set of names, only with selective recompute.
TEST(ConfigErrors, RecomputeModules) {
  const Config d = parse_config_string("[train]\nrecompute = \"selective\"\n", "t.toml");
  EXPECT_TRUE(d.train.recompute_modules.core_attn());
  EXPECT_FALSE(d.train.recompute_modules.layernorm() || d.train.recompute_modules.act());
  const Config c = parse_config_string(
      "[train]\nrecompute = \"selective\"\nrecompute_modules = [\"act\", \"layernorm\"]\n",
      "t.toml");
  EXPECT_FALSE(c.train.recompute_modules.core_attn());
  EXPECT_TRUE(c.train.recompute_modules.layernorm() && c.train.recompute_modules.act());
  EXPECT_EQ(recompute_modules_text(c.train.recompute_modules), "[\"layernorm\", \"act\"]");
  expect_contains(error_of("[train]\nrecompute = \"selective\"\nrecompute_modules = [\"mlp\"]\n"),
                  {"train.recompute_modules",
                   "entry 1: expected one of \"core_attn\", "
                   "\"layernorm\", \"act\", \"moe_act\", \"mla_up_proj\", found a string "
                   "(\"mlp\")"});
  expect_contains(
      error_of("[train]\nrecompute = \"selective\"\nrecompute_modules = [\"act\", \"act\"]\n"),
      {"entry 2: \"act\" is listed twice"});
  expect_contains(error_of("[train]\nrecompute = \"selective\"\nrecompute_modules = \"act\"\n"),
                  {"expected an array of \"core_attn\", \"layernorm\", \"act\""});
  expect_contains(error_of("[train]\nrecompute = \"selective\"\nrecompute_modules = []\n"),
                  {"train.recompute_modules is empty, so train.recompute=\"selective\" would "
                   "recompute nothing"});
  expect_contains(error_of("[model.moe]\nnum_experts = 4\n[train]\nrecompute = \"selective\"\n"
                           "recompute_modules = [\"act\"]\n"),
                  {"train.recompute_modules lists \"act\"",
                   "every MLP of this model is a mixture of routed "
                   "experts without shared experts",
                   "(\"moe_act\" reruns the routed experts')"});
  // "moe_act" needs routed experts, and with them is read back and written as listed.
  expect_contains(
      error_of("[train]\nrecompute = \"selective\"\nrecompute_modules = [\"moe_act\"]\n"),
      {"train.recompute_modules lists \"moe_act\"",
       "this model has no mixture-of-experts layer (model.moe.num_experts=0)"});
  const Config m = parse_config_string(
      "[model.moe]\nnum_experts = 4\n[train]\nrecompute = \"selective\"\n"
      "recompute_modules = [\"moe_act\", \"layernorm\"]\n",
      "t.toml");
  EXPECT_TRUE(m.train.recompute_modules.moe_act() && !m.train.recompute_modules.act());
  EXPECT_EQ(recompute_modules_text(m.train.recompute_modules), "[\"layernorm\", \"moe_act\"]");
  // "mla_up_proj" needs latent attention with a query latent.
  expect_contains(
      error_of("[train]\nrecompute = \"selective\"\nrecompute_modules = [\"mla_up_proj\"]\n"),
      {"train.recompute_modules lists \"mla_up_proj\"", "but model.attention=\"mha\""});
  const std::string mla =
      "[model]\narch = \"llama\"\nattention = \"mla\"\nn_kv_heads = 12\n[model.mla]\n";
  expect_contains(error_of(mla + "q_lora_rank = 0\n[train]\nrecompute = \"selective\"\n"
                                 "recompute_modules = [\"mla_up_proj\"]\n"),
                  {"model.mla.q_lora_rank=0 projects the queries from the layer's input"});
  EXPECT_TRUE(parse_config_string(mla + "q_lora_rank = 64\n[train]\nrecompute = \"selective\"\n"
                                        "recompute_modules = [\"mla_up_proj\"]\n",
                                  "t.toml")
                  .train.recompute_modules.mla_up_proj());
  // With a dense first layer, or shared experts, "act" has an MLP to rerun.
  for (const char* moe : {"first_dense_layers = 1\n", "shared_experts = 1\n"})
    EXPECT_TRUE(parse_config_string(std::string("[model.moe]\nnum_experts = 4\n") + moe +
                                        "[train]\nrecompute = \"selective\"\n"
                                        "recompute_modules = [\"act\"]\n",
                                    "t.toml")
                    .train.recompute_modules.act());
  expect_contains(error_of("[train]\nrecompute = \"full\"\nrecompute_modules = [\"act\"]\n"),
                  {"train.recompute_modules chooses what selective recompute reruns, but "
                   "train.recompute=\"full\""});
}

// Tensor parallelism splits heads, kv heads, d_ff and the vocabulary over tp, and sequence
// parallelism the tokens: each that does not divide is reported with its numbers.
TEST(ConfigErrors, TensorParallelDivisibility) {
  const std::string text =
      "[model]\nvocab_size = 258\nd_model = 64\nn_heads = 4\nd_ff = 250\nseq_len = 30\n"
      "[parallel]\ntp = 4\nsequence_parallel = true\n";
  expect_contains(error_of(text), {"model.d_ff=250 is not divisible by parallel.tp=4",
                                   "model.vocab_size=258 is not divisible by parallel.tp=4",
                                   "model.seq_len=30 is not divisible by parallel.tp=4"});
  const Config ok = parse_config_string(
      "[model]\nvocab_size = 256\nd_model = 64\nn_heads = 4\nd_ff = 256\nseq_len = 32\n"
      "[parallel]\ntp = 4\nsequence_parallel = true\n",
      "t.toml");
  EXPECT_EQ(ok.parallel.tp, 4);
}

// [model.moe]: the resolved defaults, which layers are MoE, the parameter counts (total and
// active) and the config-only memory bound's parameter count, which must equal the spec's
// without building it (dense and MoE layers counted apart).
TEST(ConfigMoe, LayersParametersAndTheMemoryBound) {
  const Config c = parse_config_string(
      "[model]\narch = \"llama\"\nn_layers = 7\nd_model = 64\nn_heads = 4\nvocab_size = 256\n"
      "seq_len = 32\n[model.moe]\nnum_experts = 8\ntop_k = 2\nfirst_dense_layers = 1\n"
      "every = 2\nshared_experts = 1\n",
      "moe.toml");
  const MoeConfig& e = c.model.moe;
  EXPECT_EQ(e.d_ff_expert, c.model.d_ff);  // 0 = model.d_ff
  EXPECT_EQ(e.d_ff_shared, e.d_ff_expert);
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < 7; ++l)
    if (e.layer(l)) moe_layers.push_back(l);
  EXPECT_EQ(moe_layers, (std::vector<int64_t>{1, 3, 5}));
  const ModelSpec spec = ModelSpec::from_config(c.model);
  const int64_t C = 64, F = c.model.d_ff, E = 8;
  EXPECT_EQ(spec.params[spec.index_of("layers.3.mlp.experts.fc1.weight")].global_shape,
            Shape({E, 2 * F, C}));
  EXPECT_EQ(spec.params[spec.index_of("layers.3.mlp.shared.fc2.weight")].global_shape,
            Shape({C, F}));
  EXPECT_THROW(spec.index_of("layers.2.mlp.router.weight"), Error);  // a dense layer
  const int64_t expert = 3 * F * C;                                  // fc1 (2F, C) + fc2 (C, F)
  EXPECT_EQ(spec.num_params() - spec.num_active_params(), 3 * (E - 2) * expert);
  MeshShape one;
  one.degree = {1, 1, 1, 1};
  EXPECT_DOUBLE_EQ(estimate_rank_memory(c, one).grads,
                   4.0 * static_cast<double>(spec.num_params()));
}

}  // namespace
}  // namespace llmt
