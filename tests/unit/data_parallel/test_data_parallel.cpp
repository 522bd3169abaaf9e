// DDP's bucket layout (no MPI): buckets cover the flat gradient buffer exactly, back to front, cut
// at parameter boundaries, and each becomes ready at the lowest block it covers.
#include <gtest/gtest.h>

#include "engine/data_parallel/data_parallel.h"
#include "train/config.h"

namespace llmt {
namespace {

const char* kTiny = R"(
[model]
vocab_size = 256
n_layers = 3
d_model = 64
n_heads = 4
seq_len = 32
)";

struct Fixture {
  Config cfg = parse_config_string(kTiny, "tiny.toml");
  ModelSpec spec = ModelSpec::from_config(cfg.model);
  std::unique_ptr<DeviceBackend> backend = make_cpu_backend();
  Allocator alloc{*backend};
  Transformer model{spec, alloc, 1, DType::f32};
};

// Offsets of the parameters in the flat buffer.
std::vector<int64_t> offsets(const ModelSpec& spec) {
  std::vector<int64_t> off{0};
  for (const auto& p : spec.params) off.push_back(off.back() + p.shape.numel());
  return off;
}

TEST(Buckets, OneParameterEach) {
  Fixture f;
  const auto buckets = make_buckets(f.model, 1);
  const auto off = offsets(f.spec);
  ASSERT_EQ(buckets.size(), f.spec.params.size());
  for (size_t k = 0; k < buckets.size(); ++k) {
    const size_t i = f.spec.params.size() - 1 - k;  // back to front
    EXPECT_EQ(buckets[k].begin, off[i]);
    EXPECT_EQ(buckets[k].end, off[i + 1]);
  }
  EXPECT_EQ(buckets.front().ready_block, f.model.num_blocks() - 1);  // norm_f.bias: final block
  EXPECT_EQ(buckets.back().ready_block, 0);                          // wte: embeddings
}

TEST(Buckets, OneBucket) {
  Fixture f;
  const auto buckets = make_buckets(f.model, int64_t{1} << 40);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].begin, 0);
  EXPECT_EQ(buckets[0].end, f.spec.num_params());
  EXPECT_EQ(buckets[0].ready_block, 0);
}

TEST(Buckets, LayerSizedCoverExactly) {
  Fixture f;
  const auto [first, last] = f.model.block_params(1);
  const auto off = offsets(f.spec);
  const int64_t layer_bytes = (off[last] - off[first]) * 4;
  const auto buckets = make_buckets(f.model, layer_bytes);
  int64_t end = f.spec.num_params();
  int ready = f.model.num_blocks();
  for (const auto& b : buckets) {
    EXPECT_EQ(b.end, end);  // contiguous, back to front
    EXPECT_LT(b.begin, b.end);
    EXPECT_NE(std::find(off.begin(), off.end(), b.begin), off.end());  // at a parameter boundary
    EXPECT_GE(b.end - b.begin, b.begin == 0 ? 1 : layer_bytes / 4);    // full unless the last
    EXPECT_LE(b.ready_block, ready);                                   // ready in backward order
    ready = b.ready_block;
    end = b.begin;
  }
  EXPECT_EQ(end, 0);
  // 3 layers of 49,984 + head/norm_f and embeddings: at least 4 buckets.
  EXPECT_GE(buckets.size(), 4u);
}

}  // namespace
}  // namespace llmt
