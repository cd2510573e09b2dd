// fp8.cuh — the device side of FP8 quantization (docs/design.md, "FP8"), one spelling for every
// kernel that quantizes: quantize_tokens (x), the up GEMM's epilogue (act) and quantize_weights.
// ref::quantize_group is the same arithmetic on the host, bit for bit:
//   amax = max |v| over the group, NaN if any v is NaN (max.NaN: fmaxf would drop a NaN);
//   a = max(amax, 2^-100)  (NaN stays NaN), scale = a / 448, q = e4m3_rn_satfinite(v · (448 / a)).
// The divisions are IEEE (the library builds without fast math), the product is one rounding.
#pragma once

#include <cstdint>

#include "common/device.cuh"  // kFullMask

namespace moekit::dev {

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kFp8AmaxFloor = 0x1p-100f;
// moekit::kFp8Block for the kernels: the columns of an activation group, the rows and columns of
// a weight block (quant/quantize.cu checks the two agree).
inline constexpr int kFp8Block = 128;

// max(a, b), NaN if either is NaN.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// The running amax of a group: max(amax, |v|), NaN-propagating.
__device__ __forceinline__ float amax_step(float amax, float v) { return max_nan(amax, fabsf(v)); }

// The group's multipliers from its amax: `inv` quantizes (v · inv), `scale` dequantizes (q · scale).
struct Fp8Scale {
  float inv, scale;
};
__device__ __forceinline__ Fp8Scale fp8_scale(float amax) {
  const float a = max_nan(amax, kFp8AmaxFloor);
  return {__fdiv_rn(kFp8Max, a), __fdiv_rn(a, kFp8Max)};
}

// Two values as two e4m3 bytes (low byte = lo), round to nearest even, finite saturation (±448;
// NaN stays NaN).
__device__ __forceinline__ uint16_t pack_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(lo), "f"(hi));
  return r;
}
// The NaN-propagating max over aligned groups of kLanes lanes (xor 1, 2, ..., kLanes/2); every
// lane of a group ends with it. All 32 lanes take part. A max: the order of the steps changes no bit.
template <int kLanes>
__device__ __forceinline__ float lanes_amax(float amax) {
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) amax = max_nan(amax, __shfl_xor_sync(kFullMask, amax, off));
  return amax;
}

// Four values as four e4m3 bytes, v[0] in the low byte.
__device__ __forceinline__ uint32_t pack_e4m3x4(float v0, float v1, float v2, float v3) {
  return uint32_t(pack_e4m3x2(v0, v1)) | (uint32_t(pack_e4m3x2(v2, v3)) << 16);
}

}  // namespace moekit::dev
