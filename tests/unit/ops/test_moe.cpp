// Mixture-of-experts ops: the router (top-k, ties, weights) against a double reference, its
// gradient (routing weights, aux loss, z-loss) against finite differences, the dispatch's capacity
// rule on a hand-worked case, the permute/combine pair and its gradients, and the grouped GEMM
// against one linear per group.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

// Router outputs of logits (N,E), k per row.
struct Routed {
  HostTensor scores, idx, weights;
};

Routed route(HostTensor& logits, int64_t k, const ops::MoeRouting& how,
             HostTensor* bias = nullptr) {
  const int64_t N = logits.shape()[0], E = logits.shape()[1];
  Routed r{HostTensor({N, E}), HostTensor({N, k}, DType::i32), HostTensor({N, k})};
  ops::moe_route(r.scores.t(), r.idx.t(), r.weights.t(), logits.t(), how,
                 bias ? bias->t() : Tensor());
  return r;
}

Routed route(HostTensor& logits, int64_t k, bool sigmoid, bool normalize) {
  return route(logits, k, {.sigmoid = sigmoid, .normalize = normalize});
}

TEST(MoeRoute, TopKAndWeightsMatchDoubleReference) {
  const int64_t N = 50, E = 7, k = 3;
  HostTensor logits = uniform({N, E}, 1, -4.0f, 4.0f);
  for (int t = 0; t < 2; ++t) logits[t * E + 2] = logits[t * E + 5] = 9.0f;  // a tie on top
  for (const bool sigmoid : {false, true})
    for (const bool normalize : {false, true}) {
      const Routed r = route(logits, k, sigmoid, normalize);
      for (int64_t t = 0; t < N; ++t) {
        std::vector<double> p(E);
        double mx = -1e30, sum = 0;
        for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double{logits[t * E + e]});
        for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[t * E + e] - mx);
        for (int64_t e = 0; e < E; ++e)
          p[e] = sigmoid ? 1 / (1 + std::exp(-double{logits[t * E + e]}))
                         : std::exp(logits[t * E + e] - mx) / sum;
        std::vector<int64_t> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return p[a] > p[b]; });
        double selsum = 0;
        for (int64_t j = 0; j < k; ++j) selsum += p[order[j]];
        for (int64_t j = 0; j < k; ++j) {
          ASSERT_EQ(r.idx.i32()[t * k + j], order[j]) << "row " << t << " choice " << j;
          const double w = normalize ? p[order[j]] / selsum : p[order[j]];
          EXPECT_NEAR(r.weights[t * k + j], w, 1e-6);
        }
      }
      EXPECT_EQ(r.idx.i32()[0], 2);  // the tie goes to the lower expert
      EXPECT_EQ(r.idx.i32()[1], 5);
    }
}

// Aux-loss-free balancing: the bias moves the selection, never the weights (the selected
// experts' own scores).
TEST(MoeRoute, BiasSelectsButDoesNotWeigh) {
  const int64_t N = 30, E = 6, k = 2;
  HostTensor logits = uniform({N, E}, 3, -2.0f, 2.0f), bias({E});
  bias[4] = 10.0f;  // expert 4 always chosen first
  for (const bool sigmoid : {false, true}) {
    const Routed plain = route(logits, k, sigmoid, false);
    Routed r{HostTensor({N, E}), HostTensor({N, k}, DType::i32), HostTensor({N, k})};
    ops::moe_route(r.scores.t(), r.idx.t(), r.weights.t(), logits.t(),
                   {.sigmoid = sigmoid, .normalize = false}, bias.t());
    for (int64_t t = 0; t < N; ++t) {
      EXPECT_EQ(r.idx.i32()[t * k], 4);
      const int32_t second = r.idx.i32()[t * k + 1];
      // The second choice is the best of the rest by score alone.
      const int32_t want =
          plain.idx.i32()[t * k] == 4 ? plain.idx.i32()[t * k + 1] : plain.idx.i32()[t * k];
      EXPECT_EQ(second, want);
      EXPECT_EQ(r.weights[t * k], plain.scores[t * E + 4]);
      EXPECT_EQ(r.weights[t * k + 1], plain.scores[t * E + second]);
    }
  }
}

