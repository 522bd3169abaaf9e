// Tensor and sequence parallelism in one process: tp ranks are threads joined by a shared-memory
// communicator (thread_group.h). Checks the Placement arithmetic with exact slices, that each
// rank's initial shard is bit for bit the slice of the single-rank weights, and that tp=2/4, with
// and without sequence parallelism, reproduce the single-rank loss and gradients (GPT-2 and Llama
// presets, dropout on, two accumulated micro-batches).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/parallel/tensor_parallel.h"
#include "tests/unit/parallel/thread_group.h"
#include "tests/unit/tiny_model.h"

namespace llmt {
namespace {

using test::run_ranks;

TEST(Placement, QkvShardIsThreeSlicesOfTheGlobalRows) {
  // H=4, KV=2, D=16, C=64: rows [q 0..64 | k 64..96 | v 96..128).
  const Placement p = Placement::shard(0, {64, 32, 32});
  EXPECT_EQ(p.str(), "Shard(0, [64, 32, 32])");
  EXPECT_EQ(local_shape({128, 64}, p, 2, "qkv"), Shape({64, 64}));
  const auto s = local_slices({128, 64}, p, 2, 1);  // rank 1: q heads 2-3, kv head 1
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].global_start, 32);
  EXPECT_EQ(s[0].local_start, 0);
  EXPECT_EQ(s[0].length, 32);
  EXPECT_EQ(s[1].global_start, 80);
  EXPECT_EQ(s[1].local_start, 32);
  EXPECT_EQ(s[1].length, 16);
  EXPECT_EQ(s[2].global_start, 112);
  EXPECT_EQ(s[2].local_start, 48);
  EXPECT_EQ(s[2].length, 16);
  EXPECT_EQ(local_shape({64, 256}, Placement::shard(1), 4, "fc2"), Shape({64, 64}));
  EXPECT_EQ(local_shape({64}, Placement::replicate(), 4, "norm"), Shape({64}));
  EXPECT_THROW(local_shape({128, 64}, Placement::shard(0, {64, 32, 32}), 64, "qkv"), Error);
}

// init_std 0.2: large enough that every gradient is well above f32 noise.
ModelConfig tiny(Arch arch) {
  const bool llama = arch == Arch::llama;
  return test::tiny_model(arch, {.vocab = 64,
                                 .d_model = 32,
                                 .heads = 8,
                                 .llama_kv_heads = 4,
                                 .seq_len = 8,
                                 .d_ff = 64,
                                 .init_std = 0.2f,
                                 .dropout = llama ? 0.0f : 0.1f});
}

TEST(ModelSpecTp, LocalShapesAndDivisibility) {
  const ModelSpec g = ModelSpec::from_config(tiny(Arch::llama));
  const ModelSpec s = g.shard_tp(4, 3);
  // qkv rows (8 + 2*4) * 4 = 64 -> 16; fc1 [gate|up] 128 -> 32; fc2 (32, 64) -> (32, 16).
  EXPECT_EQ(s.params[s.index_of("layers.0.attn.qkv.weight")].shape, Shape({16, 32}));
  EXPECT_EQ(s.params[s.index_of("layers.1.mlp.fc1.weight")].shape, Shape({32, 32}));
  EXPECT_EQ(s.params[s.index_of("layers.1.mlp.fc2.weight")].shape, Shape({32, 16}));
  EXPECT_EQ(s.params[s.index_of("lm_head.weight")].shape, Shape({16, 32}));
  EXPECT_EQ(s.params[s.index_of("norm_f.weight")].shape, Shape({32}));
  ModelConfig bad = tiny(Arch::llama);
  bad.n_kv_heads = 2;
  bad.vocab_size = 66;
  const auto errors = tensor_parallel_errors(bad, 4, true);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].message.rfind("model.n_kv_heads=2 is not divisible by parallel.tp=4", 0), 0u);
  EXPECT_EQ(errors[1].message.rfind("model.vocab_size=66 is not divisible by parallel.tp=4", 0),
            0u);
  EXPECT_EQ(errors[1].keys, (std::vector<std::string>{"model.vocab_size", "parallel.tp"}));
  EXPECT_THROW(ModelSpec::from_config(bad).shard_tp(4, 0), Error);
}

