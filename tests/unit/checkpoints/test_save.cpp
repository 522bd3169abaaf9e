// Saving and loading the state a TrainingState lists, on one rank (checkpoints/checkpoint.h),
// with no model and no OpenMP, so that it also runs under ThreadSanitizer (scripts/test.sh): a
// background save snapshots the tensors, training may overwrite them at once, and the thread
// writes the snapshot; the checkpoint then holds the values at the save, every state the state
// lists (here an optimizer with one state, "momentum"), and loads back bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "checkpoints/checkpoint.h"
#include "checkpoints/h5.h"
#include "engine/comm/communicator.h"
#include "tests/unit/tiny_model.h"

namespace llmt::ckpt {
namespace {

namespace fs = std::filesystem;

// Every parameter whole (one rank), master weights and one optimizer state, on the host.
class FakeState final : public TrainingState {
 public:
  explicit FakeState(const ModelSpec& spec) {
    for (size_t i = 0; i < spec.params.size(); ++i)
      for (const char* s : {kMasterState, "momentum"}) {
        storage_.emplace_back(static_cast<size_t>(spec.params[i].shape.numel()));
        tensors_.push_back(
            {s, i, Tensor(storage_.back().data(), spec.params[i].shape, DType::f32), 0});
      }
  }
  std::vector<std::string> state_names() const override { return {kMasterState, "momentum"}; }
  std::vector<StateTensor> state_tensors() override { return tensors_; }
  void after_load() override { ++loads; }
  // Element k of tensor t = base + t * 1000 + k (exact in f32 for these sizes).
  void fill(float base) {
    for (size_t t = 0; t < storage_.size(); ++t)
      for (size_t k = 0; k < storage_[t].size(); ++k)
        storage_[t][k] = base + static_cast<float>(t * 1000 + k);
  }
  const std::vector<std::vector<float>>& storage() const { return storage_; }
  int loads = 0;

 private:
  std::vector<std::vector<float>> storage_;
  std::vector<StateTensor> tensors_;
};

struct SaveTest : ::testing::TestWithParam<bool> {
  SaveTest()
      : spec(ModelSpec::from_config(test::tiny_model(Arch::llama, {}))),
        mesh(Mesh::create(MeshShape{}, make_local_communicator())),
        backend(make_cpu_backend()),
        dir((fs::temp_directory_path() /
             ("llmt_test_save_" + std::to_string(::getpid()) + (GetParam() ? "_async" : "_sync")))
                .string()) {
    fs::remove_all(dir);
    cfg.dir = dir;
    run.step = 7;
    run.mesh = MeshShape{};
  }
  ~SaveTest() override { fs::remove_all(dir); }
  ModelSpec spec;
  Mesh mesh;
  std::unique_ptr<DeviceBackend> backend;
  std::string dir;
  CheckpointConfig cfg;
  RunState run;
};

TEST_P(SaveTest, HoldsTheValuesAtTheSaveAndLoadsThemBack) {
  const bool background = GetParam();
  FakeState state(spec);
  state.fill(0.5f);
  const std::vector<std::vector<float>> at_save = state.storage();
  {
    PendingSave save(cfg, run, spec, spec, state, mesh, *backend, background);
    state.fill(-3.0f);  // the next step's update, while the writer thread runs
    // poll(false) only asks; the writer finishes on its own thread. A minute is far beyond a
    // few-kilobyte write, so a writer that never finishes fails here instead of hanging ctest.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!save.poll(false)) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the save did not finish in 60 s";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(save.result().path, (fs::path(dir) / "step_00000007").string());
  }
  Checkpoint ckpt(resolve_checkpoint_dir(dir));
  EXPECT_EQ(ckpt.states(), (std::vector<std::string>{"param", "momentum"}));
  EXPECT_NO_THROW(check_model(ckpt, spec, state.state_names()));
  EXPECT_TRUE(ckpt.verify().empty());
  FakeState back(spec);
  back.fill(99.0f);
  load(ckpt, spec, back, *backend);
  EXPECT_EQ(back.loads, 1);
  EXPECT_EQ(back.storage(), at_save);
  // A run whose optimizer keeps other states is refused, naming both lists.
  try {
    check_model(ckpt, spec, {kMasterState, "exp_avg", "exp_avg_sq"});
    ADD_FAILURE() << "no error for other optimizer states";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer/momentum/: the checkpoint stores the state "
                                         "\"momentum\", which this run does not keep"),
              std::string::npos)
        << e.what();
  }
}

// Boxes over the read bound are checked in pieces of whole rows and read part by part: verify,
// read and load give what a whole read gives, and a value changed in a rank file (its checksum
// left as it was; the manifest deleted, so the file is parsed unchecked) is still found.
TEST_P(SaveTest, ChecksBoxesOverTheReadBoundInPieces) {
  FakeState state(spec);
  state.fill(0.25f);
  {
    PendingSave save(cfg, run, spec, spec, state, mesh, *backend, GetParam());
    save.poll(true);
  }
  const std::string step_dir = resolve_checkpoint_dir(dir);
  Checkpoint whole(step_dir);
  // The largest tensor's row, so that every box larger than one row is read in pieces.
  int64_t row_bytes = 0;
  for (const IndexTensor& t : whole.tensors())
    if (t.shape.size() == 2) row_bytes = std::max(row_bytes, t.shape[1] * 4);
  ASSERT_GT(row_bytes, 0);
  for (const int64_t bound : {int64_t{1}, row_bytes, 3 * row_bytes}) {
    Checkpoint pieces(step_dir);
    pieces.set_read_bound(bound);
    EXPECT_TRUE(pieces.verify().empty()) << "bound " << bound;
    FakeState back(spec);
    back.fill(99.0f);
    load(pieces, spec, back, *backend);
    EXPECT_EQ(back.storage(), state.storage()) << "bound " << bound;
  }
  // One value of the largest 2-D box changed in place, its checksum attribute untouched.
  fs::remove(fs::path(step_dir) / kManifestFile);
  std::string target;
  for (const IndexTensor& t : whole.tensors())
    if (t.shape.size() == 2 && t.shape[1] * 4 == row_bytes) target = t.mappings[0].dataset;
  {
    h5::Id f = h5::open_file((fs::path(step_dir) / rank_file_name(0)).string(), true);
    h5::Id d = h5::open_dataset(f.get(), target, "test");
    h5::Id fspace = h5::checked(H5Dget_space(d.get()), H5Sclose, "test");
    const std::vector<int64_t> dims = h5::dataset_dims(d.get());
    h5::select(fspace.get(), {dims[0] - 1, dims[1] - 1}, {1, 1});
    h5::Id mem = h5::simple_space({1, 1});
    const float v = 12345.0f;
    h5::check(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, mem.get(), fspace.get(), H5P_DEFAULT, &v),
              "test write");
  }
  for (const int64_t bound : {int64_t{1}, Checkpoint::kReadBound}) {
    Checkpoint changed(step_dir);
    changed.set_read_bound(bound);
    const std::vector<std::string> errors = changed.verify();
    ASSERT_EQ(errors.size(), 1u) << "bound " << bound;
    EXPECT_NE(errors[0].find("do not match the box's checksum"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find(target), std::string::npos) << errors[0];
  }
}

INSTANTIATE_TEST_SUITE_P(Background, SaveTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "async" : "sync"; });

}  // namespace
}  // namespace llmt::ckpt
