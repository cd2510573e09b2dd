// align_launch.hpp — align's kernel parameters and launcher, for other stages' launchers (the EP
// path's send order) without the kernels (each kernel lives in one translation unit, align.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::kernels::align {

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
};

}  // namespace moekit::kernels::align

namespace moekit::detail {
// Launches align on validated Params (align() and the EP path's send order): one warp up to
// kWarpMaxAssignments, one CTA up to kAlignGridMinAssignments, else the cooperative grid
// (p.cta_counts must be set).
void launch_align(kernels::align::Params p, cudaStream_t stream);
}  // namespace moekit::detail