// Copies rank-local parameter i into its place in the global tensor (host memory).
void place(const ModelSpec& s, size_t i, const float* local, std::vector<float>& global) {
  const Shape g = s.params[i].global_shape, l = s.params[i].shape;
  const int64_t cols_g = g.ndim() == 2 ? g[1] : 1, cols_l = l.ndim() == 2 ? l[1] : 1;
  for (const ShardSlice& sl : s.local_slices(i)) {
    if (sl.dim == 0) {
      for (int64_t r = 0; r < sl.length; ++r)
        std::copy(local + (sl.local_start + r) * cols_l, local + (sl.local_start + r + 1) * cols_l,
                  global.begin() + (sl.global_start + r) * cols_g);
    } else {
      for (int64_t r = 0; r < g[0]; ++r)
        std::copy(local + r * cols_l + sl.local_start,
                  local + r * cols_l + sl.local_start + sl.length,
                  global.begin() + r * cols_g + sl.global_start);
    }
  }
}

// ZeRO shards a tp rank's tensor by rows over dp: initialising any row range on its own gives
// the same bits as the whole shard, for every kind of slice (qkv's three, fc2's columns).
TEST(ModelSpecTp, InitOfRowRangesEqualsWholeShard) {
  for (Arch arch : {Arch::gpt2, Arch::llama}) {
    const ModelSpec s = ModelSpec::from_config(tiny(arch)).shard_tp(4, 1);
    for (size_t i = 0; i < s.params.size(); ++i) {
      const Shape sh = s.params[i].shape;
      std::vector<float> whole(sh.numel()), parts(sh.numel());
      init_param_rows(s, i, Tensor(whole.data(), sh, DType::f32), 0, 9);
      const int64_t rows = sh[0], row = sh.numel() / rows;
      for (int64_t a = 0; a < rows;) {
        const int64_t b = std::min(rows, a + 3);  // ranges that cut across slices
        init_param_rows(s, i, Tensor(parts.data() + a * row, sh, DType::f32).rows(0, b - a), a, 9);
        a = b;
      }
      EXPECT_EQ(whole, parts) << s.params[i].name;
    }
  }
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch batch(int64_t B, int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  Batch b;
  for (int64_t i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<int32_t>(gen() % V));
    b.targets.push_back(static_cast<int32_t>(gen() % V));
  }
  b.targets[3] = -1;  // an ignored position
  return b;
}

// One model on one rank: init, then two accumulated micro-batches. Returns the losses; the
// gradients stay in the model.
struct RankRun {
  std::unique_ptr<DeviceBackend> backend = make_cpu_backend();
  Allocator alloc{*backend};
  std::unique_ptr<Transformer> model;
  std::vector<float> losses;
  static constexpr int64_t B = 2;

  RankRun(const ModelConfig& c, TensorParallel tp) {
    model = std::make_unique<Transformer>(ModelSpec::from_config(c).shard_tp(tp.size(), tp.rank()),
                                          alloc, B, DType::f32, ModelStorage{}, tp);
    model->init(7);
    model->zero_grads();
    Buffer buf = alloc.allocate_tensor({2, B, c.seq_len}, DType::i32, MemCategory::other);
    Tensor tok = buf.tensor({B, c.seq_len}, DType::i32);
    Tensor tgt = buf.tensor({B, c.seq_len}, DType::i32, static_cast<size_t>(B * c.seq_len) * 4);
    for (int micro = 0; micro < 2; ++micro) {
      Batch b = batch(B, c.seq_len, c.vocab_size, 100 + micro);
      std::copy(b.tokens.begin(), b.tokens.end(), tok.i32());
      std::copy(b.targets.begin(), b.targets.end(), tgt.i32());
      losses.push_back(model->forward_backward(tok, tgt, 0.5f, StepContext{5, 3, micro * B}));
    }
  }
};

// The tp ranks' parameters or gradients placed into global tensors; replicated ones must be
// bitwise the same on every rank.
using Globals = std::vector<std::vector<float>>;

