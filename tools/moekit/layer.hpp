// layer.hpp — one MoE layer's weights on the GPU, generated there from the seed (weights are
// GBs: never built on the host), plus identical copies of them for L2 rotation in benchmarks.
// Definitions: layer.cuh, compiled into bench.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "moekit/moe.hpp"
#include "presets.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

// Value distributions of the generated layer (all N(0, std²), never exact zeros).
// x ~ N(0, 1): unit-scale activations, as after an RMSNorm.
inline constexpr float kXStd = 1.0f;
// w_gate ~ N(0, kRouterLogitStd² / H) makes logits ~ N(0, kRouterLogitStd²): an O(1) spread like
// trained routers, so top-k picks are neither ties nor one-hot.
inline constexpr float kRouterLogitStd = 1.0f;
// DeepSeek-V3's score-correction bias ~ N(0, kScoreBiasStd²): it exercises the bias path and
// changes some selections. A bias is fixed per expert and the picks sit in the scores' upper
// tail, so it skews the loads far more than its size suggests: with grouped top-8 of 256 experts,
// std 0.05 (a quarter of the scores' ~0.2 spread) gave per-expert loads a coefficient of
// variation of 0.77 and the busiest expert ~4x the mean at every T (the bench's rows and a
// simulation alike), the skew `--skew` is for; 0.01 gives ~0.18 and ~1.5x. A trained model's
// bias is fitted to balance the loads, so the balanced bench takes the small one.
inline constexpr float kScoreBiasStd = 0.01f;
// w13 ~ N(0, 1/H) and w2 ~ N(0, 1/F) (std 1/sqrt(K)): every GEMM output stays O(1).

// One full set of the layer's weights.
struct WeightCopy {
  DeviceBuffer w_gate;  // [E, H] bf16
  DeviceBuffer w13;     // [E, 2F, H] bf16
  DeviceBuffer w2;      // [E, H, F] bf16
};

class GpuLayer {
 public:
  GpuLayer(const LayerSpec& spec, uint64_t seed, cudaStream_t stream);

  const LayerSpec& spec() const { return spec_; }
  uint64_t seed() const { return seed_; }
  int copies() const { return int(copies_.size()); }
  int64_t copy_bytes() const;  // bytes of one WeightCopy

  // Adds copies (bitwise identical to copy 0: same seed) until there are `want`, while at least
  // `keep_free_bytes` of device memory stay free. Returns the number of copies now held.
  int ensure_copies(int want, int64_t keep_free_bytes, cudaStream_t stream);

  Tensor w_gate(int copy) const;
  Tensor w13(int copy) const;
  Tensor w2(int copy) const;
  Tensor score_bias() const;  // [E] f32, or an empty Tensor when the layer has no bias
  const std::vector<float>& score_bias_host() const { return bias_host_; }
  // Replaces the score bias (the --skew calibration); an empty vector removes it.
  void set_score_bias(const std::vector<float>& bias, cudaStream_t stream);

  MoeInputs inputs(int copy, const Tensor& x) const;

 private:
  LayerSpec spec_;
  uint64_t seed_;
  std::vector<WeightCopy> copies_;
  std::vector<float> bias_host_;
  DeviceBuffer bias_;
};

// x [T, H] bf16 ~ N(0, kXStd²), generated on the GPU from (seed, rng_stream).
DeviceBuffer random_activations(int64_t tokens, int64_t hidden, uint64_t seed, uint64_t rng_stream,
                                cudaStream_t stream);
// n bf16 values ~ N(0, std²) (never zero) into `out`: the fill every weight comes from.
void fill_normal_bf16(void* out, int64_t n, float std, uint64_t seed, uint64_t rng_stream, cudaStream_t stream);

}  // namespace moekit::cli
