// The model a rank builds (train/rank_model.h) on the meta device counts exactly what it
// allocates on the CPU: every category of the Allocator, live and peak, and the activation,
// stash and scratch layouts `plan` reads, over layouts that shape the model differently (tp with
// sequence parallelism, cp ring and Ulysses, interleaved pipeline chunks, experts under ep,
// recompute, 16 bits); and a group's shape runs no collective.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "engine/comm/communicator.h"
#include "engine/model/parallelize.h"
#include "train/config.h"
#include "train/rank_model.h"

namespace llmt {
namespace {

struct Built {
  std::unique_ptr<DeviceBackend> backend;
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<Communicator> tp, cp, ep;
  std::unique_ptr<Transformer> model;
};

// Rank `rank` of `cfg` at `world` ranks, its model on `backend`.
Built build(const Config& cfg, int world, int rank, std::unique_ptr<DeviceBackend> backend) {
  Built b;
  b.backend = std::move(backend);
  b.alloc = std::make_unique<Allocator>(*b.backend);
  const MeshShape mesh = mesh_shape(cfg.parallel, world);
  const ModelSpec spec =
      parallelize(ModelSpec::from_config(cfg.model), model_layout(cfg.parallel, mesh), rank);
  const auto coords = mesh.coords(rank);
  b.tp = make_shape_communicator(spec.tp_rank, spec.tp_size, "tp");
  const int cp = mesh.size(Axis::cp);
  if (cp > 1) b.cp = make_shape_communicator(coords[static_cast<int>(Axis::cp)], cp, "cp");
  if (spec.ep_size > 1) b.ep = make_shape_communicator(spec.ep_rank, spec.ep_size, "ep");
  b.model = make_rank_model(cfg, spec, *b.alloc, b.tp.get(), b.cp.get(), b.ep.get());
  return b;
}

Config config(const std::vector<std::string>& sets) {
  const std::string toml =
      "[model]\narch = \"llama\"\nvocab_size = 96\nn_layers = 4\nd_model = 32\nn_heads = 4\n"
      "n_kv_heads = 2\nseq_len = 16\n[model.moe]\nnum_experts = 4\ntop_k = 2\n"
      "d_ff_expert = 24\nevery = 2\n[train]\nglobal_batch_size = 8\n"
      "micro_batch_size = 2\n[data]\nsource = \"synthetic\"\n";
  return parse_config_string(toml, "rank_model.toml", sets);
}

TEST(RankModel, TheMetaDeviceCountsWhatTheCpuAllocates) {
  const std::vector<std::pair<int, std::vector<std::string>>> layouts{
      {1, {}},
      {2, {"parallel.tp=2", "parallel.sequence_parallel=true"}},
      {2, {"parallel.cp=2"}},
      {4, {"parallel.cp=4", "parallel.cp_impl=\"hybrid\"", "parallel.cp_ulysses=2"}},
      {2, {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_schedule=\"interleaved\""}},
      {4, {"parallel.dp=4", "parallel.ep=2", "train.recompute=\"full\""}},
      {4,
       {"parallel.dp=2", "parallel.ep=2", "parallel.tp=2", "parallel.sequence_parallel=true",
        "train.recompute=\"selective\""}},
      {2, {"parallel.dp=2", "parallel.zero_stage=3", "train.precision=\"bf16\""}},
      {1, {"train.recompute=\"full\"", "train.recompute_layers=1"}},
  };
  for (const auto& [world, sets] : layouts) {
    const Config cfg = config(sets);
    for (int rank = 0; rank < world; ++rank) {
      std::string where = "world " + std::to_string(world) + " rank " + std::to_string(rank);
      for (const std::string& s : sets) where += " " + s;
      SCOPED_TRACE(where);
      const Built cpu = build(cfg, world, rank, make_cpu_backend());
      const Built meta = build(cfg, world, rank, make_meta_backend());
      const MemStats &c = cpu.alloc->stats(), &m = meta.alloc->stats();
      for (int k = 0; k < kNumMemCategories; ++k) {
        EXPECT_EQ(m.live[k], c.live[k]) << category_name(static_cast<MemCategory>(k));
        EXPECT_EQ(m.peak[k], c.peak[k]) << category_name(static_cast<MemCategory>(k));
      }
      EXPECT_GT(m.live[static_cast<int>(MemCategory::activations)], 0);
      ASSERT_EQ(meta.model->num_chunks(), cpu.model->num_chunks());
      for (int ch = 0; ch < cpu.model->num_chunks(); ++ch) {
        EXPECT_EQ(meta.model->chunk_activation_bytes(ch), cpu.model->chunk_activation_bytes(ch));
        EXPECT_EQ(meta.model->chunk_stash_bytes(ch), cpu.model->chunk_stash_bytes(ch));
      }
      EXPECT_EQ(meta.model->scratch_bytes(), cpu.model->scratch_bytes());
      EXPECT_GT(meta.model->scratch_bytes(), 0u);
    }
  }
}

TEST(RankModel, AGroupsShapeRunsNoCollective) {
  const std::unique_ptr<Communicator> g = make_shape_communicator(1, 4, "tp");
  EXPECT_EQ(g->rank(), 1);
  EXPECT_EQ(g->size(), 4);
  try {
    g->all_reduce(Tensor());
    FAIL() << "all_reduce on a group's shape ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce on tp, a group's shape only (rank 1 of 4)"),
              std::string::npos)
        << e.what();
  }
  const std::unique_ptr<Communicator> part = g->split(0, 1, "ring");
  EXPECT_THROW(part->size(), Error);
  EXPECT_THROW(part->all_gather(Tensor(), Tensor()), Error);
  EXPECT_THROW(make_shape_communicator(4, 4, "tp"), Error);
}

TEST(RankModel, TheMetaDeviceHoldsNoData) {
  const std::unique_ptr<DeviceBackend> meta = make_meta_backend();
  Allocator alloc(*meta);
  // Address space only: a terabyte is reserved without memory.
  Buffer b = alloc.allocate(size_t{1} << 40, MemCategory::activations);
  EXPECT_NE(b.data(), nullptr);
  EXPECT_EQ(alloc.stats().live[static_cast<int>(MemCategory::activations)], int64_t{1} << 40);
  float x = 1;
  meta->copy_from_host(b.data(), &x, sizeof x);  // dropped
  EXPECT_THROW(meta->copy_to_host(&x, b.data(), sizeof x), Error);
  b.reset();
  EXPECT_EQ(alloc.stats().live[static_cast<int>(MemCategory::activations)], 0);
}

}  // namespace
}  // namespace llmt
