// JSONL metrics and the progress line. Numbers are written with enough digits to round-trip a
// float (%.9g), so tests can compare losses bit-for-bit with other runs.
#include "engine/train/metrics.h"

#include <cmath>
#include <cstdio>

#include "engine/core/check.h"

namespace llmt {

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_step) : path_(path) {
  if (path_.empty()) return;
  std::string kept;
  if (resumed_step > 0) {
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) {
      long long step = 0;
      if (std::sscanf(line.c_str(), "{\"step\": %lld", &step) == 1 && step <= resumed_step)
        kept += line + "\n";
    }
  }
  out_.open(path_, std::ios::out | std::ios::trunc);
  out_ << kept;
  if (!out_) throw Error("cannot open metrics file " + path_ + " for writing");
}

namespace {
// A JSON number, or null for inf/nan (an fp16 overflow step), which JSON cannot spell.
std::string json_number(double v, const char* fmt = "%.9g") {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}
}  // namespace

void MetricsWriter::write(const StepMetrics& m) {
  if (path_.empty()) return;
  std::string line = detail::concat(
      "{\"step\": ", m.step, ", \"loss\": ", json_number(m.loss),
      m.val_loss ? detail::concat(", \"val_loss\": ", json_number(*m.val_loss)) : "",
      ", \"lr\": ", json_number(m.lr), ", \"grad_norm\": ", json_number(m.grad_norm),
      ", \"tokens_per_s\": ", json_number(m.tokens_per_s, "%.6g"),
      ", \"mfu\": ", json_number(m.mfu, "%.6g"),
      ", \"step_time_s\": ", json_number(m.step_time_s, "%.6g"),
      ", \"loss_scale\": ", json_number(m.loss_scale, "%.17g"),
      ", \"skipped\": ", m.skipped ? "true" : "false",
      ", \"data_wait_s\": ", json_number(m.data_wait_s, "%.6g"),
      m.checkpoint_s ? detail::concat(", \"checkpoint_s\": ", json_number(*m.checkpoint_s, "%.6g"))
                     : "",
      ", \"peak_bytes\": {");
  for (int c = 0; c < kNumMemCategories; ++c) {
    line += detail::concat(c ? ", " : "", "\"", category_name(static_cast<MemCategory>(c)),
                           "\": ", m.mem.peak[c]);
  }
  line += detail::concat(", \"total\": ", m.mem.peak_total, "}");
  if (!m.comm.empty()) {
    line += ", \"comm_bytes\": {";
    for (size_t a = 0; a < m.comm.size(); ++a) {
      line += detail::concat(a ? ", " : "", "\"", m.comm[a].first, "\": {");
      bool first = true;
      for (int k = 0; k < kNumCommKinds; ++k) {
        if (m.comm[a].second.calls[k] == 0) continue;
        line += detail::concat(first ? "" : ", ", "\"", comm_kind_name(static_cast<CommKind>(k)),
                               "\": ", m.comm[a].second.bytes[k]);
        first = false;
      }
      line += "}";
    }
    line += detail::concat("}, \"comm_wait_s\": ", json_number(m.comm_wait_s, "%.6g"));
  }
  if (m.pp_bubble)
    line +=
        detail::concat(", \"pp_bubble\": ", json_number(*m.pp_bubble, "%.4g"),
                       ", \"pp_bubble_predicted\": ", json_number(*m.pp_bubble_predicted, "%.4g"));
  if (m.moe)
    line += detail::concat(", \"moe_aux\": ", json_number(m.moe->aux),
                           ", \"moe_z\": ", json_number(m.moe->z),
                           ", \"moe_load_max\": ", json_number(m.moe->load_max, "%.6g"),
                           ", \"moe_load_min\": ", json_number(m.moe->load_min, "%.6g"),
                           ", \"moe_dropped\": ", json_number(m.moe->dropped, "%.6g"),
                           ", \"moe_ep_rows\": ", m.moe->ep_rows);
  line += "}\n";
  out_ << line;
  out_.flush();
  if (!out_) throw Error("writing metrics to " + path_ + " failed (disk full?)");
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long long t = std::llround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

std::string progress_line(const StepMetrics& m, double eta_s) {
  char buf[256], val[32] = "";
  int width = static_cast<int>(std::to_string(m.steps).size());
  if (m.val_loss) std::snprintf(val, sizeof val, " | val %.4f", *m.val_loss);
  std::snprintf(buf, sizeof buf,
                "step %*lld/%lld | loss %.4f%s | lr %.2e | gnorm %.3f | %.0f tok/s | mfu %.1f%% | "
                "eta %s%s",
                width, static_cast<long long>(m.step), static_cast<long long>(m.steps), m.loss, val,
                m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, format_duration(eta_s).c_str(),
                m.skipped ? " | skipped (no update)" : "");
  return buf;
}

}  // namespace llmt
