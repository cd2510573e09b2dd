// combine.cuh — stage 5: y[t] = Σ_j y_rows[t*k + j], slot order, FP32 sum, bf16 out.
// A thread owns 8 columns of one token (16-byte loads and stores); no atomics, so the result is
// bitwise deterministic and equals the CPU oracle (canon::add in the same order).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/device.cuh"

namespace moekit::kernels::combine {

struct Params {
  const __nv_bfloat16* y_rows;  // [T*k, H]; gathered: [rows, H]
  __nv_bfloat16* y;             // [T, H]
  int64_t tokens, hidden;
  int topk;
  const int32_t* row_of = nullptr;  // gathered: [T*k], row j of token t at y_rows[row_of[t*k+j]]; -1: absent
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

// The (j, s) terms are walked in the oracle's order, j outer and s inner, kTermsInFlight at a
// time: all loads of a group go out before its first add, so T=1 decode waits for
// ceil(k*S / kTermsInFlight) memory latencies instead of k*S (k=2, S=8: one, not 16). Split-K
// is a decode technique (few tiles), so the 16 terms' registers cost no needed occupancy.
constexpr int kTermsInFlight = 16;

__global__ void __launch_bounds__(kThreads) combine_partials_kernel(PartialParams p) {
  dev::pdl_enter();
  int64_t t, c;
  if (!thread_columns(p.tokens, p.hidden, t, c)) return;
  const int64_t split_stride = p.tokens * p.topk * p.hidden;
  const float* rows = p.partials + t * p.topk * p.hidden + c;  // term (j, s) at j*H + s*split_stride
  const int terms = p.topk * p.splits;
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int j = 0, sp = 0;  // the next term to load
  for (int first = 0; first < terms; first += kTermsInFlight) {
    float4 v[kTermsInFlight][2];  // (term, half)
#pragma unroll
    for (int g = 0; g < kTermsInFlight; ++g) {
      if (first + g < terms) {
        const float* row = rows + j * p.hidden + sp * split_stride;
        v[g][0] = *reinterpret_cast<const float4*>(row);
        v[g][1] = *reinterpret_cast<const float4*>(row + 4);
        if (++sp == p.splits) sp = 0, ++j;
      }
    }
#pragma unroll
    for (int g = 0; g < kTermsInFlight; ++g) {
      if (first + g < terms) {
        const float r[8] = {v[g][0].x, v[g][0].y, v[g][0].z, v[g][0].w, v[g][1].x, v[g][1].y, v[g][1].z, v[g][1].w};
#pragma unroll
        for (int q = 0; q < 8; ++q) s[q] = canon::add(s[q], r[q]);
      }
    }
  }
  store_bf16x8(p.y + t * p.hidden + c, s);
}

// The k rows in order, kRowsInFlight at a time: all loads of a group go out before its first add
// (one memory latency for k <= 8, not k). Not all 16: this kernel also runs at prefill sizes,
// where 8 rows in 64 registers (launch bounds: 4 CTAs per SM) keep enough loads in flight for
// HBM bandwidth even at k = 2.
constexpr int kRowsInFlight = 8;

// kGathered (the EP path): row j of token t is y_rows[row_of[t*k + j]]. An absent row (-1, an
// assignment that overflowed decode's capacity) reads as -0.0, the exact identity of FP32
// addition (s + -0.0 == s for every s, zeros' signs included), so the adds and their order are
// the plain combine's and the result is bitwise its result when every row is present.
template <bool kGathered>
__global__ void __launch_bounds__(kThreads, 4) combine_kernel(Params p) {
  dev::pdl_enter();
  int64_t t, c;
  if (!thread_columns(p.tokens, p.hidden, t, c)) return;
  const __nv_bfloat16* rows = p.y_rows + (kGathered ? 0 : t * p.topk * p.hidden) + c;  // plain: row j at j*H
  constexpr uint32_t kNegZeros = 0x80008000u;  // two bf16 -0.0
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int first = 0; first < p.topk; first += kRowsInFlight) {
    uint4 r[kRowsInFlight];
#pragma unroll
    for (int g = 0; g < kRowsInFlight; ++g) {
      if (first + g < p.topk) {
        const int64_t row = kGathered ? p.row_of[t * p.topk + first + g] : first + g;
        r[g] = row >= 0 ? *reinterpret_cast<const uint4*>(rows + row * p.hidden)
                        : make_uint4(kNegZeros, kNegZeros, kNegZeros, kNegZeros);
      }
    }
#pragma unroll
    for (int g = 0; g < kRowsInFlight; ++g) {
      if (first + g < p.topk) {
        const uint32_t w[4] = {r[g].x, r[g].y, r[g].z, r[g].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          s[2 * q] = canon::add(s[2 * q], dev::bf16_lo(w[q]));
          s[2 * q + 1] = canon::add(s[2 * q + 1], dev::bf16_hi(w[q]));
        }
      }
    }
  }
  store_bf16x8(p.y + t * p.hidden + c, s);
}

}  // namespace moekit::kernels::combine
