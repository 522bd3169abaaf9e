#include "checkpoints/layout.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/check.h"

namespace llmt::ckpt {

namespace {
constexpr const char* kModelGroup = "model";
constexpr const char* kOptimizerPrefix = "optimizer/";
}  // namespace

std::string state_group(const std::string& state) {
  return state == kMasterState ? std::string(kModelGroup) : kOptimizerPrefix + state;
}

std::string tensor_path(const std::string& state, const std::string& param_name) {
  return state_group(state) + "/" + param_name;
}

std::pair<std::string, std::string> split_tensor_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string group = slash == std::string::npos ? "" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string prefix = kOptimizerPrefix;
  if (group == kModelGroup) return {kMasterState, name};
  if (group.size() > prefix.size() && group.compare(0, prefix.size(), prefix) == 0 &&
      group.find('/', prefix.size()) == std::string::npos)
    return {group.substr(prefix.size()), name};
  throw Error("checkpoint tensor " + path + " is in no state group (\"model/NAME\" or " +
              "\"optimizer/STATE/NAME\")");
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t c : count) n *= c;
  return n;
}

std::string Box::str() const {
  std::string s = "[";
  for (size_t d = 0; d < start.size(); ++d)
    s += detail::concat(d ? ", " : "", start[d], ":", start[d] + count[d]);
  return s + "]";
}

Box whole(const Shape& shape) {
  Box b;
  for (int d = 0; d < shape.ndim(); ++d) {
    b.start.push_back(0);
    b.count.push_back(shape[d]);
  }
  return b;
}

Box intersect(const Box& a, const Box& b) {
  Box out = a;
  for (size_t d = 0; d < a.start.size(); ++d) {
    const int64_t lo = std::max(a.start[d], b.start[d]);
    const int64_t hi = std::min(a.start[d] + a.count[d], b.start[d] + b.count[d]);
    out.start[d] = lo;
    out.count[d] = std::max<int64_t>(0, hi - lo);
  }
  return out;
}

std::vector<LocalBox> global_boxes(const ModelSpec& tp_spec, size_t i, int64_t row_begin,
                                   int64_t row_end) {
  const ParamSpec& p = tp_spec.params[i];
  const Shape& local = p.shape;
  const int64_t rows = tp_spec.cut_rows(i);
  LLMT_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= rows, "rows [", row_begin, ", ",
             row_end, ") of ", p.name, " ", local.str(), " (", rows, " rows)");
  const int64_t row_numel = local.numel() / std::max<int64_t>(1, rows);
  std::vector<LocalBox> out;
  if (rows != local[0]) {
    // An expert stack cut in rows of its first two dims (E_local x A): local row r is expert
    // r / A (global expert global_start + r / A under ep; experts are not split over tp) and its
    // row r % A. A run of rows is up to three boxes: the rest of a first expert, whole experts,
    // the start of a last one.
    const std::vector<ShardSlice> slices = tp_spec.local_slices(i);
    LLMT_CHECK(slices.size() == 1 && slices[0].dim == 0 && slices[0].local_start == 0, p.name,
               ": an expert stack is one slice of its experts");
    const int64_t A = local[1], first = slices[0].global_start;
    for (int64_t r = row_begin; r < row_end;) {
      const int64_t e = r / A, a = r % A;
      Box g = whole(p.global_shape);
      g.start[0] = first + e;
      int64_t n;  // the rows this box takes
      if (a == 0 && row_end - r >= A) {
        g.count[0] = (row_end - r) / A;
        n = g.count[0] * A;
      } else {
        n = std::min(A - a, row_end - r);
        g.count[0] = 1;
        g.start[1] = a;
        g.count[1] = n;
      }
      out.push_back({g, (r - row_begin) * row_numel});
      r += n;
    }
    return out;
  }
  for (const ShardSlice& s : tp_spec.local_slices(i)) {
    Box g = whole(p.global_shape);
    if (s.dim == 0) {
      // Local rows [local_start, local_start + length) are global rows from global_start on.
      const int64_t lo = std::max(row_begin, s.local_start);
      const int64_t hi = std::min(row_end, s.local_start + s.length);
      if (lo >= hi) continue;
      g.start[0] = s.global_start + (lo - s.local_start);
      g.count[0] = hi - lo;
      out.push_back({g, (lo - row_begin) * row_numel});
    } else {
      // A split of a later dim (row-parallel weights): every local row is a global row, and the
      // local columns are the slice's columns (the only slice, so the run stays contiguous).
      LLMT_CHECK(s.local_start == 0 && s.length == local[s.dim], "param ", p.name,
                 ": a shard of dim ", s.dim, " must be one slice");
      if (row_begin == row_end) continue;
      g.start[0] = row_begin;
      g.count[0] = row_end - row_begin;
      g.start[static_cast<size_t>(s.dim)] = s.global_start;
      g.count[static_cast<size_t>(s.dim)] = s.length;
      out.push_back({g, 0});
    }
  }
  return out;
}

