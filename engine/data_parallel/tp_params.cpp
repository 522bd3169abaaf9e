// Norm accounting and gathering of tp-sharded parameters (tp_params.h).
#include "engine/data_parallel/tp_params.h"

#include <algorithm>
#include <vector>

#include "kernels/ops.h"

namespace llmt {

double tp_sum_squares(const ModelSpec& spec, Tensor flat, int64_t begin) {
  const int64_t end = begin + flat.numel();
  std::vector<Tensor> counted;
  int64_t off = 0;
  for (size_t i = 0; i < spec.params.size() && off < end; ++i) {
    const int64_t n = spec.params[i].shape.numel();
    const int64_t lo = std::max(off, begin), hi = std::min(off + n, end);
    if (lo < hi && counts_in_tp_norm(spec, i))
      counted.push_back(flat.view({flat.numel()}).rows(lo - begin, hi - begin));
    off += n;
  }
  return ops::sum_squares(counted);
}

namespace {

// Every rank's `local` (P values of `spec`, this rank's shapes) in rank order: (size x P).
std::vector<float> all_gather_local(Communicator& g, const ModelSpec& spec,
                                    const std::vector<float>& local, const char* who) {
  const int64_t P = spec.num_local_params();
  LLMT_CHECK(static_cast<int64_t>(local.size()) == P, who, ": ", local.size(),
             " local values, the spec holds ", P);
  std::vector<float> all(static_cast<size_t>(P * g.size()));
  g.all_gather(Tensor(all.data(), {P * g.size()}, DType::f32),
               Tensor(const_cast<float*>(local.data()), {P}, DType::f32))
      .wait();
  return all;
}

}  // namespace

void gather_tp_params(Communicator& tp, const ModelSpec& spec, const std::vector<float>& local,
                      std::vector<float>& global) {
  const int64_t P = spec.num_local_params();
  const int p = tp.size();
  const std::vector<float> all = all_gather_local(tp, spec, local, "gather_tp_params");
  global.assign(static_cast<size_t>(spec.num_params()), 0.0f);
  int64_t loff = 0, goff = 0;
  for (const ParamSpec& ps : spec.params) {
    const Shape& g = ps.global_shape;
    const Shape& l = ps.shape;
    const int64_t gcols = g.numel() / g[0], lcols = l.numel() / l[0];
    for (int r = 0; r < p; ++r) {
      const float* src = all.data() + r * P + loff;
      // A replicated parameter must be bitwise the same on every tp rank (same gradients, same
      // update); a difference means the ranks have drifted apart.
      if (!ps.on(Axis::tp).sharded() && !std::equal(src, src + l.numel(), all.data() + loff))
        throw Error(detail::concat("gather_tp_params: ", ps.name, " differs between tp rank 0 and ",
                                   r, "; replicated parameters must stay identical"));
      float* dst = global.data() + goff;
      for (const ShardSlice& s : local_slices(g, ps.on(Axis::tp), p, r)) {
        if (s.dim == 0) {
          std::copy(src + s.local_start * lcols, src + (s.local_start + s.length) * lcols,
                    dst + s.global_start * gcols);
        } else {
          for (int64_t row = 0; row < g[0]; ++row)
            std::copy(src + row * lcols + s.local_start,
                      src + row * lcols + s.local_start + s.length,
                      dst + row * gcols + s.global_start);
        }
      }
    }
    loff += l.numel();
    goff += g.numel();
  }
}

void gather_ep_params(Communicator& ep, const ModelSpec& spec, const std::vector<float>& local,
                      std::vector<float>& global) {
  const int64_t P = spec.num_local_params();
  const int p = ep.size();
  const std::vector<float> all = all_gather_local(ep, spec, local, "gather_ep_params");
  global.clear();
  int64_t loff = 0;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const int64_t n = spec.params[i].shape.numel();
    const bool expert = spec.grad_group(i).ep;  // sharded over ep: every rank's part, in order
    for (int r = 0; r < (expert ? p : 1); ++r) {
      const float* src = all.data() + r * P + loff;
      global.insert(global.end(), src, src + n);
    }
    for (int r = 1; r < p && !expert; ++r)
      if (!std::equal(all.data() + loff, all.data() + loff + n, all.data() + r * P + loff))
        throw Error(detail::concat("gather_ep_params: ", spec.params[i].name,
                                   " differs between ep rank 0 and ", r,
                                   "; parameters other than the experts must stay identical"));
    loff += n;
  }
}

}  // namespace llmt
