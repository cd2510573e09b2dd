// fp8_layer.hpp — the layer's FP8 experts for `moekit bench --dtype fp8` (bench_fp8.cu) and
// `moekit tune --dtype fp8` (tune.cu): e4m3 copies of the bf16 layer's expert weights with
// DeepSeek-V3's 128 x 128 block scales (quantized on the device by moekit::quantize_weights), and
// the check of an FP8 forward against the oracles. Definitions: fp8_layer.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "layer.hpp"
#include "moekit/moe.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

// The bounds of the check, derived in tests/gpu/fp8_forward_test.cu: y against the oracle on the
// same quantized values (act re-quantized by the oracle: a few codes flip), and the layer's
// calc_diff against the unquantized bf16 layer (four e4m3 roundings).
inline constexpr double kFp8FidelityTol = 1.0 / 32;
inline constexpr double kFp8LayerCalcDiffMax = 5e-3;

// One FP8 copy of the layer's expert weights (bitwise identical copies rotate past L2).
struct Fp8Copy {
  DeviceBuffer w13, w13_scale, w2, w2_scale;
};

class Fp8Weights {
 public:
  explicit Fp8Weights(const GpuLayer& layer) : layer_(layer) {}
  const MoeShape& shape() const { return layer_.spec().shape; }
  int64_t copy_bytes() const;
  // Quantizes bf16 copy 0 into FP8 copies until there are `want` (while keep_free bytes stay free).
  int ensure(int want, int64_t keep_free, cudaStream_t stream);
  ExpertWeights at(int c) const;
  // Byte ranges of the FP8 weights (and scales) `stage` reads in copy c, for its read time.
  std::vector<std::pair<const void*, int64_t>> ranges(const std::string& stage, int c,
                                                      const std::vector<int32_t>& touched) const;

 private:
  const GpuLayer& layer_;
  std::vector<Fp8Copy> copies_;
};

struct Fp8Check {
  bool ok = false;
  std::vector<int32_t> topk_ids, expert_counts;
  double fidelity = 0, calc_diff = 0;
  std::string summary;
};

// The check of FP8 forwards of one (layer, T, x) in two halves, as ForwardOracle (bench.hpp) is
// for bf16: the constructor reads the routing and the quantized tokens of a finished forward on
// FP8 copy 0 and computes, for sampled tokens (0, T-1 and evenly spaced between), y in double on
// the same quantized values (ref::moe_tokens_fp8) and on the unquantized bf16 layer
// (ref::moe_tokens) — the costly part, with the used experts copied to the host. check() then
// compares one finished forward of any fp8 plan: fidelity within kFp8FidelityTol, calc_diff below
// kFp8LayerCalcDiffMax, and its routing and quantized x bitwise those the oracles were computed
// from (neither depends on the plan). Synchronises `stream`.
class Fp8Oracle {
 public:
  Fp8Oracle(const GpuLayer& layer, const Fp8Weights& fp8, const MoeShape& shape, const Workspace& ws, const Tensor& x,
            int check_tokens, cudaStream_t stream);
  Fp8Check check(const Workspace& ws, const Tensor& y, cudaStream_t stream) const;
  std::vector<int32_t> touched_experts() const;  // experts with >= 1 assignment, ascending

 private:
  MoeShape shape_;
  std::vector<int32_t> topk_ids_;  // [T, k] of the run the oracles read
  std::vector<float> topk_w_;      // [T, k]
  std::vector<uint8_t> x_q_;       // [T, H] e4m3 bits
  std::vector<float> x_scale_;     // [T, ceil(H/128)]
  std::vector<int64_t> tokens_;    // sampled tokens, ascending
  size_t experts_used_ = 0;        // experts of the sampled tokens (copied to the host)
  std::vector<double> y_fid_, y_unq_;  // [tokens, H]: the two oracles' y
};

// One forward's check: Fp8Oracle(...).check(ws, y), for `moekit bench --dtype fp8`.
Fp8Check check_fp8(const GpuLayer& layer, const Fp8Weights& fp8, const ForwardPlan& plan, const Workspace& ws,
                   const Tensor& x, const Tensor& y, int check_tokens, cudaStream_t stream);

}  // namespace moekit::cli
