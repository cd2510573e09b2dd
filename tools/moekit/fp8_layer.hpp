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

// n elements of T from the device (synchronous cudaMemcpy).
template <class T>
std::vector<T> copy_to_host(const void* p, int64_t n) {
  std::vector<T> v(size_t(std::max<int64_t>(n, 0)));
  if (n > 0) MK_CUDA_CHECK(cudaMemcpy(v.data(), p, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

struct Fp8Check {
  bool ok = false;
  std::vector<int32_t> topk_ids, expert_counts;
  double fidelity = 0, calc_diff = 0;
  std::string summary;
};

// The finished forward (ws, y) on FP8 copy 0 against the oracles on sampled tokens; only the
// experts those tokens use are copied to the host.
Fp8Check check_fp8(const GpuLayer& layer, const Fp8Weights& fp8, const ForwardPlan& plan, const Workspace& ws,
                   const Tensor& x, const Tensor& y, int check_tokens, cudaStream_t stream);

}  // namespace moekit::cli
