// backward_util.hpp — the host side of the backward's GPU tests (backward_test.cu,
// backward_wgmma_test.cu): one layer's host inputs, the kernel choices a test makes, and the check of
// every gradient against the oracle (ref::moe_backward, ref::router_backward) within the bounds
// derived here. The device run of a case is backward_run.hpp's.
//
// The bounds. u = 2^-8 is bf16's unit roundoff (8 significant bits, round to nearest:
// |x − bf16(x)| <= u·|x|); over model-scaled values a rounding's error is close to uniform, RMS
// ≈ 0.43u relative (u/√3 times E[1/m²]^½ = 0.74 over log-uniform mantissas m). The kernels' FP32
// sums of exact bf16 products add about 2^-24·√K, and σ(g) on the SFU (common/swiglu_grad.cuh)
// about 2^-20 relative: nothing next to these. So the errors are the
// bf16 roundings of h, act_w, dh and of the outputs (x, dy ~ N(0,1), w13 ~ N(0,1/H), w2 ~ N(0,1/F)
// make g, u ~ N(0,1)):
//   act = silu(g)·u from bf16 g and u: u's rounding, and g's through silu (d ln silu/d ln g =
//       1 + g·(1 − σ(g)), about 1 here): ≈ 0.6u RMS an element.
//   dw = ⟨D, act⟩: act's errors, independent over the F terms, give |error| ≈ 0.6u·‖D ⊙ act‖, a
//       dot product's error measured against its terms, not its sum (which may cancel: one token's
//       two weights could be near 0). The norm of the errors over the assignments is held to
//       kDwTol·‖(‖D ⊙ act‖)_a‖; 4u is ~6x the estimate.
//   dh: dg = w·D·u·silu'(g) (rounded g enters through g·silu''/silu', ≈ 0.3 RMS), du = w·D·silu(g),
//       then rounded: ≈ 0.65u. dx = Σ dh·W13 and its rounding: ≈ 0.8u. dW13 = Σ dhᵀ·x: ≈ 0.8u with a
//       bf16 output (the errors of dh are independent over rows, so they do not grow with the sum).
//       dW2 = Σ dyᵀ·bf16(w·act): ≈ 0.75u, ≈ 0.9u in bf16. Each relative norm within 4u: ~5x.
//   Router, fed the GPU's own d_topk_weights (so only its FP32 arithmetic is measured): a few ulps
//       of expf and the warp sums over <= 512 experts, ~1e-6 of the norm: kRouterTol = 2^-14.
//   d_w_gate: d_logits as bf16 hi + lo is d within 2^-16 and the products with bf16 x are exact:
//       ~2^-17 of the norm in f32 (kGateTolF32 = 2^-12); bf16 out adds <= u an element (2^-7).
//   dx with the gate's part: that part is within ~2^-16, so dx keeps its 4u.
// Every kind of indexing fault (a wrong row, expert, weight, slot or tile) is O(1) above these.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_util.hpp"
#include "moekit/backward.hpp"

