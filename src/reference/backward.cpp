// backward.cpp — the CPU oracle of the backward pass (moekit/reference.hpp, "Backward"): the
// experts' gradients (moe_backward) and the router's (router_backward), in double. Nothing here is
// a bitwise contract: the backward kernels' FP32 sums are measured against it by relative-norm
// error (docs/design.md, "Backward").
#include <cmath>
#include <vector>

#include "moekit/reference.hpp"
#include "reference/internal.hpp"

namespace moekit::ref {

namespace {

// What one assignment's backward leaves for the weight gradients.
struct AssignmentGrad {
  int64_t expert = -1;        // -1: no row (an id outside [0, E))
  std::vector<double> act_w;  // [F] w·act: dW2_e += dy_tᵀ·(w·act) (= (w·dy_t)ᵀ·act)
  std::vector<double> dh;     // [2F] dg|du: dW13_e += dhᵀ·x_t
};

double weight_value(const void* w, DType dtype, int64_t i) {
  return dtype == DType::f32 ? double(static_cast<const float*>(w)[i]) : double(to_float(static_cast<const bf16*>(w)[i]));
}

}  // namespace

MoeGrads moe_backward(const MoeShape& s, const bf16* x, const bf16* w13, const bf16* w2, const int32_t* topk_ids,
                      const float* topk_weights, const bf16* dy, const std::vector<int64_t>& tokens,
                      bool weight_grads) {
  const int64_t n = int64_t(tokens.size()), H = s.hidden, F = s.inter, E = s.experts, k = s.topk;
  MoeGrads out;
  out.dx.assign(size_t(n * H), 0.0);
  out.d_topk_weights.assign(size_t(n * k), 0.0);
  if (weight_grads) {
    out.dw13.assign(size_t(E * 2 * F * H), 0.0);
    out.dw2.assign(size_t(E * H * F), 0.0);
  }
  std::vector<AssignmentGrad> kept(size_t(n * k));  // [n, k]

  // Per token: D, dw, dh of each slot, and dx summed over j in slot order.
  parallel_for(n, [&](int64_t i) {
    const int64_t t = tokens[size_t(i)];
    const bf16* xr = x + t * H;    // [H]
    const bf16* dyr = dy + t * H;  // [H]
    double* dx = out.dx.data() + i * H;
    std::vector<double> g(static_cast<size_t>(F)), u(static_cast<size_t>(F)), D(static_cast<size_t>(F));
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = topk_ids[t * k + j];
      if (e < 0 || e >= E) continue;
      const double w = topk_weights[t * k + j];
      const bf16* w13e = w13 + e * 2 * F * H;  // [2F, H]
      const bf16* w2e = w2 + e * H * F;        // [H, F]
      for (int64_t f = 0; f < F; ++f) {
        double gf = 0, uf = 0, df = 0;
        for (int64_t c = 0; c < H; ++c) {
          const double xv = to_float(xr[c]);
          gf += xv * to_float(w13e[f * H + c]);
          uf += xv * to_float(w13e[(F + f) * H + c]);
          df += double(to_float(dyr[c])) * to_float(w2e[c * F + f]);
        }
        g[size_t(f)] = gf, u[size_t(f)] = uf, D[size_t(f)] = df;
      }
      AssignmentGrad& a = kept[size_t(i * k + j)];
      a.expert = e;
      a.act_w.resize(size_t(F));
      a.dh.resize(size_t(2 * F));
      double dw = 0;
      for (int64_t f = 0; f < F; ++f) {
        const double sg = internal::silu(g[size_t(f)]);
        const double act = sg * u[size_t(f)];
        dw += D[size_t(f)] * act;
        const double dact = w * D[size_t(f)];
        a.act_w[size_t(f)] = w * act;
        a.dh[size_t(f)] = dact * u[size_t(f)] * internal::silu_grad(g[size_t(f)]);
        a.dh[size_t(F + f)] = dact * sg;
      }
      out.d_topk_weights[size_t(i * k + j)] = dw;
      for (int64_t r = 0; r < 2 * F; ++r) {
        const double d = a.dh[size_t(r)];
        for (int64_t c = 0; c < H; ++c) dx[c] += d * to_float(w13e[r * H + c]);
      }
    }
  });

