// params.hpp — the contract of stage 1's kernels, host and device: their parameters, and the
// geometry the planner (src/tuning) needs to choose among them (shared memory, tile sizes). No
// device code.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/canon.hpp"  // MK_HD
#include "moekit/moe.hpp"    // kMaxTopk

namespace moekit::kernels::router {

// Per-token slots of the chosen experts (route() rejects k above kMaxTopk).
constexpr int kTopkSlots = int(kMaxTopk);

// The selection kernels (select.cuh, select_cta.cuh), and the CUDA-core logits of an f32 w_gate.
struct Params {
  const __nv_bfloat16* x;   // [T, H]        (when logits are computed)
  const void* w_gate;       // [E, H] bf16 or f32
  const float* logits;      // [T, E]        (when given)
  const float* score_bias;  // [E] or null
  int32_t* topk_ids;        // [T, k]
  float* topk_weights;      // [T, k]
  int64_t tokens, hidden;
  int experts, topk;
  bool sigmoid, renormalize;
  int n_group, topk_group;  // n_group 0: plain top-k
  float routed_scaling_factor;
};
constexpr int kWarpsPerBlock = 4;   // a warp per token (select.cuh)
constexpr int kLogitTokens = 8;     // tokens per warp of the f32 logits kernel
constexpr int kCtaMaxExperts = 256; // a thread per expert (select_cta.cuh)

// The tensor-core logits of a bf16 w_gate (gate/).
struct GateParams {
  const __nv_bfloat16* x;       // [T, H]
  const __nv_bfloat16* w_gate;  // [E, H]
  float* logits;                // [T, E]
  int64_t tokens, hidden;
  int experts;
  // FP8 layers (RouterPlan::quantize_x): the cluster kernels also quantize the x they read, as
  // quantize_tokens does (bitwise), into x_q [T, H] e4m3 and x_scale [T, ceil(H/128)]. Null
  // otherwise.
  uint8_t* x_q;
  float* x_scale;
};
constexpr int kGateSlices = 8;  // slices of the order: CTAs per cluster, one slice each (gate/order.cuh)
constexpr int kGateWarps = 8;   // roles of a slice: warps per CTA
constexpr int kGateStep = 32;   // columns of one warp step: 8 per lane of a quad (one 16-byte load)
constexpr int kGateBlock = 128; // columns of one block of the order: 4 steps, and one FP8 scale group
constexpr int kGateBlockSteps = kGateBlock / kGateStep;

// The order's blocks of H: block b (columns [128b, 128b + 128), the last one partial) belongs to
// slice b % 8 and, within it, to role (b / 8) % 8 (gate/order.cuh).
MK_HD constexpr int64_t gate_blocks(int64_t hidden) { return (hidden + kGateBlock - 1) / kGateBlock; }
// Blocks of slice r: b = r + 8m, m < gate_slice_blocks(H, r).
MK_HD constexpr int64_t gate_slice_blocks(int64_t hidden, int r) {
  return gate_blocks(hidden) > r ? (gate_blocks(hidden) - r + kGateSlices - 1) / kGateSlices : 0;
}
// Blocks of role w of slice r: b = r + 8w + 64j, j < gate_role_blocks(H, r, w).
MK_HD constexpr int64_t gate_role_blocks(int64_t hidden, int r, int w) {
  constexpr int64_t kStride = int64_t(kGateSlices) * kGateWarps;
  const int64_t first = r + int64_t(kGateSlices) * w;
  return gate_blocks(hidden) > first ? (gate_blocks(hidden) - first + kStride - 1) / kStride : 0;
}

// Dynamic shared memory of a cluster or looped instance (gate/warp_partial.cuh): the per-warp load
// staging, which the warp partials reuse after the main loop. MT: 16-token row tiles per CTA; NT:
// 8-expert column tiles.
template <int MT, int NT>
struct GateTile {
  static constexpr int kRows = MT * 16, kCols = NT * 8;
  // Steps a warp keeps in flight (loads issued together, then the MMAs): decode tiles are bound
  // by load latency, larger tiles by registers.
  static constexpr int kUnroll = MT * NT == 1 ? 4 : 2;
  static constexpr int kChunks = NT + 2 * MT;                           // 16-byte loads per lane per step
  static constexpr int kStageBytes = kUnroll * kChunks * 32 * 16;       // per warp
  static constexpr int kPartialBytes = kRows * kCols * 4;               // per warp
  static constexpr int kWarpBytes = kStageBytes > kPartialBytes ? kStageBytes : kPartialBytes;
  static constexpr int kSmemBytes = kGateWarps * kWarpBytes;
};

// Quantizing x in the gate (GateParams::x_q): the CTA keeps its tile's x of its slice in shared
// memory after kSmemBytes — kRows rows of the slice's blocks side by side (block r + 8m at column
// 128m), each row padded by 16 bytes so the MMAs' 16-byte reads of 8 rows fall in 8 bank groups —
// and quantizes it once the slice is loaded: a block of the order is one 128-column group, so no
// group needs two CTAs, whatever H.
// The tilings that can: the cluster kernels (decode). The looped and pipelined ones (prefill) leave
// x to quantize_tokens (src/tuning/heuristic.cpp, gate_quantizes_x: why).
MK_HD constexpr bool gate_tiling_quantizes_x(GateKernel k) {
  return k == GateKernel::cluster_16x8 || k == GateKernel::cluster_32x8 || k == GateKernel::cluster_32x32;
}
MK_HD constexpr int64_t gate_x_row_bytes(int64_t hidden) { return gate_slice_blocks(hidden, 0) * kGateBlock * 2 + 16; }
template <int MT, int NT>
MK_HD constexpr int64_t gate_quantizing_smem_bytes(int64_t hidden) {
  return GateTile<MT, NT>::kSmemBytes + int64_t(GateTile<MT, NT>::kRows) * gate_x_row_bytes(hidden);
}
// Entries of the pipelined kernel's block table for H: one a block.
MK_HD constexpr int64_t gate_block_table_entries(int64_t hidden) { return gate_blocks(hidden); }

// The pipelined kernel (gate/pipelined.cuh): a CTA per 128 x COLS tile of tokens x experts (COLS
// 64, or 32 where 64-column tiles leave SMs idle: twice the CTAs, 4 warps each), a ring of
// kGatePipeStages stages, each one block of the order (kGatePipeGroup = 4 steps). Stages of 4
// steps, 4 deep: the fastest of 1 x 6, 2 x 6 and 4 x 4 under ncu when a stage was 4 steps of the
// older step-interleaved order (DeepSeek-V3 T=16384 gate 510 / 497 / 477 µs; Qwen3 115 / 118 / 110).
constexpr int kGatePipeRows = 128, kGatePipeCols = 64, kGatePipeNarrowCols = 32;
MK_HD constexpr int gate_pipe_step_bytes(int cols) { return (kGatePipeRows + cols) * kGateStep * 2; }  // 12 or 10 KB
constexpr int kGatePipeStepBytes = gate_pipe_step_bytes(kGatePipeCols);
constexpr int kGatePipeGroup = kGateBlockSteps, kGatePipeStages = 4;
// Shared memory of the pipelined kernel for H: the ring, then the block table (an int32 a block).
MK_HD constexpr int64_t gate_pipelined_smem_bytes(int64_t hidden, int cols = kGatePipeCols) {
  return int64_t(kGatePipeStages) * kGatePipeGroup * gate_pipe_step_bytes(cols) + 4 * gate_block_table_entries(hidden);
}

}  // namespace moekit::kernels::router