// The router's gradient: L = sum c_tj w_tj + lambda sum_s aux_s + mu sum_t zsq_t, with the aux
// counts held at the unperturbed routing (they carry no gradient). moe_route_backward's
// aux_scale for that L is lambda E / (T^2 k), its z_scale 2 mu.
TEST(MoeRoute, GradientMatchesFiniteDifferences) {
  const int64_t S = 2, T = 9, N = S * T, E = 5, k = 2;
  const double lambda = 0.7, mu = 0.05;
  for (const bool sigmoid : {false, true})
    for (const bool normalize : {false, true}) {
      HostTensor logits = uniform({N, E}, 2, -2.0f, 2.0f);
      Routed r0 = route(logits, k, sigmoid, normalize);
      HostTensor counts({S, E}, DType::i32), offsets({E + 1}, DType::i32),
          assign({N * k}, DType::i32);
      HostTensor slot({N, k}, DType::i32);
      ops::moe_dispatch(counts.t(), offsets.t(), assign.t(), slot.t(), r0.idx.t(), T, 0);
      HostTensor c = uniform({N, k}, 3);
      HostTensor dlogits({N, E});
      ops::moe_route_backward(dlogits.t(), c.t(), logits.t(), r0.idx.t(), counts.t(),
                              {.sigmoid = sigmoid, .normalize = normalize},
                              static_cast<float>(lambda * E / (T * T * k)),
                              static_cast<float>(2 * mu));
      auto loss = [&] {
        Routed r = route(logits, k, sigmoid, normalize);
        // The selection must not change under the probe (the logits are far from ties).
        for (int64_t i = 0; i < N * k; ++i)
          if (r.idx.i32()[i] != r0.idx.i32()[i]) ADD_FAILURE() << "probe changed the routing";
        HostTensor aux({S}), zsq({N});
        ops::moe_route_losses(aux.t(), zsq.t(), logits.t(), counts.t(), k, sigmoid);
        double l = weighted_sum(r.weights, c);
        for (int64_t s = 0; s < S; ++s) l += lambda * aux[s];
        for (int64_t t = 0; t < N; ++t) l += mu * zsq[t];
        return l;
      };
      EXPECT_TRUE(check_gradient(loss, logits, dlogits, GradCheck{.eps = 1e-3}))
          << (sigmoid ? "sigmoid" : "softmax") << (normalize ? " normalized" : "");
    }
}

// Group-limited routing (DeepSeek-V3), against a reference that sorts: each group's score is the
// sum of its two largest keys (score + bias), the topk_group best groups (ties: the lower group)
// are open, and the k best keys among their experts are picked (ties: the lower expert); the
// weights are the picked scores (normalized) times routed_scaling_factor.
TEST(MoeRoute, GroupLimitedRoutingPicksFromTheBestGroups) {
  const int64_t N = 64, E = 16, G = 4, per = E / G, k = 3;
  HostTensor logits = uniform({N, E}, 31, -3.0f, 3.0f), bias = uniform({E}, 32, -0.5f, 0.5f);
  for (int64_t e = 0; e < E; ++e) logits[E + e] = 0.5f;  // row 1: scores tie (groups and experts)
  for (const bool sigmoid : {false, true})
    for (const int64_t topk_group : {int64_t{1}, int64_t{2}, G})
      for (const bool with_bias : {false, true}) {
        const ops::MoeRouting how{.sigmoid = sigmoid,
                                  .normalize = true,
                                  .groups = G,
                                  .topk_group = topk_group,
                                  .scale = 2.5f};
        const Routed r = route(logits, k, how, with_bias ? &bias : nullptr);
        for (int64_t t = 0; t < N; ++t) {
          const float* p = r.scores.f32() + t * E;
          auto key = [&](int64_t e) { return with_bias ? p[e] + bias[e] : p[e]; };
          std::vector<std::pair<float, int64_t>> groups;
          for (int64_t g = 0; g < G; ++g) {
            std::vector<float> keys;
            for (int64_t e = g * per; e < (g + 1) * per; ++e) keys.push_back(key(e));
            std::sort(keys.rbegin(), keys.rend());
            groups.push_back({keys[0] + keys[1], g});
          }
          std::stable_sort(groups.begin(), groups.end(),
                           [](const auto& a, const auto& b) { return a.first > b.first; });
          std::vector<std::pair<float, int64_t>> open;
          for (int64_t i = 0; i < topk_group; ++i)
            for (int64_t e = groups[i].second * per; e < (groups[i].second + 1) * per; ++e)
              open.push_back({key(e), e});
          std::stable_sort(open.begin(), open.end(), [](const auto& a, const auto& b) {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
          });
          double sum = 0;
          for (int64_t j = 0; j < k; ++j) sum += p[open[j].second];
          for (int64_t j = 0; j < k; ++j) {
            ASSERT_EQ(r.idx.i32()[t * k + j], open[j].second)
                << "row " << t << " choice " << j << (sigmoid ? " sigmoid" : " softmax")
                << " topk_group " << topk_group << (with_bias ? " bias" : "");
            EXPECT_NEAR(r.weights[t * k + j], 2.5 * p[open[j].second] / sum, 1e-6);
          }
        }
      }
  // A group limit of every group picks what ungrouped routing picks, bit for bit.
  const Routed all = route(logits, k, {.sigmoid = true, .groups = G, .topk_group = G}, &bias);
  const Routed plain = route(logits, k, {.sigmoid = true}, &bias);
  for (int64_t i = 0; i < N * k; ++i) {
    EXPECT_EQ(all.idx.i32()[i], plain.idx.i32()[i]);
    EXPECT_EQ(all.weights[i], plain.weights[i]);
  }
}

