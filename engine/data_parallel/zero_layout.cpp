#include "engine/data_parallel/zero_layout.h"

#include <algorithm>

#include "core/check.h"

namespace llmt {

int64_t ZeroParam::own_rows_of(int r) const {
  return std::clamp<int64_t>(rows - r * shard_rows, 0, shard_rows);
}

ZeroLayout zero_layout(const ModelSpec& spec, int64_t num_layers, int group_size, int group_rank) {
  ZeroLayout out;
  out.units.resize(static_cast<size_t>(num_layers) + 1);
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamSpec& ps = spec.params[i];
    LLMT_CHECK(ps.layer < num_layers, ps.name, ": layer ", ps.layer, " of ", num_layers);
    ZeroUnit& u = out.units[static_cast<size_t>(ps.layer + 1)];
    ZeroParam p;
    p.index = i;
    const GradGroup gg = spec.grad_group(i);
    p.part = gg.index();
    const size_t k = static_cast<size_t>(p.part);
    const ModelSpec::RowGroup rg = spec.row_group(i, group_size, group_rank);
    LLMT_CHECK(!out.used[k] || (rg.size == out.n[k] && rg.rank == out.rank[k]), ps.name,
               ": its row group (", rg.size, " ranks, place ", rg.rank, ") differs from part ", k,
               "'s (", out.n[k], ", ", out.rank[k], ")");
    out.used[k] = true;
    out.n[k] = rg.size;
    out.rank[k] = rg.rank;
    out.over_tp[k] = gg.tp;
    p.rows = spec.cut_rows(i);  // an expert stack: rows of its experts' first dim
    p.row_numel = ps.shape.numel() / p.rows;
    p.shard_rows = (p.rows + rg.size - 1) / rg.size;
    p.own_rows = p.own_rows_of(rg.rank);
    p.full_off = u.full_numel;
    p.shard_off = u.shard_numel[k];
    u.full_numel += ps.shape.numel();
    u.shard_numel[k] += p.shard_rows * p.row_numel;
    u.params.push_back(p);
  }
  return out;
}

}  // namespace llmt
