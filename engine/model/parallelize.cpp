#include "engine/model/parallelize.h"

namespace llmt {

ModelLayout model_layout(const ParallelConfig& p, const MeshShape& mesh) {
  return {mesh,
          static_cast<int>(p.virtual_stages),
          p.pp_layers,
          static_cast<int>(p.ep),
          p.zero_shard_group,
          v_shaped(p.pp_schedule)};
}

int expert_rank(const MeshShape& mesh, int ep, int rank) {
  const auto c = mesh.coords(rank);
  const int d = c[static_cast<int>(Axis::dp)] * mesh.size(Axis::cp) + c[static_cast<int>(Axis::cp)];
  return d % ep;
}

ModelSpec parallelize(const ModelSpec& spec, const ModelLayout& layout, int rank) {
  const MeshShape& m = layout.mesh;
  const auto c = m.coords(rank);
  const int pp = m.size(Axis::pp), tp = m.size(Axis::tp);
  const ModelSpec stage = pp > 1 ? spec.shard_pp(pp, layout.virtual_stages, layout.pp_layers,
                                                 c[static_cast<int>(Axis::pp)], layout.v_shape)
                                 : spec;
  const ModelSpec tp_spec = stage.shard_tp(tp, c[static_cast<int>(Axis::tp)]);
  if (layout.ep == 1) return tp_spec;
  return tp_spec.shard_ep(layout.ep, expert_rank(m, layout.ep, rank));
}

}  // namespace llmt
