// The whole model's backward against finite differences: for every parameter tensor, the
// directional derivative of the loss along the analytic gradient and along a random direction,
// by central differences, for the GPT-2 and the Llama preset (and with dropout). Also: gradient
// accumulation over micro-batches equals one big batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/model/transformer.h"
#include "tests/unit/tiny_model.h"

namespace llmt {
namespace {

// Large weights make attention peaked and every gradient well above fp32 finite-difference
// noise; with GPT-2's 0.02 the q/k gradients are too small to test.
ModelConfig tiny(Arch arch) {
  return test::tiny_model(arch, {.d_ff = arch == Arch::gpt2 ? 64 : 24, .init_std = 0.3f});
}

struct Fixture {
  std::unique_ptr<DeviceBackend> backend = make_cpu_backend();
  Allocator alloc{*backend};
  Buffer tok_buf;
  Tensor tokens, targets;
  Fixture(int64_t B, int64_t T, int64_t V, uint32_t seed) {
    tok_buf = alloc.allocate_tensor({2, B, T}, DType::i32, MemCategory::other);
    tokens = tok_buf.tensor({B, T}, DType::i32);
    targets = tok_buf.tensor({B, T}, DType::i32, static_cast<size_t>(B * T) * 4);
    std::mt19937 gen(seed);
    for (int64_t i = 0; i < B * T; ++i) {
      tokens.i32()[i] = static_cast<int32_t>(gen() % V);
      targets.i32()[i] = static_cast<int32_t>(gen() % V);
    }
  }
};

void check_gradients(const ModelConfig& cfg, float dropout) {
  ModelConfig c = cfg;
  c.dropout = dropout;
  const int64_t B = 2;
  Fixture f(B, c.seq_len, c.vocab_size, 5);
  ModelSpec spec = ModelSpec::from_config(c);
  Transformer model(spec, f.alloc, B, DType::f32);
  model.init(42);
  StepContext ctx{9, 3, 100};
  model.zero_grads();
  model.forward_backward(f.tokens, f.targets, 1.0f, ctx);

  std::mt19937 gen(1);
  std::normal_distribution<double> normal;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    float* p = model.params()[i].f32();
    const float* g = model.grads()[i].f32();
    const int64_t n = model.params()[i].numel();
    std::vector<float> saved(p, p + n);
    double gnorm = 0;
    for (int64_t k = 0; k < n; ++k) gnorm += static_cast<double>(g[k]) * g[k];
    gnorm = std::sqrt(gnorm);
    std::vector<double> rnd(n);
    double rnorm = 0;
    for (auto& r : rnd) {
      r = normal(gen);
      rnorm += r * r;
    }
    rnorm = std::sqrt(rnorm);
    for (int dir = 0; dir < 2; ++dir) {
      auto direction = [&](int64_t k) {
        return dir == 0 ? (gnorm > 0 ? g[k] / gnorm : 0.0) : rnd[k] / rnorm;
      };
      double analytic = 0;
      for (int64_t k = 0; k < n; ++k) analytic += direction(k) * g[k];
      const double eps = 3e-3;  // larger steps see curvature (0.5% at 1e-2), smaller ones f32 noise
      auto loss_at = [&](double h) {
        for (int64_t k = 0; k < n; ++k) p[k] = static_cast<float>(saved[k] + h * direction(k));
        return static_cast<double>(model.forward_loss(f.tokens, f.targets, ctx));
      };
      double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
      EXPECT_NEAR(numeric, analytic, 5e-3 * std::abs(analytic) + 1e-4)
          << spec.params[i].name
          << (dir == 0 ? " along its gradient" : " along a random direction");
    }
    std::copy(saved.begin(), saved.end(), p);
  }
}

TEST(Transformer, Gpt2GradientsMatchFiniteDifferences) {
  check_gradients(tiny(Arch::gpt2), 0.0f);
}
TEST(Transformer, LlamaGradientsMatchFiniteDifferences) {
  check_gradients(tiny(Arch::llama), 0.0f);
}
TEST(Transformer, DropoutGradientsMatchFiniteDifferences) {
  check_gradients(tiny(Arch::gpt2), 0.2f);
}

TEST(Transformer, InitialLossIsLnVocab) {
  ModelConfig c = tiny(Arch::gpt2);
  c.init_std = 0.02f;
  Fixture f(2, c.seq_len, c.vocab_size, 3);
  Transformer model(ModelSpec::from_config(c), f.alloc, 2, DType::f32);
  model.init(1);
  float loss = model.forward_loss(f.tokens, f.targets, {});
  EXPECT_NEAR(loss, std::log(37.0), 0.05);
}

TEST(Transformer, AccumulatingMicroBatchesEqualsOneBatch) {
  ModelConfig c = tiny(Arch::llama);
  Fixture f(4, c.seq_len, c.vocab_size, 11);
  ModelSpec spec = ModelSpec::from_config(c);
  Transformer big(spec, f.alloc, 4, DType::f32), small(spec, f.alloc, 2, DType::f32);
  big.init(3);
  small.init(3);
  big.zero_grads();
  small.zero_grads();
  float lb = big.forward_backward(f.tokens, f.targets, 1.0f, {});
  float ls = 0;
  for (int m = 0; m < 2; ++m)
    ls += small.forward_backward(f.tokens.rows(2 * m, 2 * m + 2), f.targets.rows(2 * m, 2 * m + 2),
                                 0.5f, {}) /
          2;
  EXPECT_NEAR(ls, lb, 1e-6);
  const float* gb = big.flat_grads().f32();
  const float* gs = small.flat_grads().f32();
  double max_diff = 0, max_g = 0;
  for (int64_t i = 0; i < big.flat_grads().numel(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(gb[i] - gs[i])));
    max_g = std::max(max_g, static_cast<double>(std::abs(gb[i])));
  }
  EXPECT_LT(max_diff, 1e-5 * max_g) << "max |g| " << max_g;
}