namespace moekit::test {

constexpr double kU = 1.0 / 256;
constexpr double kDwTol = 4 * kU;
constexpr double kDxTol = 4 * kU;
constexpr double kWeightGradTol = 4 * kU;
constexpr double kRouterTol = 1.0 / 16384;
constexpr double kGateTolF32 = 1.0 / 4096;
constexpr double kGateTolBf16 = 2 * kU;

// One layer's host inputs: model-scaled random values (x, dy ~ N(0,1); w13 ~ N(0, 1/H); w2 ~ N(0,
// 1/F); routing weights in (0, 1]). With a router gradient the routing is route()'s of the logits
// (x·w_gateᵀ with ::gate, else N(0, 1)); without, the given ids or a uniform routing.
struct Case {
  MoeShape s;
  RouterGrad router = RouterGrad::none;
  RouterOptions opt;
  std::vector<int32_t> ids;     // [T, k]
  std::vector<float> weights;   // [T, k]
  std::vector<float> logits;    // [T, E]: router != none
  std::vector<float> aux;       // [T, E] or empty: d_logits_aux (gate)
  std::vector<ref::bf16> x, w13, w2, dy;
  DType w_gate_dtype = DType::bf16;
  std::vector<ref::bf16> w_gate;    // [E, H] (bf16)
  std::vector<float> w_gate_f32;    // [E, H] (f32)
  const void* w_gate_ptr() const {
    return w_gate_dtype == DType::f32 ? static_cast<const void*>(w_gate_f32.data()) : w_gate.data();
  }
};

inline Case make_case(const MoeShape& s, std::mt19937_64& rng, RouterGrad router = RouterGrad::none,
                      const RouterOptions& opt = {}, DType w_gate_dtype = DType::bf16, std::vector<int32_t> ids = {}) {
  Case c;
  c.s = s, c.router = router, c.opt = opt, c.w_gate_dtype = w_gate_dtype;
  const int64_t T = s.tokens, H = s.hidden, F = s.inter, E = s.experts, k = s.topk;
  c.x = random_bf16(size_t(T * H), rng);
  c.w13 = random_bf16(size_t(E * 2 * F * H), rng, 1.0f / std::sqrt(float(H)));
  c.w2 = random_bf16(size_t(E * H * F), rng, 1.0f / std::sqrt(float(F)));
  c.dy = random_bf16(size_t(T * H), rng);
  if (router == RouterGrad::none) {
    c.ids = ids.empty() ? make_routing(RoutingKind::Uniform, T, k, E, rng) : std::move(ids);
    c.weights.resize(size_t(T * k));
    for (float& w : c.weights) w = float(rng() % 1000 + 1) / 1000.0f;
    return c;
  }
  if (router == RouterGrad::gate) {
    if (w_gate_dtype == DType::f32) c.w_gate_f32 = random_f32(size_t(E * H), rng, 1.0f / std::sqrt(float(H)));
    else c.w_gate = random_bf16(size_t(E * H), rng, 1.0f / std::sqrt(float(H)));
    c.logits = ref::router_logits(c.x.data(), c.w_gate_ptr(), w_gate_dtype, T, H, E);
  } else {
    c.logits = random_f32(size_t(T * E), rng);
  }
  const ref::Routing r = ref::route(c.logits.data(), nullptr, T, E, k, opt);
  c.ids = r.ids, c.weights = r.weights;
  return c;
}

// g | u of token t through expert e, in double. [2F]
inline std::vector<double> gate_up(const Case& c, int64_t t, int64_t e) {
  const int64_t H = c.s.hidden, F = c.s.inter;
  std::vector<double> gu(size_t(2 * F), 0.0);
  for (int64_t n = 0; n < 2 * F; ++n)
    for (int64_t i = 0; i < H; ++i)
      gu[size_t(n)] += double(ref::to_float(c.x[size_t(t * H + i)])) * ref::to_float(c.w13[size_t((e * 2 * F + n) * H + i)]);
  return gu;
}

// ‖D ⊙ act‖ of token t through expert e: the scale of its dw's rounding error.
inline double dw_term_scale(const Case& c, int64_t t, int64_t e) {
  const int64_t H = c.s.hidden, F = c.s.inter;
  const std::vector<double> gu = gate_up(c, t, e);
  double s2 = 0;
  for (int64_t f = 0; f < F; ++f) {
    double d = 0;
    for (int64_t i = 0; i < H; ++i)
      d += double(ref::to_float(c.dy[size_t(t * H + i)])) * ref::to_float(c.w2[size_t((e * H + i) * F + f)]);
    const double g = gu[size_t(f)], act = g / (1.0 + std::exp(-g)) * gu[size_t(F + f)];
    s2 += d * act * d * act;
  }
  return std::sqrt(s2);
}

// That of each assignment (0 for an id outside [0, E)).
inline std::vector<double> dw_term_scale(const Case& c) {
  const int64_t E = c.s.experts, k = c.s.topk;
  std::vector<double> scale(c.ids.size(), 0.0);
  ref::parallel_for(int64_t(c.ids.size()), [&](int64_t a) {
    const int64_t e = c.ids[size_t(a)];
    if (e >= 0 && e < E) scale[size_t(a)] = dw_term_scale(c, a / k, e);
  });
  return scale;
}

inline std::vector<double> values_of(const std::vector<unsigned char>& raw, DType dtype) {
  std::vector<double> v;
  if (dtype == DType::f32) {
    std::vector<float> f(raw.size() / 4);
    std::memcpy(f.data(), raw.data(), raw.size());
    v.assign(f.begin(), f.end());
  } else {
    std::vector<ref::bf16> b(raw.size() / 2);
    std::memcpy(b.data(), raw.data(), raw.size());
    v = to_double(b);
  }
  return v;
}

// What one backward leaves, copied back (raw bytes where the dtype varies).
struct Outputs {
  std::vector<ref::bf16> dx;
  std::vector<unsigned char> dw13, dw2, d_w_gate;
  std::vector<float> d_topk, d_router_logits;
  bool operator==(const Outputs&) const = default;
};

// Kernel choices a test makes instead of the planner's, each where the plan allows it. The
// default keeps the planner's plan; mma_sync() runs every GEMM on the mma.sync tile (of tile_rows
// rows where they divide block_m, 0: the planner's), wgmma(h, d, dx, dw) those asked for on the
// wgmma kernels (h, D, dx: block_m 128; h: recomputed; dx: unsplit) and the rest on the mma.sync tile;
// kernels_of(b) the kernels and dx split of another plan b (of the same block_m).
struct PlanOverride {
  bool planner = true;
  int tile_rows = 0;
  bool h_wgmma = false, d_wgmma = false, dx_wgmma = false, dw_wgmma = false;
  int dx_splits = 0;  // 0: the planner's
  static PlanOverride mma_sync(int tile_rows = 0) { return {false, tile_rows}; }
  static PlanOverride wgmma(bool h, bool d, bool dx, bool dw) { return {false, 0, h, d, dx, dw}; }
  static PlanOverride kernels_of(const BackwardPlan& b) {
    return {false, b.tile_rows, b.h_wgmma, b.d_wgmma, b.dx_wgmma, b.dw_wgmma, b.dx_splits};
  }
  void apply(BackwardPlan& p) const {
    if (planner) return;
    if (tile_rows && p.block_m % tile_rows == 0) p.tile_rows = tile_rows;
    if (dx_splits) p.dx_splits = dx_splits;
    use_wgmma_gemms(p, h_wgmma, d_wgmma, dx_wgmma, dw_wgmma);
  }
};
// The planner's kernels (h, D and dx on wgmma wherever block_m is 128, dW at every block_m), and
// every GEMM on the mma.sync tile: the planner's rows, then the 128 x 256 tile.
inline const PlanOverride kPlanVariants[] = {PlanOverride{}, PlanOverride::mma_sync(),
                                             PlanOverride::mma_sync(128)};

// Each check's error over its bound (<= 1 passes), printed when MOEKIT_BACKWARD_ERRORS is set: how
// much margin the bounds above leave on the device.
inline void report_error(const char* what, double error, double bound) {
  EXPECT_LE(error, bound) << what << " (error / bound " << error / bound << ")";
  if (std::getenv("MOEKIT_BACKWARD_ERRORS")) std::printf("    %-16s %.3e  (%.3f of its bound)\n", what, error, error / bound);
}

// Every gradient the plan computes against the oracle, within the bounds above; dW of an expert with
// no rows exactly 0 (or, accumulated, exactly the main_grad it had: dw_init13 / dw_init2, f32 bytes).
inline void check_outputs(const Case& c, const BackwardPlan& plan, const std::vector<unsigned char>& dw_init13,
                          const std::vector<unsigned char>& dw_init2, const Outputs& out) {
  const MoeShape& s = c.s;
  const BackwardOptions& o = plan.options;
  const int64_t T = s.tokens, H = s.hidden, E = s.experts, k = s.topk;
  SCOPED_TRACE(plan.str());
  const ref::MoeGrads want = ref::moe_backward(s, c.x.data(), c.w13.data(), c.w2.data(), c.ids.data(),
                                               c.weights.data(), c.dy.data());
  std::vector<int64_t> counts(size_t(E), 0);
  for (int32_t e : c.ids)
    if (e >= 0 && e < E) ++counts[size_t(e)];

  const std::vector<double> scale = dw_term_scale(c);
  double err2 = 0, scale2 = 0;
  for (size_t a = 0; a < c.ids.size(); ++a) {
    if (c.ids[a] < 0 || c.ids[a] >= E) {
      EXPECT_EQ(out.d_topk[a], 0.0f) << "assignment " << a << " has no expert, so no gradient";
      continue;
    }
    const double d = double(out.d_topk[a]) - want.d_topk_weights[a];
    err2 += d * d, scale2 += scale[a] * scale[a];
  }
  report_error("d_topk_weights", std::sqrt(err2) / std::sqrt(scale2), kDwTol);

  ref::RouterGrads rg;
  if (c.router != RouterGrad::none) {
    const std::vector<double> d_topk(out.d_topk.begin(), out.d_topk.end());
    ref::GateOperands g;
    if (c.router == RouterGrad::gate)
      g = ref::GateOperands{c.x.data(), c.w_gate_ptr(), c.w_gate_dtype, H, c.aux.empty() ? nullptr : c.aux.data()};
    rg = ref::router_backward(d_topk.data(), c.logits.data(), c.ids.data(), T, E, k, c.opt, g);
    if (c.router == RouterGrad::logits) {
      const std::vector<double> got(out.d_router_logits.begin(), out.d_router_logits.end());
      report_error("d_router_logits", ref::rel_norm_error(got, rg.d_logits), kRouterTol);
    } else {
      report_error("d_w_gate", ref::rel_norm_error(values_of(out.d_w_gate, c.w_gate_dtype), rg.d_w_gate),
                   c.w_gate_dtype == DType::f32 ? kGateTolF32 : kGateTolBf16);
    }
  }
  if (o.input_grad) {
    std::vector<double> want_dx = want.dx;
    if (c.router == RouterGrad::gate)
      for (size_t i = 0; i < want_dx.size(); ++i) want_dx[i] += rg.dx[i];
    report_error("dx", ref::rel_norm_error(to_double(out.dx), want_dx), kDxTol);
  }
  if (o.weight_grads) {
    const DType d = o.weight_grad_dtype;
    auto check_dw = [&](const char* name, const std::vector<unsigned char>& raw, const std::vector<unsigned char>& init,
                        const std::vector<double>& ref_dw) {
      std::vector<double> got = values_of(raw, d);
      if (!init.empty()) {
        const std::vector<double> before = values_of(init, DType::f32);
        for (size_t i = 0; i < got.size(); ++i) got[i] -= before[i];
      }
      report_error(name, ref::rel_norm_error(got, ref_dw), kWeightGradTol);
      const size_t per_expert = raw.size() / size_t(E);
      for (int64_t e = 0; e < E; ++e) {
        if (counts[size_t(e)] != 0) continue;
        const unsigned char* p = raw.data() + size_t(e) * per_expert;
        const bool exact = init.empty() ? std::all_of(p, p + per_expert, [](unsigned char b) { return b == 0; })
                                        : std::memcmp(p, init.data() + size_t(e) * per_expert, per_expert) == 0;
        EXPECT_TRUE(exact) << name << " of expert " << e << ", which has no rows, is not exactly "
                           << (init.empty() ? "0" : "its main_grad");
      }
    };
    check_dw("dw13", out.dw13, dw_init13, want.dw13);
    check_dw("dw2", out.dw2, dw_init2, want.dw2);
  }
}

}  // namespace moekit::test
