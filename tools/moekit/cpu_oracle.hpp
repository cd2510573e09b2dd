// cpu_oracle.hpp — `moekit check --cpu`: the CPU oracle on a
// small random layer shaped like a preset. It runs router_logits -> route -> align (for every
// compiled block_m) -> the staged pipeline the GPU follows (bf16 act and y_rows, combine), checks
// the invariants of each stage, and compares the staged result with the naive loop (moe_tokens).
// Included by check.cpp, and by main.cpp for cpu_oracle_spec (the layer it checks first).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "bench.hpp"
#include "layer.hpp"
#include "moekit/reference.hpp"
#include "rng.hpp"

namespace moekit::cli {

// 37 tokens: prime, so T·k is no multiple of any block_m and the last blocks are partial.
inline constexpr int64_t kCpuOracleTokens = 37;
// H = 256 is exactly one pass of the router's 32 lanes x 8-element chunks; F = 128 keeps the
// double-precision loop fast while the sums stay long enough to show bf16 rounding.
inline constexpr int64_t kCpuOracleHidden = 256, kCpuOracleInter = 128;
// Up to 64 experts: every preset's grouping (DeepSeek-V3: 8 groups) still divides evenly.
inline constexpr int64_t kCpuOracleMaxExperts = 64;
// H or F given on the command line are honoured up to this (the double-precision loops' cost).
inline constexpr int64_t kCpuOracleMaxDim = 1024;

namespace oracle {

using ref::bf16;

struct Failures {
  std::vector<std::string> list;
  void expect(bool ok, const std::string& what) {
    if (!ok && list.size() < 20) list.push_back(what);
  }
};

// The same draws and zero rule as the GPU fill (layer.cuh).
inline std::vector<bf16> random_bf16(int64_t n, float std, uint64_t seed, uint64_t stream) {
  std::vector<bf16> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    bf16 b = ref::to_bf16(std * hash_normal(seed, stream, uint64_t(i)));
    if (ref::to_float(b) == 0.0f) b = ref::to_bf16(std * 0x1p-6f);
    v[size_t(i)] = b;
  }
  return v;
}

inline void check_routing(const ref::Routing& r, int64_t T, int64_t E, int64_t k, const RouterOptions& opt,
                          Failures& f) {
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> seen;
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = r.ids[size_t(t * k + j)];
      const float w = r.weights[size_t(t * k + j)];
      f.expect(e >= 0 && e < E, "token " + std::to_string(t) + ": expert id " + std::to_string(e) + " out of range");
      f.expect(seen.insert(e).second, "token " + std::to_string(t) + ": expert " + std::to_string(e) + " chosen twice");
      f.expect(std::isfinite(w) && w >= 0, "token " + std::to_string(t) + ": weight " + std::to_string(w) + " not finite >= 0");
      sum += w;
    }
    // k <= 16 float adds of values <= 1: a few ulp; 1e-5 relative is far above that.
    if (opt.renormalize)
      f.expect(std::fabs(sum - opt.routed_scaling_factor) <= 1e-5f * opt.routed_scaling_factor,
               "token " + std::to_string(t) + ": renormalized weights sum to " + std::to_string(sum));
  }
}

