// Local shapes and slices of a Placement (placement.h): pure arithmetic on global shapes.
#include "engine/parallel/placement.h"

#include <numeric>

#include "core/check.h"

namespace llmt {
namespace {

// The segments of p's dim in `global` (one segment = the whole dim); checks they add up.
std::vector<int64_t> segments_of(const Shape& global, const Placement& p) {
  LLMT_CHECK(p.dim >= 0 && p.dim < global.ndim(), "placement ", p.str(), " of a tensor of shape ",
             global.str());
  if (p.segments.empty()) return {global[p.dim]};
  const int64_t total = std::accumulate(p.segments.begin(), p.segments.end(), int64_t{0});
  LLMT_CHECK(total == global[p.dim], "placement ", p.str(), ": segments add up to ", total,
             ", but dim ", p.dim, " of ", global.str(), " is ", global[p.dim]);
  return p.segments;
}

// s with dim d replaced by v (parameters have at most 4 dims).
Shape with_dim(const Shape& s, int d, int64_t v) {
  int64_t x[4] = {};
  LLMT_CHECK(s.ndim() <= 4, "shape ", s.str(), " has more than 4 dims");
  for (int i = 0; i < s.ndim(); ++i) x[i] = i == d ? v : s[i];
  switch (s.ndim()) {
    case 1:
      return Shape{x[0]};
    case 2:
      return Shape{x[0], x[1]};
    case 3:
      return Shape{x[0], x[1], x[2]};
    default:
      return Shape{x[0], x[1], x[2], x[3]};
  }
}

}  // namespace

std::string Placement::str() const {
  if (kind == Kind::owned) return "Owned(" + std::to_string(owner) + ")";
  if (!sharded()) return "Replicate";
  std::string s = "Shard(" + std::to_string(dim);
  if (!segments.empty()) {
    s += ", [";
    for (size_t i = 0; i < segments.size(); ++i) s += (i ? ", " : "") + std::to_string(segments[i]);
    s += "]";
  }
  return s + ")";
}

Shape local_shape(const Shape& global, const Placement& p, int axis_size, const std::string& what) {
  LLMT_CHECK(axis_size >= 1, "axis size ", axis_size);
  if (!p.sharded() || axis_size == 1) return global;
  int64_t local = 0;
  for (int64_t seg : segments_of(global, p)) {
    if (seg % axis_size != 0)
      throw Error(detail::concat(what, " ", global.str(), " is ", p.str(), ": a part of ", seg,
                                 " along dim ", p.dim, " is not divisible by the axis size ",
                                 axis_size));
    local += seg / axis_size;
  }
  return with_dim(global, p.dim, local);
}

std::vector<ShardSlice> local_slices(const Shape& global, const Placement& p, int axis_size,
                                     int axis_rank) {
  LLMT_CHECK(axis_rank >= 0 && axis_rank < axis_size, "rank ", axis_rank, " of ", axis_size);
  if (!p.sharded() || axis_size == 1) return {{0, 0, 0, global.ndim() ? global[0] : 1}};
  std::vector<ShardSlice> out;
  int64_t global_start = 0, local_start = 0;
  for (int64_t seg : segments_of(global, p)) {
    const int64_t n = seg / axis_size;
    out.push_back({p.dim, global_start + axis_rank * n, local_start, n});
    global_start += seg;
    local_start += n;
  }
  return out;
}

}  // namespace llmt