std::vector<Piece> pieces_to_write(const ModelSpec& tp_spec, const MeshShape& mesh, int rank,
                                   const std::vector<std::string>& states,
                                   int64_t zero_shard_group) {
  const int tp_rank = mesh.coords(rank)[static_cast<int>(Axis::tp)];
  // The ranks that hold the same parameters and see different data (ZeRO's group).
  const std::vector<int> group = mesh.group(rank, {Axis::dp, Axis::cp});
  int n = static_cast<int>(group.size());
  int d = static_cast<int>(std::find(group.begin(), group.end(), rank) - group.begin());
  std::vector<Piece> out;
  if (zero_shard_group > 0) {  // hybrid sharding: chunks of zero_shard_group x cp group ranks
    const int64_t dp = mesh.size(Axis::dp);
    LLMT_CHECK(dp % zero_shard_group == 0, "zero_shard_group ", zero_shard_group,
               " does not divide dp ", dp);
    n = static_cast<int>(n / (dp / zero_shard_group));
    if (d >= n) return out;  // a replica of the first chunk's rows
  }
  for (size_t i = 0; i < tp_spec.params.size(); ++i) {
    const ParamSpec& p = tp_spec.params[i];
    if (p.tied_copy) continue;  // the last stage's copy of wte: stage 0 writes wte
    // A parameter replicated over tp: tp rank 0 writes it, but where its rows are cut over tp too
    // (a gradient group widened by tp: row_group).
    const bool over_tp = tp_spec.grad_group(i).tp;
    if (tp_rank != 0 && !over_tp && (!p.on(Axis::tp).sharded() || tp_spec.tp_size == 1)) continue;
    const auto [gn, gd] = tp_spec.row_group(i, n, d);
    const int64_t rows = tp_spec.cut_rows(i), s = (rows + gn - 1) / gn;
    const int64_t begin = std::min(rows, gd * s), end = std::min(rows, begin + s);
    if (begin == end) continue;
    for (const std::string& st : states)
      if (keeps_state(states, st, tp_spec.is_hidden_matrix(i))) out.push_back({st, i, begin, end});
  }
  return out;
}

std::string shard_dataset(const std::string& state, const std::string& param_name, size_t box) {
  return tensor_path(state, param_name) + "/" + std::to_string(box);
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.h5", rank);
  return buf;
}

}  // namespace llmt::ckpt

namespace llmt::ckpt {

std::vector<IndexTensor> plan_index(const ModelSpec& spec, const WriteLayout& layout,
                                    const std::vector<std::string>& states) {
  std::vector<IndexTensor> out;
  std::map<std::string, size_t> at;  // tensor path -> index in out
  for (const std::string& st : states)
    for (size_t i = 0; i < spec.params.size(); ++i) {
      if (!keeps_state(states, st, spec.is_hidden_matrix(i))) continue;
      const ParamSpec& p = spec.params[i];
      at[tensor_path(st, p.name)] = out.size();
      out.push_back({tensor_path(st, p.name), whole(p.global_shape).count, {}});
    }
  for (int r = 0; r < layout.mesh.world(); ++r) {
    const ModelSpec held = parallelize(spec, layout, r);
    for (const Piece& pc : pieces_to_write(held, layout.mesh, r, states, layout.zero_shard_group)) {
      const std::string& name = held.params[pc.param].name;
      IndexTensor& t = out[at.at(tensor_path(pc.state, name))];
      const auto boxes = global_boxes(held, pc.param, pc.row_begin, pc.row_end);
      for (size_t b = 0; b < boxes.size(); ++b)
        t.mappings.push_back(
            {boxes[b].global, rank_file_name(r), shard_dataset(pc.state, name, b)});
    }
  }
  return out;
}

}  // namespace llmt::ckpt