void check_tp(Arch arch, int p, bool sp) {
  const ModelConfig c = tiny(arch);
  RankRun ref(c, {});
  const ModelSpec& gs = ref.model->spec();
  Globals params(gs.params.size()), grads(gs.params.size());
  for (size_t i = 0; i < gs.params.size(); ++i) {
    params[i].assign(gs.params[i].shape.numel(), NAN);
    grads[i].assign(gs.params[i].shape.numel(), NAN);
  }
  std::vector<std::vector<float>> rank_losses(p);
  std::vector<Globals> rank_params(p, params), rank_grads(p, grads);
  run_ranks(p, [&](Communicator& comm) {
    RankRun run(c, {&comm, sp});
    const int r = comm.rank();
    rank_losses[r] = run.losses;
    const ModelSpec& s = run.model->spec();
    for (size_t i = 0; i < s.params.size(); ++i) {
      place(s, i, run.model->params()[i].f32(), rank_params[r][i]);
      place(s, i, run.model->grads()[i].f32(), rank_grads[r][i]);
    }
  });
  // Sharded: each rank fills its slices; replicated: every rank holds the same bits.
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < gs.params.size(); ++i) {
      if (gs.params[i].on(Axis::tp).sharded()) {
        for (size_t k = 0; k < params[i].size(); ++k) {
          if (!std::isnan(rank_params[r][i][k])) params[i][k] = rank_params[r][i][k];
          if (!std::isnan(rank_grads[r][i][k])) grads[i][k] = rank_grads[r][i][k];
        }
      } else {
        EXPECT_EQ(rank_params[r][i], rank_params[0][i]) << gs.params[i].name << " rank " << r;
        EXPECT_EQ(rank_grads[r][i], rank_grads[0][i]) << gs.params[i].name << " grad, rank " << r;
        params[i] = rank_params[0][i];
        grads[i] = rank_grads[0][i];
      }
    }
  for (int r = 0; r < p; ++r)
    for (size_t k = 0; k < ref.losses.size(); ++k)
      EXPECT_NEAR(rank_losses[r][k], ref.losses[k], 1e-5 * std::abs(ref.losses[k]))
          << "rank " << r << " micro-batch " << k;
  for (size_t i = 0; i < gs.params.size(); ++i) {
    const float* want_p = ref.model->params()[i].f32();
    const float* want_g = ref.model->grads()[i].f32();
    double diff = 0, norm = 0;
    for (size_t k = 0; k < params[i].size(); ++k) {
      ASSERT_EQ(params[i][k], want_p[k]) << gs.params[i].name << " initial value " << k;
      diff += std::pow(static_cast<double>(grads[i][k]) - want_g[k], 2);
      norm += std::pow(static_cast<double>(want_g[k]), 2);
    }
    EXPECT_GT(norm, 0) << gs.params[i].name;
    EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << gs.params[i].name << " gradient";
  }
}

TEST(TensorParallel, Gpt2Tp2) {
  check_tp(Arch::gpt2, 2, false);
}
TEST(TensorParallel, Gpt2Tp4) {
  check_tp(Arch::gpt2, 4, false);
}
TEST(TensorParallel, Gpt2Tp2SequenceParallel) {
  check_tp(Arch::gpt2, 2, true);
}
TEST(TensorParallel, Gpt2Tp4SequenceParallel) {
  check_tp(Arch::gpt2, 4, true);
}
TEST(TensorParallel, LlamaTp2) {
  check_tp(Arch::llama, 2, false);
}
TEST(TensorParallel, LlamaTp4) {
  check_tp(Arch::llama, 4, false);
}
TEST(TensorParallel, LlamaTp2SequenceParallel) {
  check_tp(Arch::llama, 2, true);
}
TEST(TensorParallel, LlamaTp4SequenceParallel) {
  check_tp(Arch::llama, 4, true);
}

// The regions move exactly the bytes of their collective: per layer without SP two all-reduces
// of (N,C) forward (row-parallel outputs) and two backward (column-parallel input grads).
TEST(TensorParallel, RegionsMoveTheExpectedCollectives) {
  const ModelConfig c = tiny(Arch::llama);
  run_ranks(2, [&](Communicator& comm) {
    RankRun run(c, {&comm, false});
    const int64_t L = c.n_layers;
    // Per micro-batch: embedding 1, layers 2L forward + 2L backward, head input grad 1, CE 2.
    EXPECT_EQ(comm.counters().calls[static_cast<int>(CommKind::all_reduce)], 2 * (4 * L + 4));
    EXPECT_EQ(comm.counters().calls[static_cast<int>(CommKind::all_gather)], 0);
  });
  run_ranks(2, [&](Communicator& comm) {
    RankRun run(c, {&comm, true});
    const int64_t L = c.n_layers;
    // Per micro-batch: all-gathers 2L forward + 1 (norm_f) and 2L (dy) + 2L (inputs again) + 1
    // (embedding grad) backward; reduce-scatters 1 (embedding) + 2L forward, 2L + 1 backward.
    EXPECT_EQ(comm.counters().calls[static_cast<int>(CommKind::all_gather)], 2 * (6 * L + 2));
    EXPECT_EQ(comm.counters().calls[static_cast<int>(CommKind::reduce_scatter)], 2 * (4 * L + 2));
  });
}

}  // namespace
}  // namespace llmt