inline void check_aligned(const ref::Aligned& al, const std::vector<int32_t>& ids, const ForwardPlan& plan, Failures& f) {
  const MoeShape& s = plan.shape;
  const int64_t A = s.tokens * s.topk, bm = plan.block_m();
  const std::string where = "align block_m=" + std::to_string(bm) + ": ";
  f.expect(al.status == 0, where + "status bits set for valid ids");
  std::vector<int32_t> hist(size_t(s.experts), 0);
  for (int32_t e : ids) ++hist[size_t(e)];
  f.expect(hist == al.expert_counts, where + "expert_counts differ from the histogram of topk_ids");
  int64_t padded = 0;
  for (int32_t c : hist) padded += (c + bm - 1) / bm * bm;
  f.expect(al.num_rows_padded == padded, where + "num_rows_padded " + std::to_string(al.num_rows_padded) +
                                             " != sum of counts rounded up to block_m = " + std::to_string(padded));
  f.expect(al.num_rows_padded % bm == 0 && al.num_rows_padded <= plan.max_rows(),
           where + "num_rows_padded not a multiple of block_m or above max_rows = T*k + E*(block_m-1)");
  f.expect(int64_t(al.sorted_ids.size()) == al.num_rows_padded, where + "sorted_ids length != num_rows_padded");
  std::vector<int> times(size_t(A), 0);
  const int64_t used_blocks = al.num_rows_padded / bm;
  int32_t prev_expert = -1;
  for (int64_t b = 0; b < used_blocks; ++b) {
    const int32_t e = al.block_expert[size_t(b)];
    f.expect(e >= 0 && e < s.experts, where + "block " + std::to_string(b) + " has no expert");
    f.expect(e >= prev_expert, where + "blocks not in expert order");
    prev_expert = e;
    int32_t prev_a = -1;
    for (int64_t r = b * bm; r < (b + 1) * bm; ++r) {
      const int32_t a = al.sorted_ids[size_t(r)];
      if (a == A) continue;  // padding sentinel
      f.expect(a >= 0 && a < A, where + "sorted_ids[" + std::to_string(r) + "] = " + std::to_string(a) + " out of range");
      if (a < 0 || a >= A) continue;
      ++times[size_t(a)];
      f.expect(ids[size_t(a)] == e, where + "assignment " + std::to_string(a) + " sits in a block of another expert");
      f.expect(a > prev_a, where + "assignments of one block not ascending (unstable sort)");
      prev_a = a;
    }
  }
  for (int64_t a = 0; a < A; ++a)
    f.expect(times[size_t(a)] == 1, where + "assignment " + std::to_string(a) + " appears " +
                                        std::to_string(times[size_t(a)]) + " times in sorted_ids");
  for (int64_t b = used_blocks; b < int64_t(al.block_expert.size()); ++b)
    f.expect(al.block_expert[size_t(b)] == -1, where + "block_expert past the used blocks is not -1");
}

// y through the GPU's stages in sorted order: act and y_rows rounded to bf16 where the kernels
// store them, then combine. [T, H] bf16.
inline std::vector<bf16> staged_y(const MoeShape& s, const ref::Aligned& al, int64_t bm, const std::vector<bf16>& x,
                                  const std::vector<bf16>& w13, const std::vector<bf16>& w2, const ref::Routing& r) {
  const int64_t H = s.hidden, F = s.inter, A = s.tokens * s.topk;
  std::vector<bf16> y_rows(size_t(A * H));
  for (int64_t row = 0; row < al.num_rows_padded; ++row) {
    const int32_t a = al.sorted_ids[size_t(row)];
    if (a == A) continue;
    const int64_t t = a / s.topk, e = al.block_expert[size_t(row / bm)];
    const std::vector<double> act = ref::expert_act(&x[size_t(t * H)], &w13[size_t(e * 2 * F * H)], H, F);
    std::vector<bf16> act16(static_cast<size_t>(F));
    for (int64_t i = 0; i < F; ++i) act16[size_t(i)] = ref::to_bf16(float(act[size_t(i)]));
    const std::vector<double> out = ref::expert_down_row(act16.data(), &w2[size_t(e * H * F)], r.weights[size_t(a)], H, F);
    for (int64_t h = 0; h < H; ++h) y_rows[size_t(a * H + h)] = ref::to_bf16(float(out[size_t(h)]));
  }
  return ref::combine(y_rows.data(), s.tokens, s.topk, H);
}

}  // namespace oracle

// The layer `check --cpu` runs: the preset scaled down (H, F to kCpuOracleHidden / Inter, E to at
// most kCpuOracleMaxExperts, k to at most E; grouped top-k off if the scaled E does not take it),
// except the values given on the command line (`a`), which are kept as given: main.cpp refuses
// those the oracle cannot take (cli_checks.hpp) before this runs.
inline LayerSpec cpu_oracle_spec(const LayerArgs& a, const LayerSpec& preset, int64_t T, bool verbose) {
  LayerSpec spec = preset;
  MoeShape& s = spec.shape;
  s.tokens = T;
  s.hidden = a.hidden >= 0 ? a.hidden : kCpuOracleHidden;
  s.inter = a.inter >= 0 ? a.inter : kCpuOracleInter;
  if (a.experts < 0) s.experts = std::min(s.experts, kCpuOracleMaxExperts);
  if (a.topk < 0) s.topk = std::min(s.topk, s.experts);
  RouterOptions& opt = spec.router;
  if (a.experts < 0 && a.n_group < 0 && opt.n_group > 0 &&
      (s.experts % opt.n_group != 0 || opt.topk_group * (s.experts / opt.n_group) < s.topk)) {
    if (verbose)
      std::printf("note: %lld experts do not fit n_group=%lld topk_group=%lld: grouped top-k off\n",
                  (long long)s.experts, (long long)opt.n_group, (long long)opt.topk_group);
    opt.n_group = opt.topk_group = 0;
  }
  return spec;
}

