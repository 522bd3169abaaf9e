// Pipeline stages in one process: ModelSpec::shard_pp's split (layers per chunk, embeddings,
// head, the tied copy of wte), stage models initialised exactly as the whole model, and chunks
// run in stage order with activations and gradients handed over by copy giving the whole model's
// loss and, bit for bit, its gradients (full backward and the zero-bubble split), with dropout.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "engine/model/transformer.h"
#include "kernels/ops.h"
#include "tests/unit/tiny_model.h"

namespace llmt {
namespace {

ModelConfig tiny(Arch arch) {
  return test::tiny_model(arch, {.layers = 4, .d_ff = 24, .init_std = 0.3f, .dropout = 0.1f});
}

std::vector<std::string> names(const ModelSpec& s) {
  std::vector<std::string> out;
  for (const ParamSpec& p : s.params) out.push_back(p.name + (p.tied_copy ? " (copy)" : ""));
  return out;
}

TEST(PipelineStages, ShardPpSplitsLayersEmbeddingsAndHead) {
  const ModelSpec gpt = ModelSpec::from_config(tiny(Arch::gpt2));
  // pp 2, v 2: rank 0 holds stages 0 and 2 (layers 0, 2) and the embeddings; rank 1 stages 1 and
  // 3 (layers 1, 3), norm_f and, tied, a copy of wte.
  const ModelSpec r0 = gpt.shard_pp(2, 2, {}, 0), r1 = gpt.shard_pp(2, 2, {}, 1);
  EXPECT_EQ(r0.chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(r1.chunks, (std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {3, 4}}));
  EXPECT_TRUE(r0.has_embedding && !r0.has_head && !r1.has_embedding && r1.has_head);
  EXPECT_EQ(names(r0).front(), "wte.weight");
  EXPECT_EQ(names(r0)[1], "wpe.weight");
  EXPECT_EQ(names(r0)[2], "layers.0.norm_1.weight");
  EXPECT_EQ(names(r1).front(), "wte.weight (copy)");
  EXPECT_EQ(names(r1)[1], "layers.1.norm_1.weight");
  EXPECT_EQ(names(r1)[names(r1).size() - 2], "norm_f.weight");
  // Every global parameter on exactly one stage, plus the copy.
  EXPECT_EQ(r0.params.size() + r1.params.size(), gpt.params.size() + 1);
  // Explicit layers per stage: [1, 3] over pp 2.
  const ModelSpec llama = ModelSpec::from_config(tiny(Arch::llama));
  const ModelSpec u1 = llama.shard_pp(2, 1, {1, 3}, 1);
  EXPECT_EQ(u1.chunks, (std::vector<std::pair<int64_t, int64_t>>{{1, 4}}));
  EXPECT_EQ(names(u1).back(), "lm_head.weight");  // untied: no copy of wte
  EXPECT_EQ(names(u1).front(), "layers.1.norm_1.weight");
  // In a V (ZB-V), rank 0 holds stages 0 and 3 (layers 0, 3), the embeddings and the head with
  // the one wte (no copy); rank 1 stages 1 and 2 (layers 1, 2) and nothing else.
  const ModelSpec v0 = gpt.shard_pp(2, 2, {}, 0, true), v1 = gpt.shard_pp(2, 2, {}, 1, true);
  EXPECT_EQ(v0.chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {3, 4}}));
  EXPECT_EQ(v1.chunks, (std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {2, 3}}));
  EXPECT_TRUE(v0.has_embedding && v0.has_head && !v1.has_embedding && !v1.has_head);
  EXPECT_EQ(names(v0).front(), "wte.weight");
  EXPECT_EQ(names(v0).back(), "norm_f.bias");
  EXPECT_EQ(names(v1).front(), "layers.1.norm_1.weight");
  EXPECT_EQ(v0.params.size() + v1.params.size(), gpt.params.size());
  EXPECT_THROW(llama.shard_pp(3, 1, {}, 0), Error);         // 4 layers over 3 stages
  EXPECT_THROW(llama.shard_pp(2, 1, {1, 2}, 0), Error);     // sums to 3
  EXPECT_THROW(llama.shard_pp(2, 1, {1, 1, 2}, 0), Error);  // 3 entries for 2 stages
}

