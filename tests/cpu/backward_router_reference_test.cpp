// backward_router_reference_test.cpp — the CPU oracle of the router's backward
// (ref::router_backward): d_logits, d_w_gate and the router's part of dx against finite differences
// of route()'s weights in double (the selection held fixed), for softmax and sigmoid scoring, with
// and without renormalisation, grouped top-k, a score bias and a routed scaling factor; the
// properties the math implies; and the layer's router path fed by the experts' d_topk_weights.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backward_fd.hpp"

namespace moekit::testing {
namespace {

using RefRouterBackward = BackwardTest;

struct Routing {
  const char* name;
  RouterOptions opt;
  bool bias;
};
// T 5, E 8, k 3: every combination the forward supports, DeepSeek-V3's last (sigmoid, score
// bias, 4 groups keep 2, renormalised, scaled by 2.5).
const Routing kRoutings[] = {
    {"softmax", {Scoring::softmax, false, 0, 0, 1.0f}, false},
    {"softmax renormalised", {Scoring::softmax, true, 0, 0, 1.0f}, false},
    {"softmax scaled", {Scoring::softmax, false, 0, 0, 2.5f}, false},
    {"softmax grouped renormalised", {Scoring::softmax, true, 4, 2, 1.0f}, false},
    {"sigmoid", {Scoring::sigmoid, false, 0, 0, 1.0f}, false},
    {"sigmoid bias renormalised scaled", {Scoring::sigmoid, true, 0, 0, 2.5f}, true},
    {"sigmoid bias grouped renormalised scaled", {Scoring::sigmoid, true, 4, 2, 2.5f}, true},
};
constexpr int64_t kT = 5, kE = 8, kK = 3;

// route()'s weights of a fixed selection, in double: the function router_backward differentiates
// (scores over all E experts, the chosen ones' unbiased scores, renormalised, scaled). [T, k]
std::vector<double> weights_of(const std::vector<double>& logits, const std::vector<int32_t>& ids, int64_t T,
                               int64_t E, int64_t k, const RouterOptions& opt) {
  std::vector<double> w(size_t(T * k));
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    std::vector<double> p(static_cast<size_t>(E));
    double m = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) m = std::fmax(m, l[e]);
    for (int64_t e = 0; e < E; ++e) {
      p[size_t(e)] = opt.scoring == Scoring::softmax ? std::exp(l[e] - m) : 1.0 / (1.0 + std::exp(-l[e]));
      sum += p[size_t(e)];
    }
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += p[size_t(ids[size_t(t * k + j)])];
    for (int64_t j = 0; j < k; ++j) {
      double v = p[size_t(ids[size_t(t * k + j)])];
      if (opt.scoring == Scoring::softmax) v /= sum;
      if (opt.renormalize) v /= opt.scoring == Scoring::softmax ? chosen / sum : chosen;
      w[size_t(t * k + j)] = v * double(opt.routed_scaling_factor);
    }
  }
  return w;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The bound on |oracle − finite difference| of the router's losses L = Σ c·w (|c| < 1), derived:
// in one logit l, every weight is a + b·σ(l + β) with |b| <= r — a chosen expert's softmax score
// is σ(l − ln B), another's is (e^{l_i}/B)·(1 − σ(l − ln B)); a renormalised weight is the softmax
// of the chosen logits, or for sigmoid r·σ(l)/(σ(l) + A), which rearranges to a logistic in l too
// (and r·σ_i/(A' + σ(l)) to an affine one). |σ⁽⁵⁾| <= 1/4, so |L⁽⁵⁾| <= k·r/4 < 2 (one logit moves
// one token's weights) and Richardson's remainder at h = 2^-12 is h⁴/30·2 < 3e-16. The rounding of
// L (|L| <= T·k·r = 37.5) dominates: 4ε·|L|/h < 1.4e-10. A wrong term (a missing 1/S, the biased
// score, softmax over the k alone without renormalisation) is off by more than 1e-3.
constexpr double kRouterStep = 0x1p-12;
constexpr double kRouterTol = 1e-9;

TEST_F(RefRouterBackward, LogitsMatchFiniteDifferencesOfTheWeights) {
  for (const Routing& r : kRoutings) {
    SCOPED_TRACE(r.name);
    std::vector<float> logits(kT * kE), bias(kE);
    for (float& v : logits) v = uniform(-2.0f, 2.0f);
    for (float& v : bias) v = uniform(-0.5f, 0.5f);
    const ref::Routing fwd = ref::route(logits.data(), r.bias ? bias.data() : nullptr, kT, kE, kK, r.opt);
    std::vector<double> l(logits.begin(), logits.end());
    // The double forward is route()'s: its weights agree with the FP32 ones to a few roundings.
    const std::vector<double> w = weights_of(l, fwd.ids, kT, kE, kK, r.opt);
    for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(w[i], fwd.weights[i], 2e-6 * w[i]) << "weight " << i;

    std::vector<double> c(kT * kK);
    for (double& v : c) v = uniform(-1.0f, 1.0f);
    const ref::RouterGrads g = ref::router_backward(c.data(), logits.data(), fwd.ids.data(), kT, kE, kK, r.opt);
    ASSERT_EQ(g.d_logits.size(), size_t(kT * kE));
    EXPECT_TRUE(g.d_w_gate.empty());
    EXPECT_TRUE(g.dx.empty());
    std::vector<double> fd(l.size());
    for (size_t i = 0; i < l.size(); ++i)
      fd[i] = richardson(l[i], kRouterStep, [&](double v) { l[i] = v; },
                         [&] { return dot(c, weights_of(l, fwd.ids, kT, kE, kK, r.opt)); });
    EXPECT_TRUE(close_to_fd("d_logits", g.d_logits, fd, kRouterTol));
    EXPECT_GT(max_abs(g.d_logits), 1e-2);
  }
}

TEST_F(RefRouterBackward, WhatTheMathImplies) {
  std::vector<float> logits(kT * kE);
  for (float& v : logits) v = uniform(-2.0f, 2.0f);
  std::vector<double> c(kT * kK);
  for (double& v : c) v = uniform(-1.0f, 1.0f);
  auto grads = [&](const RouterOptions& opt) {
    const ref::Routing fwd = ref::route(logits.data(), nullptr, kT, kE, kK, opt);
    return std::make_pair(fwd, ref::router_backward(c.data(), logits.data(), fwd.ids.data(), kT, kE, kK, opt));
  };
  auto is_chosen = [](const ref::Routing& fwd, int64_t t, int64_t e) {
    for (int64_t j = 0; j < kK; ++j)
      if (fwd.ids[size_t(t * kK + j)] == e) return true;
    return false;
  };
  // Softmax: adding a constant to a token's logits changes nothing, so its d_logits sum to 0; an
  // unchosen expert still gets −p_e·Σ_j ds_j·s_j, not 0, unless the weights are renormalised.
  {
    const auto [fwd, g] = grads({Scoring::softmax, false, 0, 0, 1.0f});
    for (int64_t t = 0; t < kT; ++t) {
      double sum = 0, mag = 0;
      for (int64_t e = 0; e < kE; ++e) sum += g.d_logits[size_t(t * kE + e)], mag += std::fabs(g.d_logits[size_t(t * kE + e)]);
      EXPECT_NEAR(sum, 0.0, 1e-15 * (1 + mag)) << "token " << t;
      for (int64_t e = 0; e < kE; ++e)
        if (!is_chosen(fwd, t, e)) EXPECT_NE(g.d_logits[size_t(t * kE + e)], 0.0);
    }
  }
  // Renormalised softmax is the softmax of the chosen logits alone: unchosen experts get 0 (to
  // rounding: Σ_j ds_j·s_j cancels), and the chosen ones' gradients still sum to 0.
  {
    const auto [fwd, g] = grads({Scoring::softmax, true, 0, 0, 1.0f});
    for (int64_t t = 0; t < kT; ++t) {
      double sum = 0;
      for (int64_t e = 0; e < kE; ++e) {
        sum += g.d_logits[size_t(t * kE + e)];
        if (!is_chosen(fwd, t, e)) EXPECT_NEAR(g.d_logits[size_t(t * kE + e)], 0.0, 1e-15) << "token " << t << " expert " << e;
      }
      EXPECT_NEAR(sum, 0.0, 1e-15);
    }
  }
  // Sigmoid scores each expert alone: an unchosen expert gets exactly 0.
  for (bool renormalize : {false, true}) {
    const auto [fwd, g] = grads({Scoring::sigmoid, renormalize, 0, 0, 2.5f});
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t e = 0; e < kE; ++e)
        if (!is_chosen(fwd, t, e)) EXPECT_EQ(g.d_logits[size_t(t * kE + e)], 0.0);
  }
  // The scaling factor scales the gradient: r = 2.5 is 2.5 times r = 1 (to rounding).
  {
    const auto [f1, g1] = grads({Scoring::sigmoid, true, 0, 0, 1.0f});
    const auto [f2, g2] = grads({Scoring::sigmoid, true, 0, 0, 2.5f});
    for (size_t i = 0; i < g1.d_logits.size(); ++i) EXPECT_NEAR(g2.d_logits[i], 2.5 * g1.d_logits[i], 1e-15);
  }
}

