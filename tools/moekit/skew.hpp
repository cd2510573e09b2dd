// skew.hpp — `moekit bench --skew`: uneven expert loads produced by the REAL router.
//
// NOTES: the targets are one "hot" expert at 4x the mean load and every other expert spread
// evenly over 0.5x..1.5x (in a seed-chosen order), rescaled so the loads still average 1. A
// token picks an expert at most once, so the hot load is capped at E/k x the mean: for
// Mixtral (E=8, k=2) 4x means "every token", and the other seven average 0.57x.
// The skew comes from the router's score-correction bias (RouterOptions' score_bias: added to
// the scores when experts are *picked*, never to the weights), calibrated on 4096 tokens drawn
// apart from the timed ones: route them on the GPU, compare each expert's count with its
// target, move its bias by a step proportional to log(target/count), repeat with a shrinking
// step, keep the best bias. For DeepSeek-V3 the calibration starts from its own random bias.
// The timed tokens are then routed by moekit::route with that bias; their loads follow the
// targets up to sampling noise (for small T, the reported tokens_per_expert_max_over_mean is
// what counts). Included by bench.cu only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "layer.hpp"
#include "rng.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

inline constexpr int64_t kSkewCalibTokens = 4096;  // ~128 assignments per expert even at E=256, k=8
inline constexpr double kSkewHot = 4.0, kSkewLow = 0.5, kSkewHigh = 1.5;
inline constexpr int kSkewIterations = 120;
inline constexpr double kSkewStepDecay = 0.96;  // step 0.5 -> 0.004 spreads: coarse moves, then fine

struct SkewResult {
  int hot_expert = 0;
  double hot_load = 0, min_other = 0, max_other = 0, worst_log_error = 0;  // loads in units of the mean
};

// Relative target loads (mean 1) for E experts with top-k.
inline std::vector<double> skew_targets(int64_t E, int64_t k, uint64_t seed, int* hot) {
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = E - 1; i > 0; --i)  // Fisher-Yates from the seed
    std::swap(order[size_t(i)], order[size_t(hash3(seed, kStreamSkew, uint64_t(i)) % uint64_t(i + 1))]);
  *hot = int(order[0]);
  std::vector<double> t(size_t(E), 1.0);
  if (E == 1) return t;
  const double hot_load = std::min(kSkewHot, double(E) / double(k));
  double rest = 0;
  for (int64_t i = 1; i < E; ++i) {
    t[size_t(order[size_t(i)])] = E == 2 ? 1.0 : kSkewLow + (kSkewHigh - kSkewLow) * double(i - 1) / double(E - 2);
    rest += t[size_t(order[size_t(i)])];
  }
  for (int64_t i = 1; i < E; ++i) t[size_t(order[size_t(i)])] *= (double(E) - hot_load) / rest;
  t[size_t(*hot)] = hot_load;
  return t;
}

// Typical spread of one token's scores across experts (the bias step's unit), from logits
// ~ N(0, kRouterLogitStd²) as the generated w_gate makes them.
inline double score_spread(const LayerSpec& spec, uint64_t seed) {
  const int64_t E = spec.shape.experts, draws = 256;
  double sum = 0;
  for (int64_t d = 0; d < draws; ++d) {
    std::vector<double> p(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) p[size_t(e)] = kRouterLogitStd * hash_normal(seed, kStreamSkew + 1, uint64_t(d * E + e));
    if (spec.router.scoring == Scoring::softmax) {
      const double m = *std::max_element(p.begin(), p.end());
      double z = 0;
      for (double& v : p) z += (v = std::exp(v - m));
      for (double& v : p) v /= z;
    } else {
      for (double& v : p) v = 1.0 / (1.0 + std::exp(-v));
    }
    const double mean = std::accumulate(p.begin(), p.end(), 0.0) / double(E);
    double var = 0;
    for (double v : p) var += (v - mean) * (v - mean);
    sum += std::sqrt(var / double(E));
  }
  return sum / double(draws);
}

inline SkewResult calibrate_skew(GpuLayer& layer, uint64_t seed, cudaStream_t stream) {
  const LayerSpec& spec = layer.spec();
  const int64_t E = spec.shape.experts, k = spec.shape.topk, T = kSkewCalibTokens, A = T * k;
  SkewResult res;
  const std::vector<double> target = skew_targets(E, k, seed, &res.hot_expert);
  const DeviceBuffer x = random_activations(T, spec.shape.hidden, seed, kStreamCalibX, stream);
  const DeviceBuffer ids(A * 4), weights(A * 4);
  const Tensor xt(x.get(), DType::bf16, {T, spec.shape.hidden});
  const Tensor idt(ids.get(), DType::i32, {T, k}), wt(weights.get(), DType::f32, {T, k});
  std::vector<float> bias = layer.score_bias_host();
  if (bias.empty()) bias.assign(size_t(E), 0.0f);
  std::vector<float> best = bias;
  std::vector<int32_t> host_ids(static_cast<size_t>(A));
  double step = 0.5 * score_spread(spec, seed), best_err = INFINITY;
  const double mean = double(A) / double(E);
  for (int it = 0; it < kSkewIterations; ++it, step *= kSkewStepDecay) {
    layer.set_score_bias(bias, stream);
    route(xt, layer.w_gate(0), Tensor{}, layer.score_bias(), spec.router, idt, wt, stream);
    MK_CUDA_CHECK(cudaMemcpyAsync(host_ids.data(), ids.get(), size_t(A) * 4, cudaMemcpyDeviceToHost, stream));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> count(size_t(E), 0.0);
    for (int32_t e : host_ids) count[size_t(e)] += 1;
    // g_e = log(target / count): +0.5 keeps it finite for an expert nobody picked yet.
    std::vector<double> g(static_cast<size_t>(E));
    double err = 0;
    for (int64_t e = 0; e < E; ++e) {
      g[size_t(e)] = std::log((target[size_t(e)] * mean + 0.5) / (count[size_t(e)] + 0.5));
      // A hot expert capped at "every token" cannot get more: its residual is not an error.
      if (!(count[size_t(e)] >= double(T) && g[size_t(e)] > 0)) err = std::max(err, std::fabs(g[size_t(e)]));
    }
    if (err < best_err) {
      best_err = err;
      best = bias;
      res.hot_load = count[size_t(res.hot_expert)] / mean;
      res.min_other = INFINITY;
      res.max_other = 0;
      for (int64_t e = 0; e < E; ++e)
        if (e != res.hot_expert) {
          res.min_other = std::min(res.min_other, count[size_t(e)] / mean);
          res.max_other = std::max(res.max_other, count[size_t(e)] / mean);
        }
    }
    for (int64_t e = 0; e < E; ++e) bias[size_t(e)] += float(step * std::clamp(g[size_t(e)], -2.0, 2.0));
  }
  res.worst_log_error = best_err;
  layer.set_score_bias(best, stream);
  return res;
}

}  // namespace moekit::cli
