#include "checkpoints/layout.h"

#include <algorithm>
#include <cstdio>

namespace llmt::ckpt {

const char* kind_group(Kind k) {
  switch (k) {
    case Kind::param:
      return "model";
    case Kind::exp_avg:
      return "optimizer/exp_avg";
    case Kind::exp_avg_sq:
      return "optimizer/exp_avg_sq";
  }
  return "?";
}

std::string tensor_path(Kind k, const std::string& param_name) {
  return std::string(kind_group(k)) + "/" + param_name;
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
  LLMT_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= local[0], "rows [", row_begin,
             ", ", row_end, ") of ", p.name, " ", local.str());
  const int64_t row_numel = local.numel() / std::max<int64_t>(1, local[0]);
  std::vector<LocalBox> out;
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

std::vector<Piece> pieces_to_write(const ModelSpec& tp_spec, const MeshShape& mesh, int rank) {
  const auto c = mesh.coords(rank);
  const int tp_rank = c[static_cast<int>(Axis::tp)];
  const int dp = mesh.size(Axis::dp), dp_rank = c[static_cast<int>(Axis::dp)];
  // Replicas over cp write nothing: cp ranks hold the same parameters.
  if (c[static_cast<int>(Axis::cp)] != 0) return {};
  std::vector<Piece> out;
  for (size_t i = 0; i < tp_spec.params.size(); ++i) {
    const ParamSpec& p = tp_spec.params[i];
    if (p.tied_copy) continue;  // the last stage's copy of wte: stage 0 writes wte
    if (tp_rank != 0 && (!p.on(Axis::tp).sharded() || tp_spec.tp_size == 1)) continue;
    const int64_t rows = p.shape[0], s = (rows + dp - 1) / dp;
    const int64_t begin = std::min(rows, dp_rank * s), end = std::min(rows, begin + s);
    if (begin == end) continue;
    for (Kind k : kKinds) out.push_back({k, i, begin, end});
  }
  return out;
}

std::string shard_dataset(Kind k, const std::string& param_name, size_t box) {
  return tensor_path(k, param_name) + "/" + std::to_string(box);
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.h5", rank);
  return buf;
}

}  // namespace llmt::ckpt

namespace llmt::ckpt {

ModelSpec rank_spec(const ModelSpec& spec, const WriteLayout& layout, int rank) {
  const MeshShape& m = layout.mesh;
  const auto c = m.coords(rank);
  const int pp = m.size(Axis::pp), tp = m.size(Axis::tp);
  const ModelSpec stage = pp > 1 ? spec.shard_pp(pp, layout.virtual_stages, layout.pp_layers,
                                                 c[static_cast<int>(Axis::pp)])
                                 : spec;
  return stage.shard_tp(tp, c[static_cast<int>(Axis::tp)]);
}

std::vector<IndexTensor> plan_index(const ModelSpec& spec, const WriteLayout& layout) {
  const size_t n = spec.params.size();
  std::vector<IndexTensor> out;
  for (Kind k : kKinds)
    for (const ParamSpec& p : spec.params)
      out.push_back({tensor_path(k, p.name), whole(p.global_shape).count, {}});
  for (int r = 0; r < layout.mesh.world(); ++r) {
    const ModelSpec held = rank_spec(spec, layout, r);
    for (const Piece& pc : pieces_to_write(held, layout.mesh, r)) {
      const std::string& name = held.params[pc.param].name;
      IndexTensor& t = out[static_cast<size_t>(pc.kind) * n + spec.index_of(name)];
      const auto boxes = global_boxes(held, pc.param, pc.row_begin, pc.row_end);
      for (size_t b = 0; b < boxes.size(); ++b)
        t.mappings.push_back({boxes[b].global, rank_file_name(r), shard_dataset(pc.kind, name, b)});
    }
  }
  return out;
}

}  // namespace llmt::ckpt
