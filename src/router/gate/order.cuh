// order.cuh — the fixed summation order of the tensor-core router logits (x·w_gateᵀ, bf16 w_gate),
// shared by every gate kernel: one logit's order depends on H alone, never on T or the tile
// instance, so logits are deterministic and batch-invariant (a token's logits do not depend on
// the other tokens of the batch).
//   - H is cut into kGateSlices slices of gate_slice_width(H) columns (a multiple of 32);
//   - within a slice, 32-column steps go round-robin to kGateWarps roles (step s to role
//     s % kGateWarps), each role accumulating its steps in ascending order on the tensor cores;
//   - the role partials are added in role order, then the slice partials in slice order.
// They are not the CPU oracle's FP32 order: tests bound the difference, and the selection from
// them (select.cuh) is bitwise the oracle's selection from them.
#pragma once

#include <cstdint>

#include "router/params.hpp"

namespace moekit::kernels::router {

// Slice r of H: columns [begin, end) in steps(r) steps of 32 (the last one partial); slices past
// the end of H have none (begin and end are then meaningless).
struct GateSlicing {
  int64_t hidden, width;
  __device__ explicit GateSlicing(int64_t h) : hidden(h), width(gate_slice_width(h)) {}
  __device__ int64_t begin(int slice) const { return int64_t(slice) * width; }
  __device__ int64_t end(int slice) const { return min(hidden, begin(slice) + width); }
  __device__ int64_t steps(int slice) const {
    return end(slice) > begin(slice) ? (end(slice) - begin(slice) + kGateStep - 1) / kGateStep : 0;
  }
};

// Steps of role w in a slice of `steps` steps.
__device__ __forceinline__ int64_t gate_role_steps(int64_t steps, int w) {
  return steps > w ? (steps - w + kGateWarps - 1) / kGateWarps : 0;
}

}  // namespace moekit::kernels::router