// The router's loss through the gate, logits = x·w_gateᵀ in double: [T, H] x and [E, H] w_gate.
double gate_loss(const std::vector<double>& x, const std::vector<double>& w_gate, const std::vector<int32_t>& ids,
                 const std::vector<double>& c, int64_t H, const RouterOptions& opt) {
  std::vector<double> l(size_t(kT * kE), 0.0);
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t e = 0; e < kE; ++e)
      for (int64_t h = 0; h < H; ++h) l[size_t(t * kE + e)] += x[size_t(t * H + h)] * w_gate[size_t(e * H + h)];
  return dot(c, weights_of(l, ids, kT, kE, kK, opt));
}

TEST_F(RefRouterBackward, GateGradientsMatchFiniteDifferences) {
  // x and w_gate on the 2^-5 grid (w_gate in [-1/2, 1/2)): every logit, a sum of 16 products of
  // multiples of 2^-10 below 16, is exact in FP32, so the FP32 logits router_backward takes are
  // the double ones the differences see. Both w_gate dtypes (the values are exact in bf16).
  const int64_t H = 16;
  const Routing& r = kRoutings[6];
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<double> x(kT * H), wg(kE * H);
    for (double& v : x) v = grid();
    for (double& v : wg) v = grid() / 2;
    std::vector<bf16> xb(x.size()), wgb(wg.size());
    std::vector<float> wgf(wg.begin(), wg.end());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = ref::to_bf16(float(x[i]));
    for (size_t i = 0; i < wg.size(); ++i) wgb[i] = ref::to_bf16(float(wg[i]));
    const void* w_gate = dtype == DType::f32 ? static_cast<const void*>(wgf.data()) : wgb.data();
    const std::vector<float> logits = ref::router_logits(xb.data(), w_gate, dtype, kT, H, kE);
    std::vector<float> bias(kE);
    for (float& v : bias) v = uniform(-0.5f, 0.5f);
    const ref::Routing fwd = ref::route(logits.data(), bias.data(), kT, kE, kK, r.opt);
    std::vector<double> c(kT * kK);
    for (double& v : c) v = uniform(-1.0f, 1.0f);
    const ref::RouterGrads g = ref::router_backward(c.data(), logits.data(), fwd.ids.data(), kT, kE, kK, r.opt,
                                                    ref::GateOperands{xb.data(), w_gate, dtype, H});
    ASSERT_EQ(g.d_w_gate.size(), wg.size());
    ASSERT_EQ(g.dx.size(), x.size());
    auto loss = [&] { return gate_loss(x, wg, fwd.ids, c, H, r.opt); };
    std::vector<double> fd_x(x.size()), fd_w(wg.size());
    for (size_t i = 0; i < x.size(); ++i) fd_x[i] = richardson(x[i], kRouterStep, [&](double v) { x[i] = v; }, loss);
    for (size_t i = 0; i < wg.size(); ++i) fd_w[i] = richardson(wg[i], kRouterStep, [&](double v) { wg[i] = v; }, loss);
    // One element of w_gate moves one logit of every token (slope |x| < 1): the logits' bound
    // holds (T tokens' remainders of 3e-16 each). One element of x moves its token's E logits
    // together, with slopes |w_gate| < 1/2: the fifth derivative along that direction is a sum of
    // 8⁵ mixed partials, crudely 4⁵·5!·r·Σ|c| < 1e6 for these logistic forms, a remainder < 1.2e-10
    // at h = 2^-12 (measured with the rounding: 3e-12).
    EXPECT_TRUE(close_to_fd("dx (router)", g.dx, fd_x, kRouterTol));
    EXPECT_TRUE(close_to_fd("d_w_gate", g.d_w_gate, fd_w, kRouterTol));
    EXPECT_GT(max_abs(g.dx), 1e-2);

    // The caller's losses on the logits add their gradient before the gate's products:
    // d_logits, d_w_gate and dx gain aux, auxᵀ·x and aux·w_gate (to rounding: |·| < 16 sums).
    std::vector<float> aux(kT * kE);
    for (float& v : aux) v = uniform(-1.0f, 1.0f);
    const ref::RouterGrads ga = ref::router_backward(c.data(), logits.data(), fwd.ids.data(), kT, kE, kK, r.opt,
                                                     ref::GateOperands{xb.data(), w_gate, dtype, H, aux.data()});
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t e = 0; e < kE; ++e)
        EXPECT_NEAR(ga.d_logits[size_t(t * kE + e)], g.d_logits[size_t(t * kE + e)] + aux[size_t(t * kE + e)], 1e-15);
    for (int64_t e = 0; e < kE; ++e)
      for (int64_t h = 0; h < H; ++h) {
        double want = g.d_w_gate[size_t(e * H + h)];
        for (int64_t t = 0; t < kT; ++t) want += double(aux[size_t(t * kE + e)]) * x[size_t(t * H + h)];
        EXPECT_NEAR(ga.d_w_gate[size_t(e * H + h)], want, 1e-13);
      }
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t h = 0; h < H; ++h) {
        double want = g.dx[size_t(t * H + h)];
        for (int64_t e = 0; e < kE; ++e) want += double(aux[size_t(t * kE + e)]) * wg[size_t(e * H + h)];
        EXPECT_NEAR(ga.dx[size_t(t * H + h)], want, 1e-13);
      }
  }
}

