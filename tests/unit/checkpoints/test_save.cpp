// Saving and loading the state a TrainingState lists, on one rank (checkpoints/checkpoint.h),
// with no model and no OpenMP, so that it also runs under ThreadSanitizer (scripts/test.sh): a
// background save snapshots the tensors, training may overwrite them at once, and the thread
// writes the snapshot; the checkpoint then holds the values at the save, every state the state
// lists (here an optimizer with one state, "momentum"), and loads back bitwise.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "checkpoints/checkpoint.h"
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

INSTANTIATE_TEST_SUITE_P(Background, SaveTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "async" : "sync"; });

}  // namespace
}  // namespace llmt::ckpt
