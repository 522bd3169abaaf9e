// Short trainings on the GPU against the same runs on the CPU: the tiny GPT-2 and Llama models
// (GQA, RoPE, RMSNorm, SwiGLU), fp32 and bf16 storage, with and without gradient accumulation,
// and mixture-of-experts models, AdamW and Muon, a few steps each on the synthetic source. The
// final losses must agree: fp32 to 1e-4 relative (summation order is all that differs; for MoE, as
// long as no near-tie of router scores flips a top-k choice), bf16 to 2e-2 (a rounding boundary
// crossed in one op moves the run by a bf16 ulp). Skips (with the reason) where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/cuda/cuda_backend.h"
#include "engine/model/transformer.h"
#include "train/config.h"
#include "train/trainer.h"

namespace llmt {
namespace {

struct TrainRun {
  const char* name;
  const char* arch;
  const char* precision;
  int micro_batch;                  // of a global batch of 4
  const char* extra = "";           // more TOML (a [model.moe] section)
  const char* optimizer = "adamw";  // optimizer.type
};

std::ostream& operator<<(std::ostream& os, const TrainRun& r) {
  return os << r.name;
}

double final_loss(const TrainRun& r, const char* device) {
  const std::string toml = std::string("[model]\narch = \"") + r.arch +
                           "\"\nvocab_size = 256\nn_layers = 2\nd_model = 64\nn_heads = 4\n" +
                           (std::string(r.arch) == "llama" ? "n_kv_heads = 2\n" : "") +
                           "seq_len = 64\n[train]\nsteps = 6\nglobal_batch_size = 4\n" +
                           "micro_batch_size = " + std::to_string(r.micro_batch) +
                           "\nprecision = \"" + r.precision + "\"\ndevice = \"" + device +
                           "\"\nrun_dir = \"" + ::testing::TempDir() + "gpu_train_" + r.name +
                           "\"\n[optimizer]\ntype = \"" + r.optimizer +
                           "\"\nlr = 3e-3\nwarmup_steps = 2\n[data]\nsource = "
                           "\"synthetic\"\n[log]\nprogress = false\nmetrics = \"\"\n" +
                           r.extra;
  const Config cfg = parse_config_string(toml, r.name);
  TrainOptions opts;
  opts.quiet = true;
  const TrainResult res = train(cfg, opts);
  EXPECT_EQ(res.steps, 6);
  return res.final_loss;
}

class GpuTrain : public ::testing::TestWithParam<TrainRun> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipping GPU test";
  }
};

TEST_P(GpuTrain, FinalLossMatchesCpuRun) {
  const TrainRun& r = GetParam();
  const double cpu = final_loss(r, "cpu"), gpu = final_loss(r, "cuda");
  ASSERT_TRUE(std::isfinite(cpu) && std::isfinite(gpu)) << "cpu " << cpu << ", cuda " << gpu;
  const double rtol = std::string(r.precision) == "fp32" ? 1e-4 : 2e-2;
  EXPECT_NEAR(gpu, cpu, rtol * std::fabs(cpu)) << "cpu " << cpu << ", cuda " << gpu;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GpuTrain,
    ::testing::Values(TrainRun{"gpt2_fp32", "gpt2", "fp32", 4},
                      TrainRun{"gpt2_fp32_accum2", "gpt2", "fp32", 2},
                      TrainRun{"llama_fp32", "llama", "fp32", 4},
                      TrainRun{"gpt2_bf16", "gpt2", "bf16", 4},
                      TrainRun{"llama_bf16_accum2", "llama", "bf16", 2},
                      // Mixture of experts: routing, dispatch, grouped
                      // GEMMs, router losses, capacity dropping.
                      TrainRun{"moe_fp32", "llama", "fp32", 2,
                               "[model.moe]\nnum_experts = 4\ntop_k = 2\n"
                               "shared_experts = 1\nz_loss_coef = 0.001\n"},
                      TrainRun{"moe_capacity_fp32", "gpt2", "fp32", 4,
                               "[model.moe]\nnum_experts = 4\ntop_k = 1\n"
                               "normalize = false\ncapacity_factor = 1.0\n"},
                      // Muon: Newton-Schulz through the GEMMs, experts
                      // one by one.
                      TrainRun{"llama_muon_fp32", "llama", "fp32", 4, "", "muon"},
                      TrainRun{"moe_muon_fp32", "llama", "fp32", 2,
                               "[model.moe]\nnum_experts = 4\ntop_k = 2\n", "muon"}),
    [](const auto& info) { return std::string(info.param.name); });

// llmtrain generate's KV-cache decoding on the GPU (copy_heads into the cache, the block
// attention kernel against it) gives the CPU decoder's logits, position by position.
TEST(GpuDecode, KvCacheLogitsMatchTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipping GPU test";
  ModelConfig c = model_preset(Arch::llama);
  c.vocab_size = 256;
  c.n_layers = 2;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.seq_len = 32;
  c.d_ff = preset_d_ff(Arch::llama, 64);
  const ModelSpec spec = ModelSpec::from_config(c);
  std::vector<std::vector<float>> logits(2);
  for (int d = 0; d < 2; ++d) {
    std::unique_ptr<DeviceBackend> backend =
        make_device_backend({d == 0 ? DeviceKind::cpu : DeviceKind::cuda, 0});
    Allocator alloc(*backend);
    Transformer model(spec, alloc, 1, DType::f32, ModelStorage{true, false, true}, {}, {}, {},
                      nullptr, 16);
    model.init(7);
    Buffer one = alloc.allocate(4, MemCategory::other);
    for (int64_t pos = 0; pos < 16; ++pos) {
      const int32_t id = static_cast<int32_t>((pos * 37 + 11) % 256);
      backend->copy_from_host(one.data(), &id, 4);
      const Tensor step = model.decode(one.tensor({1, 1}, DType::i32), pos);
      std::vector<float> host(256);
      backend->copy_to_host(host.data(), step.data, 256 * 4);
      logits[static_cast<size_t>(d)].insert(logits[static_cast<size_t>(d)].end(), host.begin(),
                                            host.end());
    }
  }
  for (size_t i = 0; i < logits[0].size(); ++i)
    ASSERT_NEAR(logits[1][i], logits[0][i], 1e-4 * (1 + std::fabs(logits[0][i]))) << i;
}

// train.device = "auto" picks the GPU where one is visible, GPU <local rank> for each rank.
TEST(GpuDeviceSelection, AutoSelectsTheGpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipping GPU test";
  EXPECT_EQ(select_device("auto", 0), (Device{DeviceKind::cuda, 0}));
  EXPECT_EQ(select_device("auto", 3), (Device{DeviceKind::cuda, 3}));
  EXPECT_EQ(select_device("cpu", 3), (Device{DeviceKind::cpu, 0}));
}

}  // namespace
}  // namespace llmt