inline int run_cpu_oracle(const LayerArgs& args, const LayerSpec& preset, int64_t T, uint64_t seed) {
  LayerSpec spec = cpu_oracle_spec(args, preset, T, true);
  const MoeShape& s = spec.shape;
  const RouterOptions& opt = spec.router;
  std::printf("moekit check: CPU oracle on a scaled-down %s, T=%lld\n", spec.str().c_str(), (long long)T);
  const int64_t H = s.hidden, F = s.inter, E = s.experts, k = s.topk;
  const std::vector<ref::bf16> x = oracle::random_bf16(T * H, kXStd, seed, kStreamX);
  const std::vector<ref::bf16> wg = oracle::random_bf16(E * H, kRouterLogitStd / std::sqrt(float(H)), seed, kStreamWGate);
  const std::vector<ref::bf16> w13 = oracle::random_bf16(E * 2 * F * H, 1.0f / std::sqrt(float(H)), seed, kStreamW13);
  const std::vector<ref::bf16> w2 = oracle::random_bf16(E * H * F, 1.0f / std::sqrt(float(F)), seed, kStreamW2);
  std::vector<float> bias;
  if (spec.score_bias)
    for (int64_t e = 0; e < E; ++e) bias.push_back(kScoreBiasStd * hash_normal(seed, kStreamScoreBias, uint64_t(e)));

  oracle::Failures f;
  const std::vector<float> logits = ref::router_logits(x.data(), wg.data(), DType::bf16, T, H, E);
  const ref::Routing r = ref::route(logits.data(), bias.empty() ? nullptr : bias.data(), T, E, k, opt);
  oracle::check_routing(r, T, E, k, opt, f);
  const ref::Routing again = ref::route(logits.data(), bias.empty() ? nullptr : bias.data(), T, E, k, opt);
  f.expect(again.ids == r.ids && std::equal(again.weights.begin(), again.weights.end(), r.weights.begin(),
                                            [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; }),
           "route is not deterministic");
  std::printf("  route: %lld tokens x k=%lld: ids distinct and in range, weights finite%s\n", (long long)T,
              (long long)k, opt.renormalize ? ", sums = routed_scaling_factor" : "");
  if (f.list.empty()) {  // the later stages assume valid ids
    std::vector<int64_t> all(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) all[size_t(t)] = t;
    const std::vector<double> naive = ref::moe_tokens(s, x.data(), w13.data(), w2.data(), r.ids.data(), r.weights.data(), all);
    std::set<int> block_ms;
    for (const GemmConfig& c : compiled_gemm_configs()) block_ms.insert(c.block_m);
    for (int bm : block_ms) {
      GemmConfig cfg;
      for (const GemmConfig& c : compiled_gemm_configs())
        if (c.block_m == bm) cfg = c;
      const ForwardPlan plan = plan_forward_with(s, cfg, cfg);
      const ref::Aligned al = ref::align(r.ids.data(), T, k, E, bm, plan.max_blocks());
      oracle::check_aligned(al, r.ids, plan, f);
      const std::vector<ref::bf16> y = oracle::staged_y(s, al, bm, x, w13, w2, r);
      double worst = 0;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> got(static_cast<size_t>(H)), want(naive.begin() + t * H, naive.begin() + (t + 1) * H);
        for (int64_t h = 0; h < H; ++h) got[size_t(h)] = ref::to_float(y[size_t(t * H + h)]);
        double err = ref::rel_norm_error(got, want);
        worst = std::max(worst, std::isnan(err) ? INFINITY : err);
      }
      f.expect(worst <= kYRelTolerance, "block_m=" + std::to_string(bm) + ": staged y vs naive loop rel err " +
                                            std::to_string(worst) + " above the bound");
      std::printf("  align block_m=%d: %lld assignments each once, num_rows_padded %d (max_rows %lld); "
                  "staged y vs naive loop: rel err max %.3e (bound %.0e)\n",
                  bm, (long long)(T * k), al.num_rows_padded, (long long)plan.max_rows(), worst, kYRelTolerance);
    }
  }
  for (const std::string& m : f.list) std::printf("  FAILED: %s\n", m.c_str());
  std::printf(f.list.empty() ? "oracle OK\n" : "oracle FAILED\n");
  return f.list.empty() ? kExitOk : kExitFailed;
}

}  // namespace moekit::cli