TEST_F(RefRouterBackward, TheLayersRouterPathTakesTheExpertsDtopkWeights) {
  // The whole layer with logits = x·w_gateᵀ: L = Σ_t ⟨dy_t, Σ_j w_tj(logits_t)·FFN_e(x_t)⟩. x
  // reaches L through the FFN and through the logits, so dx = the experts' part (moe_backward,
  // checked against differences with the weights fixed) + the router's part; the router's part is
  // router_backward of moe_backward's d_topk_weights, checked here against differences of L in the
  // logits' x (and w_gate) alone, with the FFN values c_tj = ⟨dy_t, FFN_e(x_t)⟩ from the forward
  // oracle (ref::moe_tokens, one slot at a time, weight 1) held fixed.
  const MoeShape s{kT, 16, 8, kE, kK};
  for (const Routing& r : {kRoutings[1], kRoutings[6]}) {
    SCOPED_TRACE(r.name);
    Layer l = random_layer(s);
    std::vector<double> x(l.x.size()), wg(size_t(kE * s.hidden));
    for (size_t i = 0; i < x.size(); ++i) x[i] = ref::to_float(l.x[i]);
    for (double& v : wg) v = grid() / 4;
    const std::vector<float> wgf(wg.begin(), wg.end());  // exact: multiples of 2^-7
    const std::vector<float> logits = ref::router_logits(l.x.data(), wgf.data(), DType::f32, kT, s.hidden, kE);
    std::vector<float> bias(kE);
    for (float& v : bias) v = uniform(-0.5f, 0.5f);
    const ref::Routing fwd = ref::route(logits.data(), r.bias ? bias.data() : nullptr, kT, kE, kK, r.opt);
    l.ids = fwd.ids;
    l.weights = fwd.weights;

    std::vector<double> c(size_t(kT * kK), 0.0);
    std::vector<int64_t> all(static_cast<size_t>(kT));
    for (int64_t t = 0; t < kT; ++t) all[size_t(t)] = t;
    for (int64_t j = 0; j < kK; ++j) {
      MoeShape one = s;
      one.topk = 1;
      std::vector<int32_t> ids(static_cast<size_t>(kT));
      const std::vector<float> unit(static_cast<size_t>(kT), 1.0f);
      for (int64_t t = 0; t < kT; ++t) ids[size_t(t)] = fwd.ids[size_t(t * kK + j)];
      const std::vector<double> o = ref::moe_tokens(one, l.x.data(), l.w13.data(), l.w2.data(), ids.data(), unit.data(), all);
      for (int64_t t = 0; t < kT; ++t)
        for (int64_t h = 0; h < s.hidden; ++h)
          c[size_t(t * kK + j)] += double(ref::to_float(l.dy[size_t(t * s.hidden + h)])) * o[size_t(t * s.hidden + h)];
    }
    const ref::MoeGrads ge = ref::moe_backward(s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                               l.weights.data(), l.dy.data());
    // d_topk_weights = ⟨D, act⟩ is ⟨dy, FFN⟩ summed the other way round.
    for (size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(ge.d_topk_weights[i], c[i], 1e-12 * (1 + std::fabs(c[i])));
    const ref::RouterGrads gr = ref::router_backward(ge.d_topk_weights.data(), logits.data(), fwd.ids.data(), kT, kE,
                                                     kK, r.opt, ref::GateOperands{l.x.data(), wgf.data(), DType::f32, s.hidden});
    auto loss = [&] { return gate_loss(x, wg, fwd.ids, c, s.hidden, r.opt); };
    std::vector<double> fd_x(x.size()), fd_w(wg.size());
    for (size_t i = 0; i < x.size(); ++i) fd_x[i] = richardson(x[i], kRouterStep, [&](double v) { x[i] = v; }, loss);
    for (size_t i = 0; i < wg.size(); ++i) fd_w[i] = richardson(wg[i], kRouterStep, [&](double v) { wg[i] = v; }, loss);
    // The gate test's bounds with |c| < 40 in place of 1: the remainders scale with |c| (< 5e-9),
    // the rounding with |L| <= T·k·r·40 = 1500 (4ε·|L|/h < 6e-9).
    EXPECT_TRUE(close_to_fd("dx (router)", gr.dx, fd_x, 2e-8));
    EXPECT_TRUE(close_to_fd("d_w_gate", gr.d_w_gate, fd_w, 2e-8));
    EXPECT_GT(max_abs(gr.dx), 1e-2);
    EXPECT_GT(max_abs(ge.d_topk_weights), 1e-1);
  }
}

}  // namespace
}  // namespace moekit::testing
