// combine.cuh — stage 5: y[t] = Σ_j y_rows[t*k + j], slot order, FP32 sum, bf16 out.
// A thread owns 8 columns of one token (16-byte loads and stores); no atomics, so the result is
// bitwise deterministic and equals the CPU oracle (canon::add in the same order).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/device.cuh"

namespace moekit::kernels::combine {

struct Params {
  const __nv_bfloat16* y_rows;  // [T*k, H]
  __nv_bfloat16* y;             // [T, H]
  int64_t tokens, hidden;
  int topk;
};

constexpr int kThreads = 256;

// The 8 columns [c, c+8) of token t this thread owns; false past the last token.
__device__ __forceinline__ bool thread_columns(int64_t tokens, int64_t hidden, int64_t& t, int64_t& c) {
  const int64_t vecs_per_row = hidden / 8;
  const int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (v >= tokens * vecs_per_row) return false;
  t = v / vecs_per_row, c = (v % vecs_per_row) * 8;
  return true;
}

// 8 FP32 sums rounded to bf16 (canon's rounding, as the oracle) in one 16-byte store.
__device__ __forceinline__ void store_bf16x8(__nv_bfloat16* dst, const float (&s)[8]) {
  uint32_t o[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    o[q] = uint32_t(canon::float_to_bf16_bits(s[2 * q])) | (uint32_t(canon::float_to_bf16_bits(s[2 * q + 1])) << 16);
  *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
}

// Split-K's combine: y[t] = Σ_j Σ_s partials[s][t*k+j] (j outer, s inner), FP32, bf16 out.
struct PartialParams {
  const float* partials;  // [S, T*k, H]
  __nv_bfloat16* y;       // [T, H]
  int64_t tokens, hidden;
  int topk, splits;
};

__global__ void __launch_bounds__(kThreads) combine_partials_kernel(PartialParams p) {
  dev::pdl_enter();
  int64_t t, c;
  if (!thread_columns(p.tokens, p.hidden, t, c)) return;
  const int64_t split_stride = p.tokens * p.topk * p.hidden;
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < p.topk; ++j)
    for (int sp = 0; sp < p.splits; ++sp) {
      const float* row = p.partials + sp * split_stride + (t * p.topk + j) * p.hidden + c;
      const float4 a = *reinterpret_cast<const float4*>(row);
      const float4 b = *reinterpret_cast<const float4*>(row + 4);
      const float r[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int q = 0; q < 8; ++q) s[q] = canon::add(s[q], r[q]);
    }
  store_bf16x8(p.y + t * p.hidden + c, s);
}

__global__ void __launch_bounds__(kThreads) combine_kernel(Params p) {
  dev::pdl_enter();
  int64_t t, c;
  if (!thread_columns(p.tokens, p.hidden, t, c)) return;
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < p.topk; ++j) {
    const uint4 r = *reinterpret_cast<const uint4*>(p.y_rows + (t * p.topk + j) * p.hidden + c);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      s[2 * q] = canon::add(s[2 * q], dev::bf16_lo(w[q]));
      s[2 * q + 1] = canon::add(s[2 * q + 1], dev::bf16_hi(w[q]));
    }
  }
  store_bf16x8(p.y + t * p.hidden + c, s);
}

}  // namespace moekit::kernels::combine
