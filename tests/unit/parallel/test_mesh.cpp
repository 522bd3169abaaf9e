// Mesh arithmetic without MPI: coordinates (tp fastest), groups per axis, the worked example in
// mesh.h, the rank map, and validate_layout's messages.
#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>

#include "engine/parallel/mesh.h"
#include "train/config.h"

namespace llmt {
namespace {

MeshShape shape(int tp, int cp, int dp, int pp) {
  MeshShape s;
  s.degree = {tp, cp, dp, pp};
  return s;
}

TEST(Mesh, WorkedExample) {
  // tp=2, dp=2, pp=2 (world 8): rank 5 = tp 1 + 2*(cp 0) + 2*(dp 0) + 4*(pp 1).
  const MeshShape s = shape(2, 1, 2, 2);
  EXPECT_EQ(s.world(), 8);
  EXPECT_EQ(s.coords(5), (std::array<int, 4>{1, 0, 0, 1}));
  EXPECT_EQ(s.rank_of({1, 0, 0, 1}), 5);
  EXPECT_EQ(s.group(5, Axis::tp), (std::vector<int>{4, 5}));
  EXPECT_EQ(s.group(5, Axis::dp), (std::vector<int>{5, 7}));
  EXPECT_EQ(s.group(5, Axis::pp), (std::vector<int>{1, 5}));
  EXPECT_EQ(s.group(5, Axis::cp), (std::vector<int>{5}));
}

// The header's worked example: tp=2, dp=2, pp=2, rank 5's group over {tp, dp} is ranks 4-7; over
// {tp, pp} ranks 4, 5 and 0, 1 (dp coordinate 0); over every axis the world.
TEST(Mesh, GroupOverAxes) {
  MeshShape s;
  s.degree = {2, 1, 2, 2};
  EXPECT_EQ(s.group(5, {Axis::tp, Axis::dp}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(s.group(5, {Axis::pp, Axis::tp}), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(s.group(5, {Axis::dp, Axis::cp}), (std::vector<int>{5, 7}));
  EXPECT_EQ(s.group(5, {Axis::tp, Axis::cp, Axis::dp, Axis::pp}).size(), 8u);
}

TEST(Mesh, RoundTripAllAxes) {
  const MeshShape s = shape(2, 3, 2, 2);
  for (int r = 0; r < s.world(); ++r) {
    EXPECT_EQ(s.rank_of(s.coords(r)), r);
    for (int a = 0; a < kNumAxes; ++a) {
      const auto g = s.group(r, static_cast<Axis>(a));
      ASSERT_EQ(static_cast<int>(g.size()), s.degree[a]);
      EXPECT_EQ(g[s.coords(r)[a]], r);  // a rank's place in its group is its coordinate
    }
  }
  EXPECT_EQ(s.coords(23), (std::array<int, 4>{1, 2, 1, 1}));
  EXPECT_EQ(s.coords(7), (std::array<int, 4>{1, 0, 1, 0}));
  EXPECT_EQ(s.group(7, Axis::cp), (std::vector<int>{7, 9, 11}));
}

TEST(Launcher, EnvironmentDecides) {
  // Saved and restored: the test itself may run under mpirun.
  const char* names[] = {"OMPI_COMM_WORLD_SIZE",
                         "OMPI_COMM_WORLD_LOCAL_RANK",
                         "PMIX_RANK",
                         "PMI_RANK",
                         "SLURM_PROCID",
                         "SLURM_NTASKS",
                         "SLURM_LOCALID",
                         "MPI_LOCALRANKID"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
    unsetenv(n);
  }
  EXPECT_FALSE(launched_distributed());
  EXPECT_EQ(local_rank_from_env(), 0);
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "1", 1);
  EXPECT_FALSE(launched_distributed());  // srun of one task: no MPI needed
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_LOCALID", "2", 1);
  EXPECT_TRUE(launched_distributed());
  EXPECT_EQ(local_rank_from_env(), 2);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(local_rank_from_env(), 3);  // Open MPI's variable first
  for (const char* n : names) unsetenv(n);
  for (const auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
}

TEST(Mesh, LocalMeshOfOne) {
  Mesh m = Mesh::create(MeshShape{}, make_local_communicator());
  EXPECT_EQ(m.rank(), 0);
  for (int a = 0; a < kNumAxes; ++a) EXPECT_EQ(m.comm(static_cast<Axis>(a)).size(), 1);
  EXPECT_EQ(m.comm(Axis::dp).name(), "dp");
}

const char* kBase = R"(
[model]
vocab_size = 256
n_layers = 2
d_model = 64
n_heads = 4
seq_len = 32
[train]
global_batch_size = 8
micro_batch_size = 2
)";

// A test's overrides followed by the ones its cases share.
std::vector<std::string> joined(std::vector<std::string> more,
                                const std::vector<std::string>& shared) {
  more.insert(more.end(), shared.begin(), shared.end());
  return more;
}

std::string layout_error(const std::vector<std::string>& sets, int world) {
  try {
    validate_layout(parse_config_string(kBase, "base.toml", sets), world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Layout, WorldSizeMismatchPrintsEveryFactor) {
  EXPECT_EQ(layout_error({"parallel.tp=2", "parallel.dp=2"}, 8),
            "tp(2)*cp(1)*dp(2)*pp(1)=4 != world size 8: set [parallel] degrees whose product is "
            "the number of ranks, or dp = -1");
  // Every problem at once: the batch does not split over dp(3) either.
  EXPECT_EQ(layout_error({"parallel.tp=2", "parallel.dp=3"}, 8),
            "tp(2)*cp(1)*dp(3)*pp(1)=6 != world size 8: set [parallel] degrees whose product is "
            "the number of ranks, or dp = -1\ntrain.global_batch_size=8 is not divisible by "
            "dp(3)*train.micro_batch_size(2)=6: each dp rank runs a whole number of micro-batches");
  EXPECT_EQ(layout_error({"parallel.tp=4"}, 6),
            "parallel.dp=-1: world size 6 is not divisible by tp(4)*cp(1)*pp(1)=4");
}

TEST(Layout, FewestRanksOfALayout) {
  const auto ranks = [](const std::vector<std::string>& sets) {
    return layout_min_ranks(parse_config_string(kBase, "base.toml", sets).parallel);
  };
  EXPECT_EQ(ranks({}), 1);
  EXPECT_EQ(ranks({"parallel.tp=2"}), 2);  // dp = -1 counted as 1
  EXPECT_EQ(ranks({"parallel.tp=2", "parallel.dp=2"}), 4);
  EXPECT_EQ(ranks({"parallel.tp=2", "parallel.pp=2", "parallel.cp=2", "parallel.dp=3"}), 24);
}

TEST(Layout, InterleavedNeedsMicroBatchesDivisibleByPp) {
  // 8 / (dp 1 * 2) = 4 micro-batches: fine for pp 2 and 4, not for pp 4 with dp 2 (m = 2).
  const std::vector<std::string> il{"parallel.pp_schedule=interleaved", "parallel.virtual_stages=2",
                                    "model.n_layers=8"};
  auto with = [&](std::vector<std::string> more) { return joined(std::move(more), il); };
  EXPECT_EQ(layout_error(with({"parallel.pp=4"}), 4), "");
  EXPECT_EQ(layout_error(with({"parallel.pp=4"}), 8),
            "parallel.pp_schedule=\"interleaved\" needs the micro-batches per step, "
            "train.global_batch_size(8)/(dp(2)*train.micro_batch_size(2))=2, to be divisible by "
            "parallel.pp=4");
}

TEST(Layout, DualPipeVNeedsTwicePpMinusOneMicroBatches) {
  // 8 / (dp 1 * 2) = 4 micro-batches: enough for pp 2 (3), not for pp 4 (7) or for pp 2 x dp 2.
  const std::vector<std::string> dpv{"parallel.pp_schedule=dualpipev", "parallel.virtual_stages=2",
                                     "model.n_layers=8"};
  auto with = [&](std::vector<std::string> more) { return joined(std::move(more), dpv); };
  EXPECT_EQ(layout_error(with({"parallel.pp=2"}), 2), "");
  EXPECT_EQ(layout_error(with({"parallel.pp=4"}), 4),
            "parallel.pp_schedule=\"dualpipev\" needs at least 2*pp-1=7 micro-batches per step, "
            "train.global_batch_size(8)/(dp(1)*train.micro_batch_size(2))=4: raise the batch, "
            "lower the micro-batch size, or use \"zb-v\"");
  EXPECT_NE(layout_error(with({"parallel.pp=2"}), 4), "");
  EXPECT_EQ(layout_error(with({"parallel.pp=4", "train.micro_batch_size=1"}), 4), "");
  // ZeRO-3 only where no backward splits (pp_max_deferred = 0); the cap needs DualPipeV.
  const std::vector<std::string> z3{"parallel.pp=2", "parallel.zero_stage=3",
                                    "train.micro_batch_size=1"};
  EXPECT_NE(layout_error(with(z3), 4).find("(or parallel.pp_max_deferred = 0: no backward split)"),
            std::string::npos)
      << layout_error(with(z3), 4);
  std::vector<std::string> whole = z3;
  whole.push_back("parallel.pp_max_deferred=0");
  EXPECT_EQ(layout_error(with(whole), 4), "");
  EXPECT_EQ(layout_error({"parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2",
                          "model.n_layers=8", "parallel.pp_max_deferred=1"},
                         2),
            "");
  EXPECT_NE(
      layout_error({"parallel.pp=2", "parallel.pp_schedule=interleaved",
                    "parallel.virtual_stages=2", "model.n_layers=8", "parallel.pp_max_deferred=1"},
                   2)
          .find("parallel.pp_max_deferred=1 bounds the weight halves a zero-bubble schedule "
                "defers: it needs parallel.pp_schedule=\"zb-h1\", \"zb-v\" or "
                "\"dualpipev\", found \"interleaved\""),
      std::string::npos);
}

TEST(Layout, ExpertParallelDividesTheDpCpGroup) {
  // ep groups are ep consecutive ranks of the dp x cp group: dp 2 x cp 2 takes ep 4.
  const std::vector<std::string> moe{"model.moe.num_experts=4", "model.moe.d_ff_expert=16"};
  auto with = [&](std::vector<std::string> more) { return joined(std::move(more), moe); };
  EXPECT_EQ(layout_error(with({"parallel.ep=2"}), 4), "");
  EXPECT_EQ(layout_error(with({"parallel.ep=4", "parallel.cp=2"}), 4), "");
  EXPECT_EQ(layout_error(with({"parallel.ep=2", "parallel.cp=2"}), 2), "");
  EXPECT_EQ(layout_error(with({"parallel.ep=4", "parallel.cp=2"}), 2),
            "parallel.ep=4 does not divide dp(1)*cp(2): each group of ep consecutive ranks of the "
            "dp x cp group shares out the experts");
  EXPECT_EQ(layout_error(with({"parallel.ep=4"}), 2),
            "parallel.ep=4 does not divide dp(2): each group of ep consecutive ranks of the dp "
            "group shares out the experts");
}

TEST(Layout, ZeroShardGroupDividesDpAndHoldsTheEpGroups) {
  const std::vector<std::string> moe{"model.moe.num_experts=4", "model.moe.d_ff_expert=16",
                                     "parallel.zero_stage=1", "train.global_batch_size=16"};
  auto with = [&](std::vector<std::string> more) { return joined(std::move(more), moe); };
  EXPECT_EQ(layout_error(with({"parallel.zero_shard_group=2"}), 4), "");
  EXPECT_EQ(layout_error(with({"parallel.zero_shard_group=4"}), 4), "");  // one replica
  EXPECT_EQ(layout_error(with({"parallel.zero_shard_group=3"}), 4),
            "parallel.zero_shard_group=3 does not divide dp(4): ZeRO shards within groups of "
            "that many consecutive dp ranks and replicates across dp/zero_shard_group of them");
  // ep 2 inside shard groups of 2 dp ranks, or of 1 dp rank x cp 2; not inside 1 dp rank.
  EXPECT_EQ(layout_error(with({"parallel.zero_shard_group=2", "parallel.ep=2"}), 4), "");
  EXPECT_EQ(
      layout_error(with({"parallel.zero_shard_group=1", "parallel.ep=2", "parallel.cp=2"}), 4), "");
  EXPECT_EQ(layout_error(with({"parallel.zero_shard_group=1", "parallel.ep=2"}), 4),
            "parallel.ep=2 does not divide parallel.zero_shard_group(1): each shard group must "
            "hold every expert, so its ep groups must lie inside it");
}

TEST(Layout, HierarchicalPartitionDividesDp) {
  const std::vector<std::string> z3{"parallel.zero_stage=3", "train.global_batch_size=16"};
  auto with = [&](std::vector<std::string> more) { return joined(std::move(more), z3); };
  EXPECT_EQ(layout_error(with({"parallel.zero_hierarchical_partition=2"}), 4), "");
  EXPECT_EQ(layout_error(with({"parallel.zero_hierarchical_partition=3"}), 4),
            "parallel.zero_hierarchical_partition=3 does not divide dp(4): the secondary copy is "
            "sharded within groups of that many consecutive dp ranks");
}

TEST(Layout, QuantisedGradientsGroupDividesDp) {
  const std::vector<std::string> qg{"parallel.zero_stage=3",
                                    "parallel.zero_quantized_gradients=true",
                                    "train.global_batch_size=16"};
  auto with = [&](std::vector<std::string> more) { return joined(std::move(more), qg); };
  EXPECT_EQ(layout_error(with({"parallel.zero_quantized_gradients_group=2"}), 4), "");
  EXPECT_EQ(layout_error(with({"parallel.zero_quantized_gradients_group=3"}), 4),
            "parallel.zero_quantized_gradients_group=3 does not divide dp(4): qgZ's first hop "
            "runs within groups of that many consecutive dp ranks");
  EXPECT_EQ(layout_error(with({"parallel.zero_quantized_gradients_group=1", "parallel.ep=2",
                               "model.moe.num_experts=4", "model.moe.d_ff_expert=16"}),
                         4),
            "parallel.ep=2 does not divide parallel.zero_quantized_gradients_group(1): each "
            "first-hop group must hold every expert");
}

TEST(Layout, DpRestAndBatch) {
  EXPECT_EQ(layout_error({"parallel.tp=2"}, 8), "");  // dp = 4, 8 % (4*2) == 0
  const Config c = parse_config_string(kBase, "base.toml", {"parallel.tp=2"});
  EXPECT_EQ(mesh_shape(c.parallel, 8).size(Axis::dp), 4);
  EXPECT_EQ(layout_error({}, 8),
            "train.global_batch_size=8 is not divisible by dp(8)*train.micro_batch_size(2)=16: "
            "each dp rank runs a whole number of micro-batches");
}

TEST(Layout, ParseTimeRules) {
  auto parse_error = [](const std::vector<std::string>& sets) -> std::string {
    try {
      parse_config_string(kBase, "base.toml", sets);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(
      parse_error({"parallel.tp=8"}).find("model.n_heads=4 is not divisible by parallel.tp=8"),
      std::string::npos);
  EXPECT_NE(
      parse_error({"parallel.tp=3"}).find("model.vocab_size=256 is not divisible by parallel.tp=3"),
      std::string::npos);
  EXPECT_NE(parse_error({"parallel.tp=2", "parallel.sequence_parallel=true", "model.seq_len=33"})
                .find("model.seq_len=33 is not divisible by parallel.tp=2 with "
                      "parallel.sequence_parallel=true"),
            std::string::npos);
  // Context parallelism: seq_len 32 splits into 2cp chunks at cp 2 and 4, not at cp 3; Ulysses
  // needs the heads divisible by cp; hybrid needs cp_ulysses.
  EXPECT_EQ(parse_error({"parallel.cp=2"}), "");
  EXPECT_EQ(parse_error({"parallel.cp=4", "parallel.cp_impl=hybrid", "parallel.cp_ulysses=2"}), "");
  EXPECT_NE(parse_error({"parallel.cp=3"})
                .find("model.seq_len=32 is not divisible by "
                      "2*parallel.cp=6"),
            std::string::npos);
  EXPECT_NE(parse_error({"parallel.cp=8", "parallel.cp_impl=ulysses", "model.seq_len=64"})
                .find("heads per tp rank, not divisible by parallel.cp=8"),
            std::string::npos);
  EXPECT_NE(parse_error({"parallel.cp=4", "parallel.cp_impl=hybrid"})
                .find("needs parallel.cp_ulysses = u with 1 < u < parallel.cp=4"),
            std::string::npos);
  // pp > 1 trains (engine/pipeline/executor.h); zb-h1's split backward does not run with ZeRO-3.
  EXPECT_EQ(parse_error({"parallel.pp=2"}), "");
  EXPECT_EQ(parse_error({"parallel.pp=2", "parallel.pp_schedule=zb-h1", "parallel.zero_stage=2"}),
            "");
  EXPECT_NE(parse_error({"parallel.pp=2", "parallel.pp_schedule=zb-h1", "parallel.zero_stage=3"})
                .find("parallel.pp_schedule=\"zb-h1\" with parallel.zero_stage=3: ZeRO-3 gathers"),
            std::string::npos);
  EXPECT_NE(parse_error({"parallel.pp=4"})
                .find("model.n_layers=2 does not split evenly into pp(4)*virtual_stages(1)=4"),
            std::string::npos);
  EXPECT_NE(parse_error({"parallel.zero_stage=4"})
                .find("parallel.zero_stage=4 must be 0 (DDP), 1, 2 or 3"),
            std::string::npos);
  EXPECT_NE(parse_error({"parallel.dp=0"}).find("parallel.dp=0 must be >= 1, or -1"),
            std::string::npos);
}

TEST(Layout, RankMap) {
  const std::string map = rank_map(shape(2, 1, 2, 2));
  EXPECT_NE(map.find("     5    1  0  0  1\n"), std::string::npos) << map;
  EXPECT_NE(map.find("     7    1  0  1  1\n"), std::string::npos) << map;
}

}  // namespace
}  // namespace llmt