// Runs m micro-batches through p stages (v chunks each) in one process: forwards in stage order,
// backwards in reverse, copying activations and gradients; `split` uses backward_input_chunk and
// backward_weight_chunk. Compares the loss and every gradient with the whole model's.
void check_stages(Arch arch, int p, int v, bool split) {
  const ModelConfig cfg = tiny(arch);
  const ModelSpec spec = ModelSpec::from_config(cfg);
  std::unique_ptr<DeviceBackend> backend = make_cpu_backend();
  Allocator alloc(*backend);
  const int64_t B = 2, T = cfg.seq_len;
  const int m = 3;
  Buffer tok = alloc.allocate_tensor({m, 2, B, T}, DType::i32, MemCategory::other);
  std::mt19937 gen(5);
  for (int64_t i = 0; i < m * 2 * B * T; ++i)
    static_cast<int32_t*>(tok.data())[i] = static_cast<int32_t>(gen() % cfg.vocab_size);
  auto tokens = [&](int i) {
    return tok.tensor({B, T}, DType::i32, static_cast<size_t>(2 * i * B * T) * 4);
  };
  auto targets = [&](int i) {
    return tok.tensor({B, T}, DType::i32, static_cast<size_t>((2 * i + 1) * B * T) * 4);
  };
  auto ctx = [&](int i) { return StepContext{7, 2, 100 + B * i}; };
  const float dloss = 1.0f / m;

  Transformer whole(spec, alloc, B, DType::f32);
  whole.init(3);
  double whole_loss = 0;
  for (int i = 0; i < m; ++i)
    whole_loss += whole.forward_backward(tokens(i), targets(i), dloss, ctx(i));

  std::vector<std::unique_ptr<Transformer>> stages;
  for (int r = 0; r < p; ++r) {
    stages.push_back(
        std::make_unique<Transformer>(spec.shard_pp(p, v, {}, r), alloc, B, DType::f32));
    stages.back()->init(3);
    stages.back()->zero_grads();
  }
  const int S = p * v;
  double loss = 0;
  for (int i = 0; i < m; ++i) {
    for (int s = 0; s < S; ++s) {
      Transformer& st = *stages[static_cast<size_t>(s % p)];
      if (s > 0)
        ops::copy(st.chunk_input(s / p, i),
                  stages[static_cast<size_t>((s - 1) % p)]->chunk_output((s - 1) / p, i));
      loss += st.forward_chunk(s / p, i, tokens(i), targets(i), dloss, ctx(i));
    }
  }
  for (int i = 0; i < m; ++i) {
    Buffer grad =
        alloc.allocate_tensor(stages[0]->activation_shape(), DType::f32, MemCategory::other);
    Tensor g = grad.tensor(stages[0]->activation_shape(), DType::f32);
    for (int s = S - 1; s >= 0; --s) {
      Transformer& st = *stages[static_cast<size_t>(s % p)];
      const Tensor dout = s + 1 < S ? g : Tensor();
      const Tensor dx = split ? st.backward_input_chunk(s / p, i, dout, ctx(i))
                              : st.backward_chunk(s / p, i, dout, tokens(i), ctx(i));
      if (s > 0) ops::copy(g, dx);
      if (split) st.backward_weight_chunk(s / p, i, tokens(i), ctx(i));
      st.free_chunk(s / p, i);
    }
  }
  EXPECT_NEAR(loss, whole_loss, 1e-6 * whole_loss);
  for (const auto& st : stages) {
    const ModelSpec& ss = st->spec();
    for (size_t k = 0; k < ss.params.size(); ++k) {
      const size_t i = spec.index_of(ss.params[k].name);
      std::vector<float> a(static_cast<size_t>(ss.params[k].shape.numel())), b(a.size()),
          w(a.size()), wb(a.size());
      backend->copy_to_host(a.data(), st->grads()[k].data, a.size() * 4);
      backend->copy_to_host(b.data(), whole.grads()[i].data, b.size() * 4);
      backend->copy_to_host(w.data(), st->params()[k].data, w.size() * 4);
      backend->copy_to_host(wb.data(), whole.params()[i].data, wb.size() * 4);
      EXPECT_EQ(w, wb) << ss.params[k].name << ": initial weights differ from the whole model's";
      if (ss.params[k].name == "wte.weight" && cfg.tie_embeddings) {
        // Each copy holds part of the gradient (lookup on stage 0, head on the last); their sum
        // is the whole model's, up to the order of the additions.
        continue;
      }
      EXPECT_EQ(a, b) << ss.params[k].name << " (pp " << p << ", v " << v << ", split " << split
                      << ")";
    }
  }
  if (cfg.tie_embeddings) {
    const size_t i = spec.index_of("wte.weight");
    const Tensor g0 = stages.front()->grads()[0], g1 = stages.back()->grads()[0];
    std::vector<float> a(static_cast<size_t>(g0.numel())), b(a.size()), c(a.size());
    backend->copy_to_host(a.data(), g0.data, a.size() * 4);
    backend->copy_to_host(b.data(), g1.data, b.size() * 4);
    backend->copy_to_host(c.data(), whole.grads()[i].data, c.size() * 4);
    for (size_t e = 0; e < a.size(); ++e)
      ASSERT_NEAR(a[e] + b[e], c[e], 1e-6f * (1.0f + std::abs(c[e]))) << "wte element " << e;
  }
}

TEST(PipelineStages, ChunksReproduceTheWholeModel) {
  for (Arch arch : {Arch::gpt2, Arch::llama}) {
    check_stages(arch, 2, 1, false);
    check_stages(arch, 4, 1, false);
    check_stages(arch, 2, 2, false);
  }
}

TEST(PipelineStages, SplitBackwardEqualsTheFullOne) {
  for (Arch arch : {Arch::gpt2, Arch::llama}) {
    check_stages(arch, 2, 1, true);
    check_stages(arch, 2, 2, true);
  }
}

}  // namespace
}  // namespace llmt
