// silu.cuh — canon::silu for the GEMM epilogues, bit for bit, without the division's branch.
//
// canon::silu is x / (1 + expf(-x)) with an IEEE division. nvcc compiles that division to a
// reciprocal, Newton and residual steps (its fast path), then FCHK and a branch to a slow path
// for operands whose intermediates could leave the normal range. In the wgmma Up epilogue (64
// SiLUs a thread a tile) each branch is its own basic block, so the 64 chains of ~80 cycles ran
// one after another: ~5k cycles a tile with the tensor cores idle (read in the SASS).
// Here the fast path is written out (the same instructions, so the same bits) for a group of
// values, the range test is done once for the group, and the exact canon::silu redoes the group
// only when a value is outside |x| in [2^-64, 64]. Zero is outside it (the fast path turns -0
// into +0): a caller must not feed the accumulators of padding rows, which the zero-filled A rows
// make exactly zero, or those groups take the slow path. The Up epilogues that compute SiLU for
// every row give a padding row (never stored) a gate of 1 instead.
//
// Why the range suffices: d = 1 + expf(-x) lies in [1, 1 + e^64 ~ 6.3e27] (normal), the quotient
// |x| / d >= min(2^-65, 64 / 6.3e27) is normal, and the residual is an exact fma; so no step
// under- or overflows, which is what FCHK tests. GpuSilu.FastPathIsBitwiseCanon (tests/gpu)
// checks every float in the range against canon::silu.
#pragma once

#include "common/canon.hpp"

namespace moekit::dev {

__device__ __forceinline__ bool silu_fast_path_ok(float x) {
  const float a = fabsf(x);
  return a <= 64.0f && a >= 0x1p-64f;  // false for NaN
}

// canon::silu(x) for silu_fast_path_ok(x): the division's fast path written out.
__device__ __forceinline__ float silu_fast_path(float x) {
  const float d = canon::add(1.0f, expf(-x));
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  const float q = __fmul_rn(x, r);
  return __fmaf_rn(r, __fmaf_rn(-d, q, x), q);
}

// out[i] = canon::silu(x[i]) for every i, branch-free unless a value is outside the fast range.
template <int N>
__device__ __forceinline__ void silu_group(const float (&x)[N], float (&out)[N]) {
  bool fast = true;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    out[i] = silu_fast_path(x[i]);
    fast = fast && silu_fast_path_ok(x[i]);
  }
  if (!fast) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = canon::silu(x[i]);
  }
}

}  // namespace moekit::dev
