// backward_check.cpp — the check `moekit bench --backward` runs before it times anything: dx and
// d_topk_weights of a GPU backward on sampled tokens against the CPU oracle (ref::moe_backward,
// ref::router_backward), within the bounds of the backward's GPU tests (bench_backward.hpp). Only
// the sampled tokens' rows and the experts they use are copied to the host.
//
// NOTES: dx_t and d_topk_weights[t] depend on token t's own path alone: its x and dy rows, its
// experts' weights, its routing and its logits (the router's d_logits is per token, and dx's
// router part is d_logits[t]·w_gate). So a sub-layer of just the sampled tokens, with their routing
// (the GPU's) and their experts renumbered 0..n_e-1, gives exactly their gradients. The oracle
// runs without dW (not checked here: dW sums every token, which the GPU tests hold; in double it
// would be 3·H·F·8 bytes an expert to hold and fill, DeepSeek-V3's 352 MB), and the sampled tokens
// go through it in batches whose experts' bf16 copies fit kOracleBatchBytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench_backward.hpp"
#include "moekit/reference.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

namespace {

using ref::bf16;

// Host memory one oracle batch may hold for its experts' bf16 weights (3·H·F·2 bytes an expert):
// DeepSeek-V3's 16 sampled tokens (at most 128 experts, 11 GB) then run in one batch, whose
// tokens are the oracle's parallel loop, as Mixtral's and Qwen3's do; an eighth of the device
// host's 128 GiB.
constexpr int64_t kOracleBatchBytes = int64_t(16) << 30;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Rows tokens[0], tokens[1], ... of `t` (row_elems values of T each), in that order.
template <class T>
std::vector<T> sampled_rows(const Tensor& t, const std::vector<int64_t>& tokens, int64_t row_elems) {
  std::vector<T> out(tokens.size() * size_t(row_elems));
  const int64_t row_bytes = row_elems * int64_t(sizeof(T));
  for (size_t i = 0; i < tokens.size(); ++i)
    MK_CUDA_CHECK(cudaMemcpy(out.data() + i * size_t(row_elems),
                             static_cast<const char*>(t.data) + tokens[i] * row_bytes, size_t(row_bytes),
                             cudaMemcpyDeviceToHost));
  return out;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// The experts' part of the oracle for tokens [i0, i1) of the sample (rows i0.. of xs, dys, ids,
// weights): their dx and d_topk_weights into dx_want / d_topk_want, and ‖D ⊙ act‖ of each of their
// assignments (the scale of d_topk_weights' rounding error) into term_scale. Returns the experts
// copied to the host.
int64_t oracle_batch(const GpuLayer& layer, const MoeShape& shape, int64_t i0, int64_t i1, const std::vector<bf16>& xs,
                     const std::vector<bf16>& dys, const std::vector<int32_t>& ids, const std::vector<float>& weights,
                     std::vector<double>& dx_want, std::vector<double>& d_topk_want, std::vector<double>& term_scale) {
  const int64_t H = shape.hidden, F = shape.inter, k = shape.topk, n = i1 - i0;
  std::map<int32_t, int32_t> local;  // expert -> its index in the sub-layer
  std::vector<int32_t> ids_local(size_t(n * k));
  for (int64_t a = 0; a < n * k; ++a)
    ids_local[size_t(a)] = local.emplace(ids[size_t(i0 * k + a)], int32_t(local.size())).first->second;
  const int64_t n_e = int64_t(local.size()), w13_e = 2 * F * H, w2_e = H * F;
  // Uninitialised: every element is overwritten by the copies.
  auto w13 = std::make_unique_for_overwrite<bf16[]>(size_t(n_e * w13_e));
  auto w2 = std::make_unique_for_overwrite<bf16[]>(size_t(n_e * w2_e));
  for (const auto& [e, l] : local) {
    MK_CUDA_CHECK(cudaMemcpy(w13.get() + l * w13_e, layer.w13(0).as<const bf16>() + int64_t(e) * w13_e,
                             size_t(w13_e) * 2, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(w2.get() + l * w2_e, layer.w2(0).as<const bf16>() + int64_t(e) * w2_e, size_t(w2_e) * 2,
                             cudaMemcpyDeviceToHost));
  }
  const bf16* x = xs.data() + i0 * H;    // [n, H]
  const bf16* dy = dys.data() + i0 * H;  // [n, H]
  const MoeShape sub{n, H, F, n_e, k};
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = i;
  const ref::MoeGrads g = ref::moe_backward(sub, x, w13.get(), w2.get(), ids_local.data(), weights.data() + i0 * k, dy,
                                            rows, /*weight_grads=*/false);
  std::copy(g.dx.begin(), g.dx.end(), dx_want.begin() + i0 * H);
  std::copy(g.d_topk_weights.begin(), g.d_topk_weights.end(), d_topk_want.begin() + i0 * k);

  ref::parallel_for(n * k, [&](int64_t a) {
    const int64_t t = a / k;
    const bf16* w13e = w13.get() + ids_local[size_t(a)] * w13_e;  // [2F, H]
    const bf16* w2e = w2.get() + ids_local[size_t(a)] * w2_e;     // [H, F]
    double s2 = 0;
    for (int64_t f = 0; f < F; ++f) {
      double gf = 0, uf = 0, df = 0;
      for (int64_t c = 0; c < H; ++c) {
        const double xv = ref::to_float(x[t * H + c]);
        gf += xv * ref::to_float(w13e[f * H + c]);
        uf += xv * ref::to_float(w13e[(F + f) * H + c]);
        df += double(ref::to_float(dy[t * H + c])) * ref::to_float(w2e[c * F + f]);
      }
      const double term = df * silu(gf) * uf;
      s2 += term * term;
    }
    term_scale[size_t(i0 * k + a)] = std::sqrt(s2);
  });
  return n_e;
}

}  // namespace

BackwardCheck check_backward(const GpuLayer& layer, const MoeShape& shape, const Workspace& fwd_ws, const Tensor& x,
                             const Tensor& dy, const BackwardOutputs& out, int check_tokens, uint64_t seed,
                             cudaStream_t stream) {
  const int64_t T = shape.tokens, H = shape.hidden, F = shape.inter, E = shape.experts, k = shape.topk;
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));  // the backward ran on `stream` (non-blocking)
  BackwardCheck r;
  std::vector<std::string> failures;
  const std::vector<int64_t> tokens = sample_tokens(T, check_tokens, seed);
  const int64_t n = int64_t(tokens.size());
  r.tokens_checked = n;

