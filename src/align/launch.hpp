// launch.hpp — stage 2's internal launcher (host-only): the layer, align() and the EP path's send
// order call it on validated arguments. One launch of the planner's kernel, no host sync.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/moe.hpp"

namespace moekit::detail {

// Where align writes the layout of `assignments` ids over `experts` experts.
struct AlignOutputs {
  int32_t* sorted_ids;       // [max_blocks * block_m]
  int32_t* block_expert;     // [max_blocks]
  int32_t* num_rows_padded;  // [1]
  int32_t* expert_counts;    // [experts]
  int32_t* status;           // [1]: kStatusExpertIdOutOfRange
  int32_t* grid_scratch;     // [kAlignMaxCtas, experts + 1]: AlignKernel::grid only
  int64_t max_blocks;
};
// The layer's: the aligned layout in its workspace.
AlignOutputs align_outputs(const ForwardPlan& plan, const Workspace& ws);

// T = 0 still launches: the GEMMs read num_rows_padded = 0 and block_expert = -1 from it.
// expert_load [experts] (the caller's load counter, validated) or nullptr: when given, the kernel's
// counting instance adds this call's counts to it; nullptr runs the kernel without the counter.
void launch_align(AlignKernel kernel, const int32_t* topk_ids, int64_t assignments, int experts, int block_m,
                  const AlignOutputs& out, int64_t* expert_load, cudaStream_t stream);

}  // namespace moekit::detail