// routed_scaling_factor and group limits in the gradient: the scale multiplies the weights'
// gradient; the groups change only which experts were picked.
TEST(MoeRoute, ScaledGroupLimitedGradientMatchesFiniteDifferences) {
  const int64_t N = 12, E = 8, k = 2;
  for (const bool sigmoid : {false, true})
    for (const bool normalize : {false, true}) {
      const ops::MoeRouting how{
          .sigmoid = sigmoid, .normalize = normalize, .groups = 4, .topk_group = 2, .scale = 2.5f};
      HostTensor logits = uniform({N, E}, 5, -2.0f, 2.0f);
      Routed r0 = route(logits, k, how);
      HostTensor c = uniform({N, k}, 6), dlogits({N, E});
      ops::moe_route_backward(dlogits.t(), c.t(), logits.t(), r0.idx.t(), Tensor(), how, 0.0f,
                              0.0f);
      auto loss = [&] {
        Routed r = route(logits, k, how);
        for (int64_t i = 0; i < N * k; ++i)
          if (r.idx.i32()[i] != r0.idx.i32()[i]) ADD_FAILURE() << "probe changed the routing";
        return weighted_sum(r.weights, c);
      };
      EXPECT_TRUE(check_gradient(loss, logits, dlogits, GradCheck{.eps = 1e-3}))
          << (sigmoid ? "sigmoid" : "softmax") << (normalize ? " normalized" : "");
    }
}

TEST(MoeRoute, LossesMatchTheirDefinition) {
  const int64_t S = 2, T = 6, N = S * T, E = 4, k = 2;
  HostTensor logits = uniform({N, E}, 4, -2.0f, 2.0f);
  HostTensor counts({S, E}, DType::i32);
  for (int64_t i = 0; i < S * E; ++i) counts.i32()[i] = static_cast<int32_t>((i * 5) % 7);
  HostTensor aux({S}), zsq({N});
  ops::moe_route_losses(aux.t(), zsq.t(), logits.t(), counts.t(), k, false);
  for (int64_t s = 0; s < S; ++s) {
    double a = 0;
    for (int64_t e = 0; e < E; ++e) {
      double P = 0;
      for (int64_t t = s * T; t < (s + 1) * T; ++t) {
        double sum = 0;
        for (int64_t e2 = 0; e2 < E; ++e2) sum += std::exp(double{logits[t * E + e2]});
        P += std::exp(double{logits[t * E + e]}) / sum / T;
      }
      a += counts.i32()[s * E + e] / double(T * k) * P;
    }
    EXPECT_NEAR(aux[s], E * a, 1e-5);
  }
  for (int64_t t = 0; t < N; ++t) {
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(double{logits[t * E + e]});
    EXPECT_NEAR(zsq[t], std::log(sum) * std::log(sum), 1e-5);
  }
}