TEST(Transformer, Bf16EmulationRoundsWeightsButKeepsMasterExact) {
  ModelConfig c = tiny(Arch::gpt2);
  Fixture f(2, c.seq_len, c.vocab_size, 4);
  ModelSpec spec = ModelSpec::from_config(c);
  Transformer m32(spec, f.alloc, 2, DType::f32), m16(spec, f.alloc, 2, DType::bf16);
  m32.init(8);
  m16.init(8);
  const float* a = m32.flat_params().f32();
  const float* b = m16.flat_params().f32();
  for (int64_t i = 0; i < m32.flat_params().numel(); ++i) ASSERT_EQ(a[i], b[i]);
  float l32 = m32.forward_loss(f.tokens, f.targets, {});
  float l16 = m16.forward_loss(f.tokens, f.targets, {});
  EXPECT_NE(l32, l16);
  EXPECT_NEAR(l16, l32, 2e-2 * l32);
}

}  // namespace
}  // namespace llmt

namespace llmt {
namespace {

struct RecordingHooks : ModelHooks {
  std::vector<std::string> events;
  void before_forward(int b) override { events.push_back(detail::concat("F", b)); }
  void before_backward(int b) override { events.push_back(detail::concat("B", b)); }
  void after_backward(int b) override { events.push_back(detail::concat("b", b)); }
};

TEST(Transformer, HooksVisitBlocksInOrderAndBlocksPartitionTheParameters) {
  ModelConfig c = tiny(Arch::llama);
  Fixture f(1, c.seq_len, c.vocab_size, 2);
  ModelSpec spec = ModelSpec::from_config(c);
  Transformer model(spec, f.alloc, 1, DType::f32);
  RecordingHooks hooks;
  model.set_hooks(&hooks);
  model.forward_backward(f.tokens, f.targets, 1.0f, {});
  const std::vector<std::string> want = {"F0", "F1", "F2", "F3", "B3", "b3",
                                         "B2", "b2", "B1", "b1", "B0", "b0"};
  EXPECT_EQ(hooks.events, want);
  size_t next = 0;
  for (int b = 0; b < model.num_blocks(); ++b) {
    auto [first, last] = model.block_params(b);
    EXPECT_EQ(first, next) << b;
    EXPECT_LT(first, last) << b;
    next = last;
  }
  EXPECT_EQ(next, spec.params.size());
  EXPECT_EQ(spec.params[model.block_params(2).first].name, "layers.1.norm_1.weight");
  EXPECT_EQ(spec.params[model.block_params(3).first].name, "norm_f.weight");
}

}  // namespace
}  // namespace llmt

