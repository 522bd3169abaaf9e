// Per-step metrics: one JSON object per optimizer step appended to <run_dir>/metrics.jsonl, and
// the human progress line (step, loss, lr, grad norm, tokens/s, MFU, ETA).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "engine/core/allocator.h"

namespace llmt {

struct StepMetrics {
  int64_t step = 0;
  int64_t steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double loss_scale = 1;
  bool skipped = false;  // fp16 overflow: no update this step
  MemStats mem;
};

class MetricsWriter {
 public:
  // path "" disables the file.
  explicit MetricsWriter(const std::string& path);
  void write(const StepMetrics& m);

 private:
  std::string path_;
  std::ofstream out_;
};

// "step   12/100 | loss 5.1234 | lr 3.00e-04 | gnorm 1.234 | 12,345 tok/s | mfu 31.2% | eta 1m23s"
std::string progress_line(const StepMetrics& m, double eta_s);
// "1h02m", "3m04s", "12s".
std::string format_duration(double seconds);

}  // namespace llmt
