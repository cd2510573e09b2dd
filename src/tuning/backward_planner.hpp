// backward_planner.hpp — the backward's parts of the one planner (pure host code, unit-tested on
// the CPU): the split-K rules of its reductions, the check of its options, and its workspace
// layout over the same Pieces as the forward's (tuning/workspace.hpp). plan_backward
// (backward_plan.cpp) composes them with the forward plan's GEMM configs into one BackwardPlan.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/backward.hpp"
#include "tuning/workspace.hpp"

namespace moekit::tuning {

// dW2 and dW13: the 128 x 128 output tiles of the experts the routing can touch (min(E, T·k)),
// each reducing over its expert's rows (T·k / touched on average) in 64-row steps.
int plan_weight_grad_splits(const MoeShape& shape, const DeviceInfo& device);
// d_w_gate [E, H] = d_logitsᵀ·x: its 128 x 128 tiles reducing over T in 64-token steps.
int plan_gate_grad_splits(const MoeShape& shape, const DeviceInfo& device);
// The rows of the backward's mma.sync tiles (BackwardPlan::tile_rows) over a layout of block_m:
// 16 below block_m 64, else 64, and the 8-warp 128 x 256 tile for block_m 128 when the touched
// experts average at least kWideTileRowsPerExpert rows. Measured on the H200 (moekit bench
// --backward, docs/perf/NOTES.md "Backward"): the wide tile is faster at 1,024 and 4,096 rows an
// expert (Mixtral T = 4096, 16384: +10%, +28%; Qwen3 T = 16384: +6%), slower at 64 and 256
// (Qwen3 T = 1024, 4096; Mixtral T = 1024: -14 to -17%).
inline constexpr int64_t kWideTileRowsPerExpert = 1024;
int plan_backward_tile_rows(const MoeShape& shape, int block_m);
// The wgmma weight-gradient kernel (src/gemm/sm90/weight_grad.cuh) claims 32-bit work items, one
// per 128 x 256 tile of dW13 [2F, H] or dW2 [H, F] per expert and split: the larger count of the
// two, E · splits · tiles, which plan_backward keeps within INT32_MAX (else the weight gradients
// stay on the mma.sync tile) and expect_backward_plan checks.
inline constexpr int64_t kWgmmaWeightGradTileM = 128, kWgmmaWeightGradTileN = 256;
int64_t wgmma_weight_grad_items(const MoeShape& shape, int splits);

}  // namespace moekit::tuning

namespace moekit::detail {

// The options plan_backward takes: known enum values, weight_grad_dtype bf16 or f32, and
// accumulation only into f32 weight gradients. Errors name 'options.<field>'.
void expect_backward_options(const BackwardOptions& options, const char* entry);
// The plan's choices can run its shape: the shape is valid, its options are, its configs are
// compiled bf16 ones of its block_m, and its split-K counts are in range (a plan edited after
// plan_backward is refused: "make plans with plan_backward"). Errors name 'plan', 'shape.*' or
// 'options.*'.
void expect_backward_plan(const BackwardPlan& plan, const char* entry);
// The backward's workspace of `plan`, laid out over `pieces` (one piece per BackwardWorkspace
// tensor; those the plan does not use take no bytes).
BackwardWorkspace lay_out_backward_workspace(const BackwardPlan& plan, Pieces& pieces);
// carve_backward_workspace with the buffer's errors under the caller's argument names.
BackwardWorkspace carve_backward_named(const BackwardPlan& plan, void* base, size_t bytes, const char* entry,
                                       const char* base_arg, const char* bytes_arg);

}  // namespace moekit::detail
