// order.cuh — the fixed summation order of the tensor-core router logits (x·w_gateᵀ, bf16 w_gate),
// shared by every gate kernel: one logit's order depends on H alone, never on T or the tile
// instance, so logits are deterministic and batch-invariant (a token's logits do not depend on
// the other tokens of the batch).
//   - H is cut into blocks of kGateBlock = 128 columns (the last one partial, zero-filled), each
//     4 steps of 32 columns; a step is two m16n8k16 MMAs (warp_partial.cuh, mma_step_half);
//   - block b belongs to slice b % 8 and, within it, to role (b / 8) % 8 (params.hpp);
//   - a role accumulates its blocks in ascending order, each block's 4 steps in ascending order,
//     in one chain on the tensor cores;
//   - the role partials are added in role order (a slice), then the slice partials in slice order.
// Why blocks, and roles that own whole blocks: the pipelined prefill kernel streams a role's
// blocks one ring stage each, so it folds a role's partial once a block or less (32 FADDs per 64
// MMAs) instead of once a step; the decode clusters keep all 8 CTAs busy (slice = b % 8); and a
// block is an FP8 scale group, so the quantizing clusters hold whole groups for any H.
// They are not the CPU oracle's FP32 order: tests bound the difference, and the selection from
// them (select.cuh) is bitwise the oracle's selection from them.
#pragma once

#include <cstdint>

#include "router/params.hpp"

namespace moekit::kernels::router {

// The blocks of role w of slice r, and their steps: step s (0 <= s < steps()) is step s % 4 of
// the role's block s / 4; column(s) is where its 32 columns start.
struct GateRole {
  int64_t hidden;
  int r, w;
  __device__ GateRole(int64_t h, int slice, int role) : hidden(h), r(slice), w(role) {}
  __device__ int64_t blocks() const { return gate_role_blocks(hidden, r, w); }
  __device__ int64_t steps() const { return blocks() * kGateBlockSteps; }
  // Block j of the role: b = r + 8w + 64j.
  __device__ int64_t block(int64_t j) const {
    return r + int64_t(kGateSlices) * w + int64_t(kGateSlices) * kGateWarps * j;
  }
  __device__ int64_t column(int64_t s) const {
    return block(s / kGateBlockSteps) * kGateBlock + (s % kGateBlockSteps) * kGateStep;
  }
  // Where step s's columns sit in the CTA's x tile of the slice (blocks r + 8m side by side at
  // column 128m, params.hpp): block b = r + 8(w + 8j) is the slice's block m = w + 8j.
  __device__ int64_t slice_column(int64_t s) const {
    return (int64_t(w) + int64_t(kGateWarps) * (s / kGateBlockSteps)) * kGateBlock + (s % kGateBlockSteps) * kGateStep;
  }
};

}  // namespace moekit::kernels::router