  if (!weight_grads) return out;
  // Per expert: its assignments in list order, j inner; an expert with none keeps its zeros.
  parallel_for(E, [&](int64_t e) {
    double* dw13 = out.dw13.data() + e * 2 * F * H;  // [2F, H]
    double* dw2 = out.dw2.data() + e * H * F;        // [H, F]
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const AssignmentGrad& a = kept[size_t(i * k + j)];
        if (a.expert != e) continue;
        const int64_t t = tokens[size_t(i)];
        for (int64_t c = 0; c < H; ++c) {
          const double dyv = to_float(dy[t * H + c]);
          for (int64_t f = 0; f < F; ++f) dw2[c * F + f] += dyv * a.act_w[size_t(f)];
        }
        for (int64_t r = 0; r < 2 * F; ++r)
          for (int64_t c = 0; c < H; ++c) dw13[r * H + c] += a.dh[size_t(r)] * to_float(x[t * H + c]);
      }
  });
  return out;
}

MoeGrads moe_backward(const MoeShape& s, const bf16* x, const bf16* w13, const bf16* w2, const int32_t* topk_ids,
                      const float* topk_weights, const bf16* dy) {
  std::vector<int64_t> all(static_cast<size_t>(s.tokens));
  for (int64_t t = 0; t < s.tokens; ++t) all[size_t(t)] = t;
  return moe_backward(s, x, w13, w2, topk_ids, topk_weights, dy, all);
}

RouterGrads router_backward(const double* d_topk_weights, const float* logits, const int32_t* topk_ids,
                            int64_t tokens, int64_t experts, int64_t topk, const RouterOptions& opt,
                            const GateOperands& gate) {
  const int64_t T = tokens, E = experts, k = topk;
  const double r = opt.routed_scaling_factor;
  RouterGrads out;
  out.d_logits.assign(size_t(T * E), 0.0);
  parallel_for(T, [&](int64_t t) {
    const float* l = logits + t * E;  // [E]
    const int32_t* ids = topk_ids + t * k;
    const double* dw = d_topk_weights + t * k;
    std::vector<double> p(static_cast<size_t>(E)), dp(static_cast<size_t>(E), 0.0);
    if (opt.scoring == Scoring::softmax) {
      double m = -INFINITY, sum = 0;
      for (int64_t e = 0; e < E; ++e) m = std::fmax(m, double(l[e]));
      for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(double(l[e]) - m);
      for (double& v : p) v /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) p[size_t(e)] = internal::sigmoid(double(l[e]));
    }
    auto chosen = [&](int64_t j) { return ids[j] >= 0 && ids[j] < E; };
    // The weights' denominator S and, with renormalize, Σ_i dw_i·s_i / S.
    double S = 1.0, mean = 0.0;
    if (opt.renormalize) {
      S = 0.0;
      for (int64_t j = 0; j < k; ++j)
        if (chosen(j)) S += p[size_t(ids[j])];
      for (int64_t j = 0; j < k; ++j)
        if (chosen(j)) mean += dw[j] * p[size_t(ids[j])];
      mean /= S;
    }
    for (int64_t j = 0; j < k; ++j)
      if (chosen(j)) dp[size_t(ids[j])] += r * (dw[j] - mean) / S;
    double* dl = out.d_logits.data() + t * E;
    if (opt.scoring == Scoring::softmax) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += p[size_t(e)] * dp[size_t(e)];
      for (int64_t e = 0; e < E; ++e) dl[e] = p[size_t(e)] * (dp[size_t(e)] - dot);
    } else {
      for (int64_t e = 0; e < E; ++e) dl[e] = dp[size_t(e)] * p[size_t(e)] * (1.0 - p[size_t(e)]);
    }
  });
  if (gate.x == nullptr) return out;
  if (gate.d_logits_aux != nullptr)
    for (int64_t i = 0; i < T * E; ++i) out.d_logits[size_t(i)] += gate.d_logits_aux[i];

  const int64_t H = gate.hidden;
  out.d_w_gate.assign(size_t(E * H), 0.0);
  out.dx.assign(size_t(T * H), 0.0);
  parallel_for(E, [&](int64_t e) {  // d_w_gate[e] = Σ_t d_logits[t, e]·x_t, t ascending
    for (int64_t t = 0; t < T; ++t) {
      const double d = out.d_logits[size_t(t * E + e)];
      for (int64_t c = 0; c < H; ++c) out.d_w_gate[size_t(e * H + c)] += d * to_float(gate.x[t * H + c]);
    }
  });
  parallel_for(T, [&](int64_t t) {  // dx_t = Σ_e d_logits[t, e]·w_gate[e], e ascending
    for (int64_t e = 0; e < E; ++e) {
      const double d = out.d_logits[size_t(t * E + e)];
      for (int64_t c = 0; c < H; ++c)
        out.dx[size_t(t * H + c)] += d * weight_value(gate.w_gate, gate.w_gate_dtype, e * H + c);
    }
  });
  return out;
}

}  // namespace moekit::ref
