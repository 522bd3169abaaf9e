// The step's metrics record (train/metrics.h) and metrics.jsonl's line made from it: every field,
// nested objects, optional fields, an axis that moved nothing, and TensorBoard's tags as the same
// names. tests/e2e/check_tensorboard.py checks a real run's two outputs against each other.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "train/metrics.h"

namespace llmt {
namespace {

StepMetrics full_step() {
  StepMetrics m;
  m.step = 3;
  m.steps = 10;
  m.loss = 2.5;
  m.val_loss = 2.25;
  m.lr = 1e-3;
  m.grad_norm = 0.5;
  m.tokens_per_s = 1000;
  m.mfu = 0.125;
  m.step_time_s = 0.25;
  m.loss_scale = 65536;
  m.skipped = true;
  m.data_wait_s = 0.5;
  m.checkpoint_s = 1.5;
  m.mem.peak = {1, 2, 3, 4, 5, 6};
  m.mem.peak_total = 21;
  CommCounters dp, tp;
  dp.bytes[static_cast<int>(CommKind::all_reduce)] = 100;
  dp.calls[static_cast<int>(CommKind::all_reduce)] = 2;
  dp.bytes[static_cast<int>(CommKind::all_gather)] = 0;  // called, nothing moved: still listed
  dp.calls[static_cast<int>(CommKind::all_gather)] = 1;
  m.comm = {{"dp", dp}, {"tp", tp}};
  m.comm_wait_s = 0.125;
  m.pp_bubble = 0.2;
  m.pp_bubble_predicted = 0.25;
  m.moe = StepMetrics::Moe{0.01, 0.001, 0.5, 0.125, 0, 7};
  return m;
}

// The line MetricsWriter writes for `m`, through a file of the running test's own (ctest -j runs
// the tests of this program side by side, as processes).
std::string written_line(const StepMetrics& m) {
  const std::string path = ::testing::TempDir() + "/metrics_line_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                           ".jsonl";
  std::filesystem::remove(path);
  MetricsWriter(path).write(m);
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(Metrics, JsonLineOfEveryField) {
  EXPECT_EQ(written_line(full_step()),
            "{\"step\": 3, \"loss\": 2.5, \"val_loss\": 2.25, \"lr\": 0.001, \"grad_norm\": 0.5, "
            "\"tokens_per_s\": 1000, \"mfu\": 0.125, \"step_time_s\": 0.25, \"loss_scale\": 65536, "
            "\"skipped\": true, \"data_wait_s\": 0.5, \"checkpoint_s\": 1.5, \"peak_bytes\": "
            "{\"params\": 1, \"grads\": 2, \"optimizer\": 3, \"activations\": 4, \"comm\": 5, "
            "\"other\": 6, \"total\": 21}, \"comm_bytes\": {\"dp\": {\"all_reduce\": 100, "
            "\"all_gather\": 0}, \"tp\": {}}, \"comm_wait_s\": 0.125, \"pp_bubble\": 0.2, "
            "\"pp_bubble_predicted\": 0.25, \"moe_aux\": 0.01, \"moe_z\": 0.001, "
            "\"moe_load_max\": 0.5, \"moe_load_min\": 0.125, \"moe_dropped\": 0, "
            "\"moe_ep_rows\": 7}");
}

TEST(Metrics, JsonLineOfAPlainStep) {
  StepMetrics m;
  m.step = 1;
  m.loss = 1.0 / 3.0;
  m.grad_norm = std::numeric_limits<double>::infinity();  // an overflow step: JSON has no inf
  EXPECT_EQ(written_line(m),
            "{\"step\": 1, \"loss\": 0.333333333, \"lr\": 0, \"grad_norm\": null, "
            "\"tokens_per_s\": 0, \"mfu\": 0, \"step_time_s\": 0, \"loss_scale\": 1, "
            "\"skipped\": false, \"data_wait_s\": 0, \"peak_bytes\": {\"params\": 0, "
            "\"grads\": 0, \"optimizer\": 0, \"activations\": 0, \"comm\": 0, \"other\": 0, "
            "\"total\": 0}}");
}

TEST(Metrics, RecordNamesAreTheJsonPaths) {
  std::vector<std::string> names;
  for (const MetricValue& v : metric_record(full_step()))
    if (v.kind != MetricValue::Kind::object) names.push_back(v.name);
  const std::vector<std::string> want{"step",
                                      "loss",
                                      "val_loss",
                                      "lr",
                                      "grad_norm",
                                      "tokens_per_s",
                                      "mfu",
                                      "step_time_s",
                                      "loss_scale",
                                      "skipped",
                                      "data_wait_s",
                                      "checkpoint_s",
                                      "peak_bytes.params",
                                      "peak_bytes.grads",
                                      "peak_bytes.optimizer",
                                      "peak_bytes.activations",
                                      "peak_bytes.comm",
                                      "peak_bytes.other",
                                      "peak_bytes.total",
                                      "comm_bytes.dp.all_reduce",
                                      "comm_bytes.dp.all_gather",
                                      "comm_wait_s",
                                      "pp_bubble",
                                      "pp_bubble_predicted",
                                      "moe_aux",
                                      "moe_z",
                                      "moe_load_max",
                                      "moe_load_min",
                                      "moe_dropped",
                                      "moe_ep_rows"};
  EXPECT_EQ(names, want);
}

// A resumed run keeps the lines of steps up to the resumed step and appends after them; the lines
// of the interrupted run's lost steps (and a torn last line) go, through a file that replaces the
// old one whole (no window in which a kill leaves it truncated); with nothing to drop the file is
// only appended to. No temporary file is left.
TEST(Metrics, ResumeKeepsTheStepsUpToTheCheckpoint) {
  const std::string path = ::testing::TempDir() + "/metrics_resume.jsonl";
  auto lines = [&] {
    std::vector<std::string> out;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) out.push_back(l.substr(0, l.find(',')));
    return out;
  };
  {
    std::ofstream f(path, std::ios::trunc);
    f << "{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": 2}\n{\"step\": 3, \"loss\": "
         "1}\n{\"st";
  }
  StepMetrics m = full_step();
  m.step = 3;
  MetricsWriter(path, 2).write(m);
  EXPECT_EQ(lines(), (std::vector<std::string>{"{\"step\": 1", "{\"step\": 2", "{\"step\": 3"}));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  m.step = 4;
  MetricsWriter(path, 3).write(m);  // nothing past step 3: appended
  EXPECT_EQ(lines(), (std::vector<std::string>{"{\"step\": 1", "{\"step\": 2", "{\"step\": 3",
                                               "{\"step\": 4"}));
  MetricsWriter fresh(path);  // a fresh start: empty
  EXPECT_TRUE(lines().empty());
}

}  // namespace
}  // namespace llmt
