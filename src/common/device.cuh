// device.cuh — small device helpers shared by the stage kernels.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/canon.hpp"

namespace moekit::dev {

constexpr unsigned kFullMask = 0xffffffffu;

// The butterfly of canon::tree_sum32: every lane ends with the same, order-fixed sum.
__device__ __forceinline__ float warp_tree_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = canon::add(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// Inclusive prefix sum over the lanes (Hillis-Steele with shuffles): lane i gets v_0 + ... + v_i.
__device__ __forceinline__ int32_t warp_inclusive_sum(int32_t v) {
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int32_t u = __shfl_up_sync(kFullMask, v, off);
    if (lane >= off) v += u;
  }
  return v;
}

__device__ __forceinline__ float bf16_lo(uint32_t packed) { return __uint_as_float(packed << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t packed) { return __uint_as_float(packed & 0xffff0000u); }

__device__ __forceinline__ int lane_id() { return int(threadIdx.x & 31); }

// Programmatic dependent launch (common/launch.hpp): every kernel calls pdl_wait() before it
// reads a predecessor's output (a no-op when launched without PDL), then pdl_trigger() so the
// next kernel may be scheduled; its own pdl_wait() still waits for this grid to finish.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// The two at a kernel's entry: triggering at once lets the next grid queue behind this one. The
// one kernel that does otherwise is the FP8 mma.sync GEMM at the forward's up -> down boundary
// (Params::boundary: up triggers late, down prefetches weights before its wait;
// gemm/mma_sync/kernel.cuh, docs/design.md "PDL launches").
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

}  // namespace moekit::dev
