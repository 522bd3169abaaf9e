// Runs never overwrite each other (train/run_guard.h): real two-step trainings of a tiny model
// in fresh temporary directories, started over, resumed, restarted and fine-tuned
// (checkpoint.init_from) in the ways a user does, and the shipped configs' directories; and the
// warning of a step that would outlast the time limit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "train/config.h"
#include "train/run_guard.h"
#include "train/trainer.h"

namespace llmt {
namespace {

namespace fs = std::filesystem;

class RunGuard : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "llmt_run_guard.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tiny GPT-2 (or Llama) trained `steps` steps into run_dir RUN and checkpoint.dir CK (under
  // the test's directory), checkpoints every step, with more --set style overrides.
  TrainResult run(const std::string& run, const std::string& ck, int steps,
                  std::vector<std::string> sets = {}, bool overwrite = false) {
    const std::string toml =
        "[model]\narch = \"gpt2\"\nvocab_size = 64\nn_layers = 1\nd_model = 16\nn_heads = 2\n"
        "seq_len = 8\n[train]\nglobal_batch_size = 2\n[optimizer]\nwarmup_steps = 1\n"
        "[data]\nsource = \"synthetic\"\n[log]\nprogress = false\n[checkpoint]\ninterval = 1\n"
        "keep_last = 5\n";
    sets.push_back("train.steps=" + std::to_string(steps));
    sets.push_back("train.run_dir=\"" + (dir_ / run).string() + "\"");
    sets.push_back("checkpoint.dir=\"" + (dir_ / ck).string() + "\"");
    const Config cfg = parse_config_string(toml, "guard.toml", sets);
    TrainOptions opts;
    opts.quiet = true;
    opts.overwrite = overwrite;
    return train(cfg, opts);
  }
  std::string refusal(const std::string& run_name, const std::string& ck, int steps,
                      std::vector<std::string> sets = {}, bool overwrite = false) {
    try {
      run(run_name, ck, steps, std::move(sets), overwrite);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  int64_t metric_lines(const std::string& run) {
    std::ifstream in(dir_ / run / "metrics.jsonl");
    int64_t n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }
  std::set<std::string> entries(const std::string& ck) {
    std::set<std::string> s;
    for (const auto& e : fs::directory_iterator(dir_ / ck))
      if (e.path().filename().string()[0] != '.') s.insert(e.path().filename().string());
    return s;
  }

  fs::path dir_;
};

TEST_F(RunGuard, FreshRunRecordsItsConfig) {
  run("run", "ck", 2);
  ASSERT_TRUE(fs::exists(dir_ / "run" / kRunConfigFile));
  std::ifstream in(dir_ / "run" / kRunConfigFile);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("d_model = 16"), std::string::npos);
  EXPECT_EQ(metric_lines("run"), 2);
}

TEST_F(RunGuard, StartingOverAnEarlierRunIsRefusedAndTouchesNothing) {
  run("run", "ck", 3);
  const auto before = entries("ck");
  const std::string e = refusal("run", "ck", 2, {"model.d_model=32"});
  ASSERT_FALSE(e.empty()) << "a second fresh run into the same directories was not refused";
  for (const char* part : {"metrics.jsonl (3 steps)",
                           "3 checkpoints (step_00000001 ... "
                           "step_00000003)",
                           "d_model 16", "d_model 32",
                           "checkpoint.load = "
                           "\"latest\"",
                           "--overwrite", "train.run_dir="})
    EXPECT_NE(e.find(part), std::string::npos) << "missing \"" << part << "\" in: " << e;
  EXPECT_EQ(metric_lines("run"), 3);
  EXPECT_EQ(entries("ck"), before);
  // The same config again is refused too: it would still overwrite the run.
  EXPECT_FALSE(refusal("run", "ck", 3).empty());
  // Only checkpoints, with the metrics elsewhere, are enough to refuse.
  EXPECT_FALSE(refusal("other_run", "ck", 2).empty());
}

TEST_F(RunGuard, OverwriteStartsOverDeletingTheEarlierCheckpoints) {
  run("run", "ck", 3);
  const TrainResult r = run("run", "ck", 2, {"model.d_model=32"}, /*overwrite=*/true);
  EXPECT_EQ(r.steps, 2);
  EXPECT_EQ(metric_lines("run"), 2);
  EXPECT_EQ(entries("ck"), (std::set<std::string>{"latest", "step_00000001", "step_00000002"}));
  // Starting over and resuming at once is a contradiction.
  const std::string e = refusal("run", "ck", 4, {"checkpoint.load=\"latest\""}, true);
  EXPECT_NE(e.find("--overwrite"), std::string::npos) << e;
}

TEST_F(RunGuard, ResumingTheSameModelContinuesItsMetrics) {
  run("run", "ck", 2);
  const TrainResult r = run("run", "ck", 4, {"checkpoint.load=\"latest\""});
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(metric_lines("run"), 4);
  // The data may change when resuming (training on).
  EXPECT_EQ(run("run", "ck", 5, {"checkpoint.load=\"latest\"", "data.seed=9"}).steps, 5);
}

TEST_F(RunGuard, ResumingWithAnotherModelNamesTheDifferences) {
  run("run", "ck", 2);
  const std::string e =
      refusal("run", "ck", 4, {"checkpoint.load=\"latest\"", "model.dropout=0.1"});
  EXPECT_NE(e.find("model.dropout 0.0 -> 0.1"), std::string::npos) << e;
}

TEST_F(RunGuard, ResumingIntoTheRunDirOfAnotherRunIsRefused) {
  run("a", "a_ck", 2);
  run("b", "b_ck", 2);
  const std::string e = refusal("a", "b_ck", 4, {"checkpoint.load=\"latest\""});
  EXPECT_NE(e.find("would truncate those metrics"), std::string::npos) << e;
  EXPECT_EQ(metric_lines("a"), 2);
}

TEST_F(RunGuard, AStepLongerThanTheTimeLimitIsSaidBeforeItEnds) {
  // Stop requests and the time limit act between steps: a step of many micro-batches that would
  // outlast train.time_limit is said after its first micro-batch, with the numbers.
  ::testing::internal::CaptureStderr();
  run("long", "long_ck", 1, {"train.global_batch_size=8", "train.micro_batch_size=1",
                             "train.time_limit=0.000001", "checkpoint.interval=0"});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: step 1 will take about"), std::string::npos) << err;
  EXPECT_NE(err.find("8 micro-batches of"), std::string::npos) << err;
  EXPECT_NE(err.find("longer than train.time_limit=1e-06 s"), std::string::npos) << err;
  // Without a time limit, a step of a few milliseconds says nothing.
  ::testing::internal::CaptureStderr();
  run("short", "short_ck", 1, {"train.global_batch_size=8", "train.micro_batch_size=1"});
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("will take about"), std::string::npos);
}

TEST_F(RunGuard, ARunDirectoryCopiedWholeResumes) {
  // Its checkpoints under it: copied elsewhere (another file system, another machine), the copy
  // resumes from its own checkpoints and continues its own metrics; the original is untouched.
  run("a", "a/checkpoints", 2);
  fs::copy(dir_ / "a", dir_ / "b", fs::copy_options::recursive);
  EXPECT_EQ(run("b", "b/checkpoints", 4, {"checkpoint.load=\"latest\""}).steps, 4);
  EXPECT_EQ(metric_lines("b"), 4);
  EXPECT_EQ(metric_lines("a"), 2);
  // Not the checkpoints of the original from the copy's run_dir.
  const std::string e = refusal("b", "a/checkpoints", 5, {"checkpoint.load=\"latest\""});
  EXPECT_NE(e.find("would truncate those metrics"), std::string::npos) << e;
}

TEST_F(RunGuard, AutoRestartsTheSameRunButNotAnother) {
  // A job that ended before its first checkpoint: metrics, no checkpoint.
  run("run", "ck", 2);
  fs::remove_all(dir_ / "ck");
  EXPECT_EQ(run("run", "ck", 2, {"checkpoint.load=\"auto\""}).steps, 2);
  fs::remove_all(dir_ / "ck");
  const std::string e = refusal("run", "ck", 2, {"checkpoint.load=\"auto\"", "data.seed=9"});
  EXPECT_NE(e.find("data.seed 1234 -> 9"), std::string::npos) << e;
}

TEST_F(RunGuard, PastTheLastStepIsRefusedAndPointsToFineTuning) {
  run("run", "ck", 4);
  const std::string e = refusal("run", "ck", 2, {"checkpoint.load=\"latest\""});
  for (const char* part : {"is at step 4, past train.steps=2: nothing to train", "init_from"})
    EXPECT_NE(e.find(part), std::string::npos) << "missing \"" << part << "\" in: " << e;
  // At exactly its step there is nothing left: a requeued job that had finished exits 0.
  EXPECT_EQ(run("run", "ck", 4, {"checkpoint.load=\"latest\""}).steps, 0);  // none trained
}

TEST_F(RunGuard, InitFromStartsFreshFromTheWeights) {
  const TrainResult fresh = run("base", "base_ck", 4);
  const std::string ck = (dir_ / "base_ck").string();
  // Dropout may change; the first loss is the trained model's, below the fresh run's first.
  run("tune", "tune_ck", 2, {"checkpoint.init_from=\"" + ck + "\"", "model.dropout=0.1"});
  std::ifstream tuned(dir_ / "tune" / "metrics.jsonl"), base(dir_ / "base" / "metrics.jsonl");
  std::string t1, b1;
  std::getline(tuned, t1);
  std::getline(base, b1);
  auto field = [](const std::string& line, const std::string& key) {
    return std::stod(line.substr(line.find("\"" + key + "\": ") + key.size() + 4));
  };
  EXPECT_EQ(field(t1, "step"), 1);
  EXPECT_EQ(field(t1, "lr"), field(b1, "lr"));  // a fresh schedule
  EXPECT_LT(field(t1, "loss"), field(b1, "loss"));
  EXPECT_GT(fresh.final_loss, 0);
  // Another model: every differing key named, nothing allocated.
  const std::string e =
      refusal("other", "other_ck", 2, {"checkpoint.init_from=\"" + ck + "\"", "model.d_model=32"});
  EXPECT_NE(e.find("model.d_model 16 -> 32"), std::string::npos) << e;
  EXPECT_NE(refusal("missing", "missing_ck", 2, {"checkpoint.init_from=\"/nonexistent\""})
                .find("checkpoint.init_from=\"/nonexistent\": checkpoint directory /nonexistent "
                      "does not exist"),
            std::string::npos);
  // A fine-tuning job requeued after its own checkpoint resumes that, not the base weights.
  const TrainResult again =
      run("tune", "tune_ck", 3,
          {"checkpoint.init_from=\"" + ck + "\"", "model.dropout=0.1", "checkpoint.load=\"auto\""});
  EXPECT_EQ(again.steps, 3);
  std::ifstream after(dir_ / "tune" / "metrics.jsonl");
  std::string first_after;
  std::getline(after, first_after);
  EXPECT_EQ(first_after, t1);  // steps 1-2 kept: it resumed at step 2
}

TEST_F(RunGuard, IdentityIsTheModelAndDataSections) {
  const Config a = parse_config_string("[model]\nd_model = 16\nn_heads = 2\n", "a.toml");
  Config b = a;
  b.train.steps = 7;
  b.parallel.zero_stage = 1;
  EXPECT_EQ(run_identity(to_toml(a), true), run_identity(to_toml(b), true));
  b.data.seed = 5;
  EXPECT_EQ(run_identity(to_toml(a), false), run_identity(to_toml(b), false));
  EXPECT_NE(run_identity(to_toml(a), true), run_identity(to_toml(b), true));
  EXPECT_NE(run_identity(to_toml(a), false).find("model.moe.top_k = "), std::string::npos);
}

// Each shipped config writes its own run_dir and checkpoint.dir, so following the docs with one
// never overwrites another's run; a config that names no run_dir gets runs/<its stem>.
TEST(ShippedConfigs, EachHasItsOwnDirectories) {
  std::vector<fs::path> files;
  for (const char* sub : {"configs", "configs/papers"})
    for (const auto& e : fs::directory_iterator(fs::path(LLMT_SOURCE_DIR) / sub))
      if (e.path().extension() == ".toml") files.push_back(e.path());
  ASSERT_GT(files.size(), 10u);
  std::set<std::string> dirs;
  for (const fs::path& f : files) {
    const Config c = parse_config(f.string(), {"data.source=\"synthetic\""});
    EXPECT_TRUE(dirs.insert(c.train.run_dir).second) << f << " shares run_dir " << c.train.run_dir;
    if (!c.checkpoint.dir.empty()) {
      EXPECT_TRUE(dirs.insert(c.checkpoint.dir).second)
          << f << " shares checkpoint.dir " << c.checkpoint.dir;
    }
  }
  const Config p =
      parse_config((fs::path(LLMT_SOURCE_DIR) / "configs/papers/llama3-8b.toml").string(),
                   {"data.source=\"synthetic\""});
  EXPECT_EQ(p.train.run_dir, "runs/llama3-8b");
}

}  // namespace
}  // namespace llmt
