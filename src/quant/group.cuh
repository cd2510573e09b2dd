// group.cuh — the arithmetic of one 128-column FP8 group, shared by the quantization kernels
// (quantize.cuh) and the router's gate, which quantizes the x it reads (router/gate/x_quant.cuh):
// one spelling, so both are bitwise ref::quantize_group. Device functions only (no kernels: a
// header any stage's kernel file may include).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/canon.hpp"
#include "common/device.cuh"
#include "common/fp8.cuh"

namespace moekit::kernels::quant {

inline constexpr int kGroup = dev::kFp8Block;  // columns of a group, rows and columns of a weight block
inline constexpr int kColsPerThread = 8;  // one 16-byte load of bf16, one 8-byte store of e4m3
inline constexpr int kThreadsPerGroupRow = kGroup / kColsPerThread;  // 16: a half warp

// 8 bf16 (one 16-byte word) as floats, in column order.
__device__ __forceinline__ void unpack_bf16x8(const uint4& w, float (&v)[kColsPerThread]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) v[2 * i] = dev::bf16_lo(u[i]), v[2 * i + 1] = dev::bf16_hi(u[i]);
}

__device__ __forceinline__ float amax_of(float amax, const float (&v)[kColsPerThread]) {
#pragma unroll
  for (int i = 0; i < kColsPerThread; ++i) amax = dev::amax_step(amax, v[i]);
  return amax;
}

// e4m3(v · inv) of 8 values as 8 bytes, v[0] lowest: one FP32 rounding of the product, then the cvt.
__device__ __forceinline__ uint2 quantize_x8(const float (&v)[kColsPerThread], float inv) {
  float s[kColsPerThread];
#pragma unroll
  for (int i = 0; i < kColsPerThread; ++i) s[i] = canon::mul(v[i], inv);
  return make_uint2(dev::pack_e4m3x4(s[0], s[1], s[2], s[3]), dev::pack_e4m3x4(s[4], s[5], s[6], s[7]));
}

}  // namespace moekit::kernels::quant
