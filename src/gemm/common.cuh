// common.cuh — what both expert-GEMM families share: the contract of a launch (params.hpp: Mode,
// Params) and the device helpers of their operand loads and epilogues.
//
// Stages 3 and 4 are one GEMM contract in two modes. A work item multiplies one block of the
// aligned layout (block_m rows, all of one expert: block_expert[b]) by one column tile of that
// expert's weights:
//   Up   — A = x rows gathered through sorted_ids (token a/k of assignment a), B = w13 [2F, H];
//          out = act [max_rows, F] in sorted order, act = silu(gate)·up.
//   Down — A = act rows in sorted order, B = w2 [H, F]; out = y_rows [T·k, H] at the assignment
//          row a = sorted_ids[r], times the routing weight of a (or split-K partials).
// Padding rows (sorted_ids = T·k) are zero-filled on load and never stored.
// The families: mma_sync/ (decode: mma.sync + a cp.async ring) and sm90/ (prefill: wgmma + TMA).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/async_copy.cuh"  // dev::smem_addr: the one spelling of a shared-memory address
#include "gemm/params.hpp"        // Mode, Params, cols_per_tile

namespace moekit::kernels::gemm {

// Two floats as one packed bf16x2 word (round to nearest even), low half first.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

using dev::smem_addr;

}  // namespace moekit::kernels::gemm