// One sequence of 4 tokens, 2 experts, top-2, capacity 2. Expert 0's assignments in (j, t) order
// are (0,t0) (0,t1) (0,t3) (1,t2): the first two stay. Expert 1's: (0,t2) (1,t0) (1,t1) (1,t3):
// (0,t2) and (1,t0) stay.
TEST(MoeDispatch, CapacityKeepsFirstChoicesThenPositions) {
  HostTensor idx({4, 2}, DType::i32);
  const int32_t routes[8] = {0, 1, 0, 1, 1, 0, 0, 1};
  std::copy(routes, routes + 8, idx.i32());
  HostTensor counts({1, 2}, DType::i32), offsets({3}, DType::i32), assign({8}, DType::i32);
  HostTensor slot({4, 2}, DType::i32);
  ops::moe_dispatch(counts.t(), offsets.t(), assign.t(), slot.t(), idx.t(), 4, 2);
  EXPECT_EQ(std::vector<int32_t>(counts.i32(), counts.i32() + 2), (std::vector<int32_t>{4, 4}));
  EXPECT_EQ(std::vector<int32_t>(offsets.i32(), offsets.i32() + 3),
            (std::vector<int32_t>{0, 2, 4}));
  // Rows: expert 0 = t0 (a0), t1 (a2); expert 1 = t0 (a1), t2 (a4); then unused.
  EXPECT_EQ(std::vector<int32_t>(assign.i32(), assign.i32() + 8),
            (std::vector<int32_t>{0, 2, 1, 4, -1, -1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(slot.i32(), slot.i32() + 8),
            (std::vector<int32_t>{0, 2, 1, -1, 3, -1, -1, -1}));
  // Dropless: every assignment has a row, expert 0's four first.
  ops::moe_dispatch(counts.t(), offsets.t(), assign.t(), slot.t(), idx.t(), 4, 0);
  EXPECT_EQ(std::vector<int32_t>(offsets.i32(), offsets.i32() + 3),
            (std::vector<int32_t>{0, 4, 8}));
  EXPECT_EQ(std::vector<int32_t>(assign.i32(), assign.i32() + 8),
            (std::vector<int32_t>{0, 2, 5, 6, 1, 3, 4, 7}));
}

// Context parallelism's rank_base: a sequence cut into H runs, each run's base the count of the
// whole sequence's assignments ranked before it (earlier choices, then earlier runs of the same
// choice), keeps exactly what the dispatch of the whole sequence keeps.
TEST(MoeDispatch, RankBaseOfRunsKeepsWhatTheWholeSequenceKeeps) {
  const int64_t S = 2, T = 12, H = 3, run = T / H, E = 3, k = 2, N = S * T;
  HostTensor logits = uniform({N, E}, 11, -2.0f, 2.0f);
  HostTensor scores({N, E}), idx({N, k}, DType::i32), weights({N, k});
  ops::moe_route(scores.t(), idx.t(), weights.t(), logits.t(), ops::MoeRouting{});
  HostTensor base({S, E, k, H}, DType::i32);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t e = 0; e < E; ++e) {
      int32_t before = 0;
      for (int64_t j = 0; j < k; ++j)
        for (int64_t h = 0; h < H; ++h) {
          base.i32()[((s * E + e) * k + j) * H + h] = before;
          for (int64_t t = s * T + h * run; t < s * T + (h + 1) * run; ++t)
            before += idx.i32()[t * k + j] == e;
        }
    }
  for (const int64_t capacity : {int64_t{2}, int64_t{5}}) {
    HostTensor c0({S, E}, DType::i32), o0({E + 1}, DType::i32), a0({N * k}, DType::i32),
        s0({N, k}, DType::i32), c1({S, E}, DType::i32), o1({E + 1}, DType::i32),
        a1({N * k}, DType::i32), s1({N, k}, DType::i32);
    ops::moe_dispatch(c0.t(), o0.t(), a0.t(), s0.t(), idx.t(), T, capacity);
    ops::moe_dispatch(c1.t(), o1.t(), a1.t(), s1.t(), idx.t(), T, capacity, base.t());
    EXPECT_EQ(std::vector<int32_t>(s0.i32(), s0.i32() + N * k),
              std::vector<int32_t>(s1.i32(), s1.i32() + N * k));
    EXPECT_EQ(std::vector<int32_t>(o0.i32(), o0.i32() + E + 1),
              std::vector<int32_t>(o1.i32(), o1.i32() + E + 1));
    EXPECT_LT(o0.i32()[E], N * k) << "capacity " << capacity << " drops nothing";
  }
}

// y = combine(eo) = sum_j w_tj eo[slot_tj]: its gradients wrt eo (moe_permute with weights) and w
// (moe_weights_backward) against finite differences, with some assignments dropped.
TEST(MoeCombine, GradientsMatchFiniteDifferences) {
  const int64_t S = 2, T = 7, N = S * T, E = 3, k = 2, C = 5;
  HostTensor logits = uniform({N, E}, 5, -2.0f, 2.0f);
  Routed r = route(logits, k, false, true);
  HostTensor counts({S, E}, DType::i32), offsets({E + 1}, DType::i32), assign({N * k}, DType::i32);
  HostTensor slot({N, k}, DType::i32);
  ops::moe_dispatch(counts.t(), offsets.t(), assign.t(), slot.t(), r.idx.t(), T, 3);
  ASSERT_LT(offsets.i32()[E], N * k) << "the capacity should drop some assignments";
  HostTensor eo = uniform({N * k, C}, 6), y({N, C}), w = uniform({N, C}, 7);
  HostTensor d_eo = constant({N * k, C}, 0.0f), d_weights({N, k});
  ops::moe_permute(d_eo.t(), w.t(), assign.t(), r.weights.t());
  ops::moe_weights_backward(d_weights.t(), w.t(), eo.t(), slot.t());
  auto loss = [&] {
    ops::moe_unpermute(y.t(), eo.t(), slot.t(), r.weights.t());
    return weighted_sum(y, w);
  };
  EXPECT_TRUE(check_gradient(loss, eo, d_eo, GradCheck{.max_probes = 200}));
  EXPECT_TRUE(check_gradient(loss, r.weights, d_weights));
  // The permute and the unweighted unpermute are each other's transposes: x -> xp -> sum.
  HostTensor x = uniform({N, C}, 8), xp = constant({N * k, C}, 0.0f), back({N, C});
  ops::moe_permute(xp.t(), x.t(), assign.t());
  ops::moe_unpermute(back.t(), xp.t(), slot.t());
  for (int64_t t = 0; t < N; ++t) {
    int kept = 0;
    for (int64_t j = 0; j < k; ++j) kept += slot.i32()[t * k + j] >= 0;
    for (int64_t c = 0; c < C; ++c) EXPECT_FLOAT_EQ(back[t * C + c], kept * x[t * C + c]);
  }
}

// The grouped GEMM hands BLAS tiles of other row counts than the calls it is compared with, and
// BLAS may sum a dot product in another order for another shape (OpenBLAS on Zen 3 does: up to
// 2.4e-7 apart, 7% of the bound), so the two are compared to the bound of that reordering: each sum
// of the n products a_k·b_k lies within γ_n·Σ|a_k·b_k| of the exact one, γ_n = n·u/(1 - n·u),
// u = eps/2 (Higham, Accuracy and Stability of Numerical Algorithms, §3.1), so two orders differ
// by at most (n + 1)·eps·Σ|a_k·b_k| here. A wrong weight or row is off by O(0.1).
float reorder_bound(const float* a, int64_t stride_a, const float* b, int64_t stride_b, int64_t n) {
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += std::fabs(double{a[k * stride_a]} * b[k * stride_b]);
  return static_cast<float>((n + 1) * double{std::numeric_limits<float>::epsilon()} * s);
}

// The grouped GEMM equals one linear per group on the group's rows, forward and backward (to the
// reordering bound above), with an empty group; dweight accumulates.
TEST(GroupedLinear, EqualsOneLinearPerGroup) {
  const int64_t IC = 24, OC = 20, G = 4, M = 330;
  const std::vector<int64_t> off{0, 140, 140, 329, 330};
  HostTensor inp = uniform({M, IC}, 9), weight = uniform({G, OC, IC}, 10),
             dout = uniform({M, OC}, 11);
  HostTensor out({M, OC}), dinp({M, IC}), dweight = uniform({G, OC, IC}, 12);
  const HostTensor dweight0 = dweight;
  ops::grouped_linear_forward(out.t(), inp.t(), weight.t(), off);
  ops::grouped_linear_backward(dinp.t(), dweight.t(), dout.t(), inp.t(), weight.t(), off);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t n = off[g + 1] - off[g];
    if (n == 0) {
      for (int64_t i = 0; i < OC * IC; ++i)
        EXPECT_EQ(dweight[g * OC * IC + i], dweight0[g * OC * IC + i]);
      continue;
    }
    const Tensor w_g = weight.t().rows(g, g + 1).view({OC, IC});
    HostTensor o({n, OC}), di({n, IC}), dw({OC, IC});
    std::copy(dweight0.f32() + g * OC * IC, dweight0.f32() + (g + 1) * OC * IC, dw.f32());
    ops::linear_forward(o.t(), inp.t().rows(off[g], off[g + 1]), w_g, Tensor());
    ops::linear_backward(di.t(), dw.t(), Tensor(), dout.t().rows(off[g], off[g + 1]),
                         inp.t().rows(off[g], off[g + 1]), w_g);
    const float* w = weight.f32() + g * OC * IC;  // (OC, IC)
    for (int64_t i = 0; i < n * OC; ++i) {
      const int64_t r = off[g] + i / OC, c = i % OC;
      EXPECT_NEAR(out[r * OC + c], o[i], reorder_bound(inp.f32() + r * IC, 1, w + c * IC, 1, IC));
    }
    for (int64_t i = 0; i < n * IC; ++i) {
      const int64_t r = off[g] + i / IC, c = i % IC;
      EXPECT_NEAR(dinp[r * IC + c], di[i], reorder_bound(dout.f32() + r * OC, 1, w + c, IC, OC));
    }
    for (int64_t i = 0; i < OC * IC; ++i) EXPECT_NEAR(dweight[g * OC * IC + i], dw[i], 1e-5);
  }
}

