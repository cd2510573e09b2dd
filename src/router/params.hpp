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
constexpr int kGateSlices = 8;  // H slices: CTAs per cluster, one slice each (gate/order.hpp)
constexpr int kGateWarps = 8;   // warps per CTA
constexpr int kGateStep = 32;   // columns of one warp step: 8 per lane of a quad (one 16-byte load)

// Columns of each slice: ceil(H / slices), rounded up to whole steps.
MK_HD constexpr int64_t gate_slice_width(int64_t hidden) {
  return (hidden + int64_t(kGateSlices) * kGateStep - 1) / (int64_t(kGateSlices) * kGateStep) * kGateStep;
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

// Quantizing x in the gate (GateParams::x_q): the CTA keeps its tile's x of one slice in shared
// memory after kSmemBytes — kRows rows of the slice's columns, each row padded by 16 bytes so the
// MMAs' 16-byte reads of 8 rows fall in 8 bank groups — and quantizes it once the slice is
// loaded. Needs slices of whole 128-column groups (a group never straddles two CTAs).
// The tilings that can: the cluster kernels (decode). The looped and pipelined ones (prefill) leave
// x to quantize_tokens (src/tuning/heuristic.cpp, gate_quantizes_x: why).
MK_HD constexpr bool gate_tiling_quantizes_x(GateKernel k) {
  return k == GateKernel::cluster_16x8 || k == GateKernel::cluster_32x8 || k == GateKernel::cluster_32x32;
}
MK_HD constexpr int64_t gate_x_row_bytes(int64_t hidden) { return gate_slice_width(hidden) * 2 + 16; }
MK_HD constexpr bool gate_slices_hold_groups(int64_t hidden) { return gate_slice_width(hidden) % 128 == 0; }
template <int MT, int NT>
MK_HD constexpr int64_t gate_quantizing_smem_bytes(int64_t hidden) {
  return GateTile<MT, NT>::kSmemBytes + int64_t(GateTile<MT, NT>::kRows) * gate_x_row_bytes(hidden);
}
// Entries of the pipelined kernel's step table for H: at most ceil(H / 32) steps plus one partial
// step per slice.
MK_HD constexpr int64_t gate_step_table_entries(int64_t hidden) {
  return (hidden + kGateStep - 1) / kGateStep + kGateSlices;
}

// The pipelined kernel (gate/pipelined.cuh): a CTA per 128 x COLS tile of tokens x experts (COLS
// 64, or 32 where 64-column tiles leave SMs idle: twice the CTAs, 4 warps each), a ring of
// kGatePipeStages stages of kGatePipeGroup steps. Stages of 4 steps, 4 deep: the fastest of
// 1 x 6, 2 x 6 and 4 x 4 under ncu (DeepSeek-V3 T=16384 gate 510 / 497 / 477 µs; Qwen3 115 / 118 /
// 110 µs).
constexpr int kGatePipeRows = 128, kGatePipeCols = 64, kGatePipeNarrowCols = 32;
MK_HD constexpr int gate_pipe_step_bytes(int cols) { return (kGatePipeRows + cols) * kGateStep * 2; }  // 12 or 10 KB
constexpr int kGatePipeStepBytes = gate_pipe_step_bytes(kGatePipeCols);
constexpr int kGatePipeGroup = 4, kGatePipeStages = 4;
// Shared memory of the pipelined kernel for H: the ring, then the step table (two int32 a step).
MK_HD constexpr int64_t gate_pipelined_smem_bytes(int64_t hidden, int cols = kGatePipeCols) {
  return int64_t(kGatePipeStages) * kGatePipeGroup * gate_pipe_step_bytes(cols) + 8 * gate_step_table_entries(hidden);
}

}  // namespace moekit::kernels::router
