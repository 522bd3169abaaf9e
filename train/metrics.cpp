// JSONL metrics and the progress line. Numbers are written with enough digits to round-trip a
// float (%.9g), so tests can compare losses bit-for-bit with other runs.
#include "train/metrics.h"

#include <cmath>
#include <cstdio>

#include "core/check.h"

namespace llmt {

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_step) : path_(path) {
  if (path_.empty()) return;
  if (resumed_step > 0) {
    // The lines of steps up to resumed_step stay. When later ones must go, the kept lines are
    // written to a new file that replaces the old one by a rename, so that a kill at any moment
    // leaves either file whole (never a truncated one next to a checkpoint that names a step).
    std::string kept;
    bool dropped = false;
    {
      std::ifstream in(path_);
      for (std::string line; std::getline(in, line);) {
        long long step = 0;
        if (std::sscanf(line.c_str(), "{\"step\": %lld", &step) == 1 && step <= resumed_step)
          kept += line + "\n";
        else
          dropped = true;
      }
    }
    if (dropped) {
      const std::string tmp = path_ + ".tmp";
      {
        std::ofstream t(tmp, std::ios::out | std::ios::trunc);
        t << kept;
        t.flush();
        if (!t) throw Error("cannot write " + tmp + " (disk full?)");
      }
      if (std::rename(tmp.c_str(), path_.c_str()) != 0)
        throw Error("cannot replace metrics file " + path_ + " by " + tmp);
    }
    out_.open(path_, std::ios::out | std::ios::app);
  } else {
    out_.open(path_, std::ios::out | std::ios::trunc);
  }
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

std::vector<MetricValue> metric_record(const StepMetrics& m) {
  using K = MetricValue::Kind;
  std::vector<MetricValue> r;
  auto real = [&r](std::string name, double v, const char* fmt = "%.9g") {
    r.push_back({std::move(name), v, K::real, fmt});
  };
  auto integer = [&r](std::string name, double v) {
    r.push_back({std::move(name), v, K::integer});
  };
  integer("step", static_cast<double>(m.step));
  real("loss", m.loss);
  if (m.mtp_loss) real("mtp_loss", *m.mtp_loss);
  if (m.val_loss) real("val_loss", *m.val_loss);
  real("lr", m.lr);
  real("grad_norm", m.grad_norm);
  real("tokens_per_s", m.tokens_per_s, "%.6g");
  real("mfu", m.mfu, "%.6g");
  real("step_time_s", m.step_time_s, "%.6g");
  real("loss_scale", m.loss_scale, "%.17g");
  r.push_back({"skipped", m.skipped ? 1.0 : 0.0, K::boolean});
  real("data_wait_s", m.data_wait_s, "%.6g");
  if (m.checkpoint_s) real("checkpoint_s", *m.checkpoint_s, "%.6g");
  for (int c = 0; c < kNumMemCategories; ++c)
    integer(detail::concat("peak_bytes.", category_name(static_cast<MemCategory>(c))),
            static_cast<double>(m.mem.peak[c]));
  integer("peak_bytes.total", static_cast<double>(m.mem.peak_total));
  if (m.rss_peak_bytes) {
    for (int c = 0; c < kNumMemCategories; ++c)
      if (m.mem.offloaded[c] > 0)
        integer(detail::concat("offload_bytes.", category_name(static_cast<MemCategory>(c))),
                static_cast<double>(m.mem.offloaded[c]));
    integer("rss_peak_bytes", static_cast<double>(*m.rss_peak_bytes));
    integer("disk_io_bytes", static_cast<double>(m.disk_io_bytes.value_or(0)));
  }
  if (!m.comm.empty()) {
    for (const auto& [axis, counters] : m.comm) {
      r.push_back({detail::concat("comm_bytes.", axis), 0, K::object});
      for (int k = 0; k < kNumCommKinds; ++k) {
        if (counters.calls[k] == 0) continue;
        integer(detail::concat("comm_bytes.", axis, ".", comm_kind_name(static_cast<CommKind>(k))),
                static_cast<double>(counters.bytes[k]));
      }
    }
    real("comm_wait_s", m.comm_wait_s, "%.6g");
  }
  if (m.pp_bubble) {
    real("pp_bubble", *m.pp_bubble, "%.4g");
    real("pp_bubble_predicted", *m.pp_bubble_predicted, "%.4g");
  }
  if (m.moe) {
    real("moe_aux", m.moe->aux);
    real("moe_z", m.moe->z);
    real("moe_load_max", m.moe->load_max, "%.6g");
    real("moe_load_min", m.moe->load_min, "%.6g");
    real("moe_dropped", m.moe->dropped, "%.6g");
    integer("moe_ep_rows", static_cast<double>(m.moe->ep_rows));
  }
  return r;
}

namespace {
// The record as one JSON object: dotted names become nested objects (consecutive names sharing
// a prefix share its object).
std::string json_line(const std::vector<MetricValue>& record) {
  std::string line = "{";
  std::vector<std::string> open;  // the path of the innermost open object
  bool first = true;              // nothing written yet in the innermost object
  for (const MetricValue& v : record) {
    std::vector<std::string> path;
    for (size_t at = 0;;) {
      const size_t dot = v.name.find('.', at);
      path.push_back(v.name.substr(at, dot - at));
      if (dot == std::string::npos) break;
      at = dot + 1;
    }
    const size_t depth = v.kind == MetricValue::Kind::object ? path.size() : path.size() - 1;
    size_t common = 0;
    while (common < open.size() && common < depth && open[common] == path[common]) ++common;
    for (; open.size() > common; first = false) {  // a closed object was written in its parent
      line += "}";
      open.pop_back();
    }
    for (; open.size() < depth; first = true) {
      line += detail::concat(first ? "" : ", ", "\"", path[open.size()], "\": {");
      open.push_back(path[open.size()]);
    }
    if (v.kind == MetricValue::Kind::object) continue;
    line += detail::concat(first ? "" : ", ", "\"", path.back(), "\": ");
    first = false;
    switch (v.kind) {
      case MetricValue::Kind::real:
        line += json_number(v.value, v.format);
        break;
      case MetricValue::Kind::integer:
        line += std::to_string(static_cast<long long>(v.value));
        break;
      case MetricValue::Kind::boolean:
        line += v.value != 0 ? "true" : "false";
        break;
      case MetricValue::Kind::object:
        break;
    }
  }
  for (; !open.empty(); open.pop_back()) line += "}";
  return line + "}\n";
}
}  // namespace

void MetricsWriter::write(const StepMetrics& m) {
  if (path_.empty()) return;
  out_ << json_line(metric_record(m));
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
  char buf[288], val[64] = "";
  int width = static_cast<int>(std::to_string(m.steps).size());
  int at = 0;
  if (m.mtp_loss) at = std::snprintf(val, sizeof val, " | mtp %.4f", *m.mtp_loss);
  if (m.val_loss) std::snprintf(val + at, sizeof val - at, " | val %.4f", *m.val_loss);
  std::snprintf(buf, sizeof buf,
                "step %*lld/%lld | loss %.4f%s | lr %.2e | gnorm %.3f | %.0f tok/s | mfu %.1f%% | "
                "eta %s%s",
                width, static_cast<long long>(m.step), static_cast<long long>(m.steps), m.loss, val,
                m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, format_duration(eta_s).c_str(),
                m.skipped ? " | skipped (no update)" : "");
  return buf;
}

}  // namespace llmt