// Groups sharing a weight (expert parallelism: the rows each peer sent for each local expert):
// the same as the groups of one weight concatenated, forward and backward (to the reordering
// bound).
TEST(GroupedLinear, GroupsSharingAWeightEqualTheirConcatenation) {
  const int64_t IC = 12, OC = 9, M = 300;
  // Peer 0 sends 70 rows of expert 0 and 80 of expert 1, peer 1 60 and 90.
  const std::vector<int64_t> off{0, 70, 150, 210, 300}, weight_of{0, 1, 0, 1};
  // The same rows regrouped by expert: [p0 e0 | p1 e0 | p0 e1 | p1 e1].
  std::vector<int64_t> order;
  for (const auto& [a, b] :
       {std::pair{0, 70}, std::pair{150, 210}, std::pair{70, 150}, std::pair{210, 300}})
    for (int64_t r = a; r < b; ++r) order.push_back(r);
  const std::vector<int64_t> by_expert{0, 130, 300};
  HostTensor inp = uniform({M, IC}, 31), weight = uniform({2, OC, IC}, 32),
             dout = uniform({M, OC}, 33);
  HostTensor inp2({M, IC}), dout2({M, OC});
  for (int64_t r = 0; r < M; ++r) {
    std::copy(inp.f32() + order[r] * IC, inp.f32() + (order[r] + 1) * IC, inp2.f32() + r * IC);
    std::copy(dout.f32() + order[r] * OC, dout.f32() + (order[r] + 1) * OC, dout2.f32() + r * OC);
  }
  HostTensor out({M, OC}), out2({M, OC}), dinp({M, IC}), dinp2({M, IC});
  HostTensor dw = constant({2, OC, IC}, 0.0f), dw2 = constant({2, OC, IC}, 0.0f);
  ops::grouped_linear_forward(out.t(), inp.t(), weight.t(), off, weight_of);
  ops::grouped_linear_forward(out2.t(), inp2.t(), weight.t(), by_expert);
  ops::grouped_linear_backward(dinp.t(), dw.t(), dout.t(), inp.t(), weight.t(), off, weight_of);
  ops::grouped_linear_backward(dinp2.t(), dw2.t(), dout2.t(), inp2.t(), weight.t(), by_expert);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t o = order[r];  // the row in the peers' order, of expert weight_of[its group]
    const int64_t g = std::upper_bound(off.begin(), off.end(), o) - off.begin() - 1;
    const float* w = weight.f32() + weight_of[g] * OC * IC;  // (OC, IC)
    for (int64_t c = 0; c < OC; ++c)
      EXPECT_NEAR(out[o * OC + c], out2[r * OC + c],
                  reorder_bound(inp.f32() + o * IC, 1, w + c * IC, 1, IC));
    for (int64_t c = 0; c < IC; ++c)
      EXPECT_NEAR(dinp[o * IC + c], dinp2[r * IC + c],
                  reorder_bound(dout.f32() + o * OC, 1, w + c, IC, OC));
  }
  for (int64_t i = 0; i < 2 * OC * IC; ++i) EXPECT_NEAR(dw[i], dw2[i], 1e-4);
  EXPECT_THROW(ops::grouped_linear_forward(out.t(), inp.t(), weight.t(), off,
                                           std::vector<int64_t>{0, 1, 2, 1}),
               Error);
}

