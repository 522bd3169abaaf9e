// The pipeline executor on pp = world size ranks (mpirun -np 2 / 4): for each schedule, the peak
// activation bytes the allocator measured on each stage equal the schedule's predicted in-flight
// micro-batches (simulate()) times one micro-batch's activations of a chunk (within the bounds
// of the chunks' sizes and, for zb-h1, of the backward stash), and the loss every
// rank reports equals the whole model's mean loss over the micro-batches. The pipeline stage's
// collectives give exact per-rank sums (the gradient norm over the stages, the tied embeddings'
// gradients over the first and last stage).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/model/model_config.h"
#include "engine/parallel/mesh.h"
#include "engine/pipeline/executor.h"
#include "engine/pipeline/stage.h"
#include "tests/mpi/mpi_test_main.h"
#include "tests/unit/tiny_model.h"

namespace llmt {

namespace {

ModelConfig tiny(Arch arch) {
  return test::tiny_model(arch, {.layers = 8, .d_ff = 24});
}

// Runs one step of `kind` with m micro-batches of 2 samples; checks peak activations and loss.
void check(Arch arch, PipeSchedule kind, int v, int m) {
  const int p = mpi_test_world().size(), rank = mpi_test_world().rank();
  const ModelConfig cfg = tiny(arch);
  const int64_t B = 2, T = cfg.seq_len;
  std::unique_ptr<DeviceBackend> backend = make_cpu_backend();
  Allocator alloc(*backend);
  MeshShape shape;
  shape.degree = {1, 1, 1, p};
  Mesh mesh = Mesh::create(shape, mpi_test_world().split(0, rank, "world"));

  // The same tokens on every rank.
  Buffer tok = alloc.allocate_tensor({m, 2, B, T}, DType::i32, MemCategory::other);
  std::mt19937 gen(11);
  for (int64_t i = 0; i < m * 2 * B * T; ++i)
    static_cast<int32_t*>(tok.data())[i] = static_cast<int32_t>(gen() % cfg.vocab_size);
  std::vector<PipelineMicroBatch> mbs;
  for (int i = 0; i < m; ++i)
    mbs.push_back({tok.tensor({B, T}, DType::i32, static_cast<size_t>(2 * i * B * T) * 4),
                   tok.tensor({B, T}, DType::i32, static_cast<size_t>((2 * i + 1) * B * T) * 4),
                   StepContext{1, 1, 2 * i}});

  const ModelSpec spec = ModelSpec::from_config(cfg);
  double whole_loss = 0;
  {
    Transformer whole(spec, alloc, B, DType::f32);
    whole.init(3);
    for (const PipelineMicroBatch& mb : mbs)
      whole_loss += whole.forward_loss(mb.tokens, mb.targets, mb.ctx);
    whole_loss /= m;
  }

  Transformer model(spec.shard_pp(p, v, {}, rank, v_shaped(kind)), alloc, B, DType::f32);
  model.init(3);
  const Schedule schedule = make_schedule(kind, {p, v, m});
  const Simulation sim = simulate(schedule);
  PipelineExecutor exec(schedule, model, mesh.comm(Axis::pp), alloc);
  alloc.reset_peaks();
  const int64_t before = alloc.stats().live[static_cast<int>(MemCategory::activations)];
  const double loss = exec.run(mbs, 1.0f / static_cast<float>(m), [](bool) {});
  const int64_t peak = alloc.stats().peak[static_cast<int>(MemCategory::activations)] - before;
  EXPECT_EQ(alloc.stats().live[static_cast<int>(MemCategory::activations)], before)
      << "activations left allocated after the step";

  // Zero-bubble: a micro-batch between its backward_input and backward_weight also holds the
  // stash of output gradients.
  const bool zb = splits_backward(kind);
  std::vector<size_t> lo_bytes, hi_bytes;
  for (int c = 0; c < v; ++c) {
    lo_bytes.push_back(model.chunk_activation_bytes(c));
    hi_bytes.push_back(lo_bytes.back() + (zb ? model.chunk_stash_bytes(c) : 0));
  }
  const int64_t lo = static_cast<int64_t>(*std::min_element(lo_bytes.begin(), lo_bytes.end()));
  const int64_t hi = static_cast<int64_t>(*std::max_element(hi_bytes.begin(), hi_bytes.end()));
  const int64_t in_flight = sim.peak_in_flight[static_cast<size_t>(rank)];
  if (lo == hi) {
    EXPECT_EQ(peak, in_flight * lo) << schedule_name(kind) << " rank " << rank << ": predicted "
                                    << in_flight << " micro-batches of " << lo << " bytes";
  } else {  // chunks of different sizes (the head's), or the ZB stash: between the bounds
    EXPECT_GE(peak, in_flight * lo) << schedule_name(kind) << " rank " << rank;
    EXPECT_LE(peak, in_flight * hi) << schedule_name(kind) << " rank " << rank;
  }
  EXPECT_NEAR(loss, whole_loss, 1e-6 * whole_loss) << schedule_name(kind) << " rank " << rank;
}

TEST(PipelineExecutor, GpipeHoldsEveryMicroBatch) {
  check(Arch::gpt2, PipeSchedule::gpipe, 1, 8);
  check(Arch::llama, PipeSchedule::gpipe, 1, 8);
}

TEST(PipelineExecutor, OneFOneBHoldsAtMostStagesMicroBatches) {
  check(Arch::gpt2, PipeSchedule::one_f_one_b, 1, 8);
  check(Arch::llama, PipeSchedule::one_f_one_b, 1, 8);
}

TEST(PipelineExecutor, ZeroBubbleH1) {
  check(Arch::gpt2, PipeSchedule::zb_h1, 1, 8);
  check(Arch::llama, PipeSchedule::zb_h1, 1, 8);
}

// The V: rank 0 holds the embeddings and the head, the last rank hands its chunk 0's output to its
// chunk 1 in memory (and the input gradient back).
TEST(PipelineExecutor, ZeroBubbleV) {
  check(Arch::gpt2, PipeSchedule::zb_v, 2, 8);
  check(Arch::llama, PipeSchedule::zb_v, 2, 8);
}

// DualPipeV's V with its F&B pairs: whole and split backwards of one chunk in one step.
TEST(PipelineExecutor, DualPipeV) {
  check(Arch::gpt2, PipeSchedule::dualpipe_v, 2, 8);
  check(Arch::llama, PipeSchedule::dualpipe_v, 2, 8);
}

TEST(PipelineExecutor, Interleaved) {
  check(Arch::gpt2, PipeSchedule::interleaved, 2, 2 * mpi_test_world().size());
  check(Arch::llama, PipeSchedule::interleaved, 2, 2 * mpi_test_world().size());
}

// With p ranks, rank r's norm r+1 -> sqrt(1^2 + ... + p^2) everywhere, and one rank's overflow
// everywhere; GPT-2's tied wte: rank 0's gradient (all 1) and the last rank's (all p) sum to 1 + p
// on both, the middle ranks hold no copy and are not asked for one; the predicted bubble is the
// published (p-1)/m of 1F1B.
TEST(PipelineStage, SumsOverStagesAndTiesTheEmbeddings) {
  const int p = mpi_test_world().size(), rank = mpi_test_world().rank();
  if (p < 2) GTEST_SKIP() << "needs a first and a last stage";
  const ModelConfig cfg = tiny(Arch::gpt2);
  ASSERT_TRUE(cfg.tie_embeddings);
  std::unique_ptr<DeviceBackend> backend = make_cpu_backend();
  Allocator alloc(*backend);
  MeshShape shape;
  shape.degree = {1, 1, 1, p};
  Mesh mesh = Mesh::create(shape, mpi_test_world().split(0, rank, "world"));
  Transformer model(ModelSpec::from_config(cfg).shard_pp(p, 1, {}, rank), alloc, 2, DType::f32);
  const Schedule schedule = make_schedule(PipeSchedule::one_f_one_b, {p, 1, 4});
  PipelineStage stage(schedule, model, mesh.comm(Axis::pp), alloc, cfg.tie_embeddings);
  EXPECT_DOUBLE_EQ(stage.predicted_bubble(), (p - 1) / 4.0);  // 1F1B: (p-1)/m

  double norm = rank + 1;
  bool overflow = rank == p - 1;
  stage.combine_over_stages(norm, overflow);
  EXPECT_DOUBLE_EQ(norm, std::sqrt(p * (p + 1) * (2 * p + 1) / 6.0)) << "rank " << rank;
  EXPECT_TRUE(overflow) << "rank " << rank;
  overflow = false;
  stage.combine_over_stages(norm, overflow);
  EXPECT_FALSE(overflow) << "rank " << rank;

  const bool end = rank == 0 || rank == p - 1;
  EXPECT_EQ(stage.own_communicators().size(), end ? 1u : 0u) << "rank " << rank;
  const int64_t n = cfg.vocab_size * cfg.d_model;
  std::vector<float> grad(static_cast<size_t>(n), rank == 0 ? 1.0f : static_cast<float>(p));
  int asked = 0;
  stage.sum_tied_embedding_grads([&](size_t i) {
    ++asked;
    EXPECT_EQ(i, model.spec().index_of("wte.weight"));
    return Tensor(grad.data(), {cfg.vocab_size, cfg.d_model}, DType::f32);
  });
  EXPECT_EQ(asked, end ? 1 : 0) << "rank " << rank;
  if (end) {
    for (float g : grad) ASSERT_EQ(g, static_cast<float>(1 + p)) << "rank " << rank;
  }
}

// In a V rank 0 holds both ends and the one wte: no embedding group, nothing summed; the loss
// comes from rank 0.
TEST(PipelineStage, AVHasNoEmbeddingGroup) {
  const int p = mpi_test_world().size(), rank = mpi_test_world().rank();
  if (p < 2) GTEST_SKIP() << "needs two pp ranks";
  const ModelConfig cfg = tiny(Arch::gpt2);
  std::unique_ptr<DeviceBackend> backend = make_cpu_backend();
  Allocator alloc(*backend);
  MeshShape shape;
  shape.degree = {1, 1, 1, p};
  Mesh mesh = Mesh::create(shape, mpi_test_world().split(0, rank, "world"));
  const ModelSpec stage_spec = ModelSpec::from_config(cfg).shard_pp(p, 2, {}, rank, true);
  EXPECT_EQ(stage_spec.has_embedding, rank == 0);
  EXPECT_EQ(stage_spec.has_head, rank == 0);
  for (const ParamSpec& ps : stage_spec.params) EXPECT_FALSE(ps.tied_copy) << ps.name;
  Transformer model(stage_spec, alloc, 2, DType::f32);
  const Schedule schedule = make_schedule(PipeSchedule::zb_v, {p, 2, 2 * p});
  PipelineStage stage(schedule, model, mesh.comm(Axis::pp), alloc, cfg.tie_embeddings);
  EXPECT_TRUE(stage.own_communicators().empty());
  int asked = 0;
  stage.sum_tied_embedding_grads([&](size_t) {
    ++asked;
    return Tensor();
  });
  EXPECT_EQ(asked, 0);
}

}  // namespace
}  // namespace llmt