namespace llmt {
namespace {

TEST(Transformer, EvaluationContextTurnsDropoutOff) {
  ModelConfig c = tiny(Arch::gpt2);
  Fixture f(2, c.seq_len, c.vocab_size, 6);
  ModelConfig with = c;
  with.dropout = 0.3f;
  Transformer plain(ModelSpec::from_config(c), f.alloc, 2, DType::f32);
  Transformer dropped(ModelSpec::from_config(with), f.alloc, 2, DType::f32);
  plain.init(5);
  dropped.init(5);
  StepContext eval{1, 1, 0, /*dropout=*/false};
  EXPECT_EQ(dropped.forward_loss(f.tokens, f.targets, eval),
            plain.forward_loss(f.tokens, f.targets, eval));
  EXPECT_NE(dropped.forward_loss(f.tokens, f.targets, {1, 1, 0}),
            plain.forward_loss(f.tokens, f.targets, eval));
}

// Decoding through the KV cache (llmtrain generate) gives, position by position, the logits of
// the whole-sequence forward: GPT-2 (learned positions), Llama (RoPE, GQA), an MoE model and
// latent attention (the cache holds its expanded keys and values), each greedy continuation the
// argmax of the forward pass over the sequence it has produced.
TEST(Transformer, KvCacheDecodingEqualsTheWholeSequenceForward) {
  ModelConfig moe = tiny(Arch::llama);
  moe.moe.num_experts = 4;
  moe.moe.top_k = 2;
  moe.moe.d_ff_expert = 12;
  ModelConfig mla = tiny(Arch::llama);
  mla.attention = AttentionKind::mla;
  mla.n_kv_heads = mla.n_heads;
  mla.mla = {6, 8, 4, 4, 6};  // q latent 6, kv latent 8, nope 4 + rope 4, values 6 (padded to 8)
  // RoPE scaling: Llama 3.1's on the Llama, and DeepSeek's YaRN (the scores' factor in the KV
  // cache's attention too) on the latent attention.
  ModelConfig llama3 = tiny(Arch::llama), yarn = mla;
  llama3.rope_scaling.rope_type = RopeType::llama3;
  llama3.rope_scaling.factor = 4.0f;
  llama3.rope_scaling.original_max_position_embeddings = 8;
  yarn.rope_scaling.rope_type = RopeType::yarn;
  yarn.rope_scaling.factor = 4.0f;
  yarn.rope_scaling.original_max_position_embeddings = 4;
  yarn.rope_scaling.mscale = 0.707f;
  yarn.rope_scaling.mscale_all_dim = 1.0f;
  for (const ModelConfig& c : {tiny(Arch::gpt2), tiny(Arch::llama), moe, mla, llama3, yarn}) {
    const int64_t T = c.seq_len, V = c.vocab_size;
    Fixture f(1, T, V, 11);
    const ModelSpec spec = ModelSpec::from_config(c);
    Transformer whole(spec, f.alloc, 1, DType::f32);
    whole.init(42);
    Transformer decoder(spec, f.alloc, 1, DType::f32, ModelStorage{true, false, true}, {}, {}, {},
                        nullptr, T);
    std::copy_n(whole.flat_params().f32(), whole.flat_params().numel(),
                decoder.flat_params().f32());
    StepContext ctx;
    ctx.dropout = false;
    const Tensor logits = whole.forward_logits(f.tokens, ctx);  // (T, V)
    std::vector<float> expected(logits.f32(), logits.f32() + T * V);
    Buffer one = f.alloc.allocate(4, MemCategory::other);
    Tensor token = one.tensor({1, 1}, DType::i32);
    for (int64_t pos = 0; pos < T; ++pos) {
      token.i32()[0] = f.tokens.i32()[pos];
      const Tensor step = decoder.decode(token, pos);  // (1, V)
      for (int64_t v = 0; v < V; ++v)
        ASSERT_NEAR(step.f32()[v], expected[static_cast<size_t>(pos * V + v)], 2e-5)
            << "n_experts " << c.moe.num_experts << " mla " << c.mla_attention() << " rope scaling "
            << static_cast<int>(c.rope_scaling.rope_type) << " position " << pos << " token " << v;
    }
    // Greedy: each position's argmax, fed back; the forward over the produced sequence agrees.
    std::vector<int32_t> seq{f.tokens.i32()[0]};
    for (int64_t pos = 0; pos + 1 < T; ++pos) {
      token.i32()[0] = seq.back();
      const Tensor step = decoder.decode(token, pos);
      seq.push_back(
          static_cast<int32_t>(std::max_element(step.f32(), step.f32() + V) - step.f32()));
    }
    std::copy(seq.begin(), seq.end(), f.tokens.i32());
    const Tensor again = whole.forward_logits(f.tokens, ctx);
    for (int64_t pos = 0; pos + 1 < T; ++pos) {
      const float* row = again.f32() + pos * V;
      EXPECT_EQ(std::max_element(row, row + V) - row, seq[static_cast<size_t>(pos) + 1])
          << "n_experts " << c.moe.num_experts << " position " << pos;
    }
  }
}

}  // namespace
}  // namespace llmt
