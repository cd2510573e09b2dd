// params.hpp — the contract of stage 2's kernels (align.cuh), host and device: their parameters.
// No device code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::kernels::align {

// The one-warp kernel (decode) holds its ids in registers, 8 rounds of 32: the planner gives it
// at most this many assignments (align.cuh says why 8 rounds).
constexpr int kWarpRounds = 8;
constexpr int kWarpMaxAssignments = 32 * kWarpRounds;

struct Params {
  const int32_t* topk_ids;  // [T*k]
  int32_t* sorted_ids;      // [max_rows]
  int32_t* block_expert;    // [max_blocks]
  int32_t* num_rows_padded; // [1]
  int32_t* expert_counts;   // [E]
  int32_t* status;          // [1]
  int32_t* cta_counts;      // [kAlignMaxCtas, E+1]: align_grid_kernel's per-CTA counts (+ flag)
  int64_t num_assign;       // T*k
  int64_t max_blocks;
  int experts, block_m;
  // [E]: the caller's load counter, or nullptr; read only by the kernels instantiated with
  // kCountLoad = true (align.cuh). Last, so the other fields keep their offsets either way.
  int64_t* expert_load;
};

}  // namespace moekit::kernels::align