// bf16 operands (the CPU multiplies them through oneDNN where it has AVX512-BF16, a group at a
// time): the same products as the fp32 path, summed in another order, so the two agree to the
// reordering bound; with groups sharing a weight, an empty group, and dweight accumulating.
TEST(GroupedLinear, Bf16OperandsComputeTheSameProducts) {
  const int64_t IC = 40, OC = 24, M = 300;
  const std::vector<int64_t> off{0, 70, 70, 210, 300}, weight_of{0, 1, 0, 1};
  HostTensor inp = uniform({M, IC}, 41), weight = uniform({2, OC, IC}, 42),
             dout = uniform({M, OC}, 43);
  for (HostTensor* x : {&inp, &weight, &dout}) ops::round_to(x->t(), DType::bf16);
  const HostTensor dw0 = uniform({2, OC, IC}, 44);
  HostTensor out32({M, OC}), out16({M, OC}), dinp32({M, IC}), dinp16({M, IC});
  HostTensor dw32 = dw0, dw16 = dw0;
  ops::grouped_linear_forward(out32.t(), inp.t(), weight.t(), off, weight_of);
  ops::grouped_linear_forward(out16.t(), inp.t(), weight.t(), off, weight_of, DType::bf16);
  ops::grouped_linear_backward(dinp32.t(), dw32.t(), dout.t(), inp.t(), weight.t(), off, weight_of);
  ops::grouped_linear_backward(dinp16.t(), dw16.t(), dout.t(), inp.t(), weight.t(), off, weight_of,
                               DType::bf16);
  std::vector<double> mag(2 * OC * IC, 0.0);
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    const int64_t w = weight_of[g];
    const float* wg = weight.f32() + w * OC * IC;
    for (int64_t r = off[g]; r < off[g + 1]; ++r) {
      for (int64_t c = 0; c < OC; ++c)
        ASSERT_NEAR(out16[r * OC + c], out32[r * OC + c],
                    reorder_bound(inp.f32() + r * IC, 1, wg + c * IC, 1, IC))
            << "out " << r << "," << c;
      for (int64_t i = 0; i < IC; ++i)
        ASSERT_NEAR(dinp16[r * IC + i], dinp32[r * IC + i],
                    reorder_bound(dout.f32() + r * OC, 1, wg + i, IC, OC))
            << "dinp " << r << "," << i;
      for (int64_t c = 0; c < OC; ++c)
        for (int64_t i = 0; i < IC; ++i)
          mag[w * OC * IC + c * IC + i] += std::fabs(double{dout[r * OC + c]} * inp[r * IC + i]);
    }
  }
  for (int64_t j = 0; j < 2 * OC * IC; ++j)
    ASSERT_NEAR(dw16[j], dw32[j],
                (M + 2) * double{std::numeric_limits<float>::epsilon()} *
                    (mag[static_cast<size_t>(j)] + std::fabs(dw0[j])))
        << "dweight " << j;
}

TEST(GroupedLinear, RefusesBadOffsets) {
  HostTensor inp({10, 4}), weight({2, 3, 4}), out({10, 3});
  EXPECT_THROW(
      ops::grouped_linear_forward(out.t(), inp.t(), weight.t(), std::vector<int64_t>{0, 5}), Error);
  EXPECT_THROW(
      ops::grouped_linear_forward(out.t(), inp.t(), weight.t(), std::vector<int64_t>{0, 6, 11}),
      Error);
  EXPECT_THROW(
      ops::grouped_linear_forward(out.t(), inp.t(), weight.t(), std::vector<int64_t>{0, 6, 4}),
      Error);
}

}  // namespace
}  // namespace llmt::test
