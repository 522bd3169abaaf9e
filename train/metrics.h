// Per-step metrics: one JSON object per optimizer step appended to <run_dir>/metrics.jsonl, and
// the human progress line (step, loss, lr, grad norm, tokens/s, MFU, ETA).
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "engine/comm/communicator.h"

namespace llmt {

struct StepMetrics {
  int64_t step = 0;
  int64_t steps = 0;
  double loss = 0;
  // Multi-token prediction (model.mtp_depth > 0): the modules' mean loss, averaged as the loss is
  // (its mtp_loss_weight times it is in the objective; `loss` is the next token's alone).
  std::optional<double> mtp_loss;
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double loss_scale = 1;
  bool skipped = false;            // fp16 overflow: no update this step
  double data_wait_s = 0;          // time the step waited for its micro-batches from the loader
  std::optional<double> val_loss;  // mean loss on the valid split, on evaluation steps only
  MemStats mem;
  // [offload]: the process's peak resident set (/proc VmHWM) and the bytes it read from and wrote
  // to disk so far (/proc/self/io); mem.offloaded then holds the bytes in the files.
  std::optional<int64_t> rss_peak_bytes, disk_io_bytes;
  std::vector<std::pair<std::string, CommCounters>> comm;  // this step's bytes per mesh axis
  double comm_wait_s = 0;              // time blocked on data-parallel communication (not hidden)
  std::optional<double> checkpoint_s;  // time training was blocked saving a checkpoint
  // Pipeline parallelism: the measured bubble (idle / compute time of the step's schedule,
  // averaged over pp ranks) and the schedule's simulated one (forward 1, backward 2).
  std::optional<double> pp_bubble, pp_bubble_predicted;
  // Mixture of experts (docs/model.md): the router losses added to the objective (summed over
  // layers, averaged as the loss is), the largest and smallest share of one expert in a layer's
  // assignments of the step (1/E when balanced), and the share of assignments capacity dropped.
  struct Moe {
    double aux = 0, z = 0, load_max = 0, load_min = 0, dropped = 0;
    int64_t ep_rows = 0;  // expert parallelism: this rank's rows exchanged (MoeStats::ep_rows)
  };
  std::optional<Moe> moe;
};

// One value of a step's metrics record. `name` is its path in metrics.jsonl, dotted through nested
// objects ("loss", "peak_bytes.params", "comm_bytes.dp.all_reduce"); TensorBoard's tag is the
// same path with '/' ("peak_bytes/params"). An `object` entry only opens its path (an axis that
// moved nothing still prints as {}); it has no value and no tag.
struct MetricValue {
  enum class Kind : uint8_t { real, integer, boolean, object };
  std::string name;
  double value = 0;  // integers (bytes, counts) are exact in a double below 2^53
  Kind kind = Kind::real;
  const char* format = "%.9g";  // metrics.jsonl's printf format of a real
};

// The step's metrics, in metrics.jsonl's order: the one list every sink writes (MetricsWriter,
// TensorBoardWriter), so both carry the same names and the same set. "step" comes first.
std::vector<MetricValue> metric_record(const StepMetrics& m);

class MetricsWriter {
 public:
  // path "" disables the file. resumed_step > 0 (a resumed run): the file's lines of steps up to
  // resumed_step are kept (later ones belong to the interrupted run's lost steps) and new lines
  // are appended.
  explicit MetricsWriter(const std::string& path, int64_t resumed_step = 0);
  void write(const StepMetrics& m);

 private:
  std::string path_;
  std::ofstream out_;
};

// "step   12/100 | loss 5.1234 | lr 3.00e-04 | gnorm 1.234 | 12,345 tok/s | mfu 31.2% | eta 1m23s",
// with "| mtp 5.3456" (multi-token prediction) and "| val 5.2345" (evaluation steps) after the
// loss.
std::string progress_line(const StepMetrics& m, double eta_s);
// "1h02m", "3m04s", "12s".
std::string format_duration(double seconds);

}  // namespace llmt