  // The sampled tokens' rows: inputs, the forward's routing and logits, the GPU's gradients.
  const std::vector<bf16> xs = sampled_rows<bf16>(x, tokens, H), dys = sampled_rows<bf16>(dy, tokens, H);
  const std::vector<int32_t> ids = sampled_rows<int32_t>(fwd_ws.topk_ids, tokens, k);
  const std::vector<float> weights = sampled_rows<float>(fwd_ws.topk_weights, tokens, k);
  const std::vector<float> logits = sampled_rows<float>(fwd_ws.router_logits, tokens, E);
  const std::vector<bf16> dx_gpu = sampled_rows<bf16>(out.dx, tokens, H);
  const std::vector<float> d_topk_gpu = sampled_rows<float>(out.d_topk_weights, tokens, k);
  bool ids_in_range = true;
  for (int32_t e : ids) ids_in_range = ids_in_range && e >= 0 && e < E;

  if (!ids_in_range) {
    failures.push_back("the forward's routing holds an expert id outside [0, E)");
  } else {
    // The experts' part, in batches of consecutive sampled tokens whose experts fit the budget
    // (at least one token a batch).
    std::vector<double> dx_want(size_t(n * H)), d_topk_want(size_t(n * k)), term_scale(size_t(n * k));
    const int64_t max_experts = std::max<int64_t>(k, kOracleBatchBytes / (3 * H * F * 2));
    for (int64_t i0 = 0, i1 = 0; i0 < n; i0 = i1) {
      std::set<int32_t> used;
      for (i1 = i0; i1 < n; ++i1) {
        std::set<int32_t> with = used;
        with.insert(ids.begin() + i1 * k, ids.begin() + (i1 + 1) * k);
        if (i1 > i0 && int64_t(with.size()) > max_experts) break;
        used.swap(with);
      }
      r.experts_copied += oracle_batch(layer, shape, i0, i1, xs, dys, ids, weights, dx_want, d_topk_want, term_scale);
    }

    // The router's part of dx, from the GPU's own d_topk_weights (so only its arithmetic is
    // compared, as the GPU tests do) and the logits the forward scored.
    const std::vector<double> d_topk_d(d_topk_gpu.begin(), d_topk_gpu.end());
    const std::vector<bf16> w_gate = copy_to_host<bf16>(layer.w_gate(0).data, E * H);
    const ref::GateOperands gate{xs.data(), w_gate.data(), DType::bf16, H, nullptr};
    const ref::RouterGrads rg =
        ref::router_backward(d_topk_d.data(), logits.data(), ids.data(), n, E, k, layer.spec().router, gate);

    int64_t worst = tokens[0];
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> got(static_cast<size_t>(H)), want(static_cast<size_t>(H));
      for (int64_t c = 0; c < H; ++c) {
        got[size_t(c)] = ref::to_float(dx_gpu[size_t(i * H + c)]);
        want[size_t(c)] = dx_want[size_t(i * H + c)] + rg.dx[size_t(i * H + c)];
      }
      double err = ref::rel_norm_error(got, want);
      if (std::isnan(err)) err = INFINITY;  // a NaN (poison left unwritten) must fail, and stay the worst
      if (err > r.dx_err_max) r.dx_err_max = err, worst = tokens[size_t(i)];
    }
    if (!(r.dx_err_max <= kBwdDxTol))
      failures.push_back("dx of token " + std::to_string(worst) + " has relative norm error " +
                         fmt("%.3e", r.dx_err_max) + " > " + fmt("%.2e", kBwdDxTol));
    double err2 = 0, scale2 = 0;
    for (size_t a = 0; a < d_topk_gpu.size(); ++a) {
      const double d = double(d_topk_gpu[a]) - d_topk_want[a];
      err2 += d * d, scale2 += term_scale[a] * term_scale[a];
    }
    const double scale = std::sqrt(scale2);  // > 0: the values are never zeros
    r.d_topk_err = !std::isfinite(err2) ? INFINITY : err2 == 0 ? 0.0 : scale > 0 ? std::sqrt(err2) / scale : INFINITY;
    if (!(r.d_topk_err <= kBwdDwTol))
      failures.push_back("d_topk_weights have error " + fmt("%.3e", r.d_topk_err) + " of their terms' norm > " +
                         fmt("%.2e", kBwdDwTol));
  }

  r.ok = failures.empty();
  r.summary = "check backward T=" + std::to_string(T) + ": " + std::to_string(n) + " tokens (0, T-1 and sampled), " +
              std::to_string(r.experts_copied) + " expert slices copied; dx rel err max " + fmt("%.3e", r.dx_err_max) +
              " per token (bound " + fmt("%.2e", kBwdDxTol) + "); d_topk_weights err " + fmt("%.3e", r.d_topk_err) +
              " of their terms' norm (bound " + fmt("%.2e", kBwdDwTol) + "): " + (r.ok ? "OK" : "FAILED") +
              "; dW13, dW2 and d_w_gate not checked here (each sums every token: tests/gpu/backward_test.cu "
              "holds them)";
  for (const std::string& f : failures) r.summary += "\n  " + f;
  return r;
}

}  // namespace moekit::cli
