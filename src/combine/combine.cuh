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

__global__ void __launch_bounds__(kThreads) combine_kernel(Params p) {
  const int64_t vecs_per_row = p.hidden / 8;
  const int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (v >= p.tokens * vecs_per_row) return;
  const int64_t t = v / vecs_per_row, c = (v % vecs_per_row) * 8;
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
  uint32_t o[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    o[q] = uint32_t(canon::float_to_bf16_bits(s[2 * q])) | (uint32_t(canon::float_to_bf16_bits(s[2 * q + 1])) << 16);
  *reinterpret_cast<uint4*>(p.y + t * p.hidden + c) = make_uint4(o[0], o[1], o[2], o[3]);
}

}  // namespace moekit::kernels::combine
