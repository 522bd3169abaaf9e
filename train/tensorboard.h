// TensorBoard event files ([log] tensorboard = true): every per-step value of metrics.jsonl,
// under the same name (metric_record in metrics.h; nested keys joined with '/': "loss",
// "peak_bytes/params", "comm_bytes/dp/all_reduce", "moe_aux"), as
// <run_dir>/tensorboard/events.out.tfevents.<unix time>.<host>, which `tensorboard --logdir`
// reads. The format is TensorFlow's record file of serialized `Event` protocol buffers
// (tensorflow/core/util/event.proto, summary.proto): each record is
//   uint64 length | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)
// (little-endian; masked crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8), the first event holds
// file_version "brain.Event:2", each later one a wall time, a step and a Summary of simple_value
// scalars. Only the few protobuf fields written here are encoded, by hand: no TensorFlow or
// protobuf library is needed. Records are flushed at every step, so a killed run keeps its
// events up to its last step.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "train/metrics.h"

namespace llmt {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of n bytes.
uint32_t crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it; dir "" disables the writer. resumed_step > 0 (a
  // resumed run): a SessionLog START event at step resumed_step + 1 makes TensorBoard drop the
  // interrupted run's events from that step on (they belong to steps trained again).
  explicit TensorBoardWriter(const std::string& dir, int64_t resumed_step = 0);
  bool enabled() const { return out_.is_open(); }
  const std::string& path() const { return path_; }
  // One event at `step` with these (tag, value) scalars.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // The step's metrics record (metric_record) but "step", which is the event's step; booleans
  // as 0 and 1.
  void write(const StepMetrics& m);

 private:
  void record(const std::string& data);
  std::string path_;
  std::ofstream out_;
};

}  // namespace llmt
