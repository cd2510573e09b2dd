// moekit/backward.hpp — the public host API of the backward pass of one MoE layer (bf16): its
// plan, what the forward must keep for it, the gradients it writes, and its workspace. No device
// code. The math and the kernels are in docs/design.md, "Backward"; the CPU oracle is
// ref::moe_backward and ref::router_backward (moekit/reference.hpp).
//
// A training step keeps the forward's aligned layout (sorted_ids, block_expert, num_rows_padded,
// expert_counts: the backward replays it, never re-sorts) and its routing, and either nothing more
// (the backward recomputes h = x·W13ᵀ) or h itself; plan_backward(forward_plan, device, options)
// records every choice of the backward and the size of its own workspace, a pure host function of
// the plan as the forward's is; moe_backward runs it on a stream (docs/design.md, "Backward").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "moekit/moe.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

// What the forward kept for its backward, beyond its inputs, its routing and its aligned layout.
enum class SavedActivations : int {
  // Nothing: the backward recomputes h = x·W13ᵀ in sorted order, one more up GEMM (2·T·k·H·2F
  // FLOPs, a third of the backward's 12·T·k·H·F) for no activation memory.
  recompute,
  // h [max_rows, 2F] bf16: the up GEMM's gate|up values before SwiGLU, in sorted order (row r is
  // assignment sorted_ids[r]'s), 2·max_rows·2F bytes kept from the forward to the backward: a
  // forward planned with ForwardPlan::save_h writes it to the h it is given.
  h,
};

// Which router gradient the backward computes.
enum class RouterGrad : int {
  // The routing was given (experts_forward, or a router outside moekit): the backward ends at
  // d_topk_weights, which the caller's autograd takes back through its own router.
  none,
  // The forward scored caller-given router_logits [T, E]: d_router_logits [T, E] f32, through
  // softmax or sigmoid, renormalisation and the routed scaling factor (the selection and the score
  // bias carry no gradient).
  logits,
  // The forward computed logits = x·w_gateᵀ (moe_forward with w_gate): d_w_gate [E, H], and dx
  // includes the router's part d_logits·w_gate.
  gate,
};

struct BackwardOptions {
  SavedActivations saved = SavedActivations::recompute;
  RouterGrad router = RouterGrad::none;
  bool input_grad = true;                 // compute dx (false: the layer's input needs none)
  bool weight_grads = true;               // compute dw13 and dw2 (false: frozen experts)
  DType weight_grad_dtype = DType::bf16;  // dw13/dw2: bf16 (the weights' dtype) or f32 (master gradients)
  // dw13/dw2 += this step's gradients instead of =, each element read and written once in a fixed
  // order (f32 only: gradient accumulation into FP32 main_grad across micro-batches).
  bool accumulate_weight_grads = false;
};
const char* saved_activations_name(SavedActivations s);  // "recompute", "h"
const char* router_grad_name(RouterGrad r);              // "none", "logits", "gate"

// Split-K limits of the backward's reductions (each split writes FP32 partials, summed in fixed
// order: no atomics, bitwise deterministic).
inline constexpr int kMaxWeightGradSplits = 8;  // dW over each expert's rows
inline constexpr int kMaxGateGradSplits = 16;   // d_w_gate over the T tokens
// d_w_gate's square output tile: 128 where E fills it, else 64 (Mixtral's E = 8 would leave most
// of the wide tile's rows empty). The planner counts these tiles for gate_splits; the launch picks
// the kernel instance by it.
constexpr int gate_grad_tile(int64_t experts) { return experts > 64 ? 128 : 64; }
// The tile the weight-gradient GEMMs are planned with: 128 x 128 outputs of dW (the wgmma
// prefill tile), 64 sorted rows a K step.
inline constexpr int kWeightGradTileM = 128, kWeightGradTileN = 128, kWeightGradTileK = 64;
// The D GEMM's column group: each 64 columns of F write one partial ⟨D, act⟩ per assignment
// (ws.dw_partials), whatever the tile. The backward's GEMMs are mma.sync kernels of their own
// tiles (src/backward: BackwardPlan::ragged_tile_rows); the forward's configs the plan records
// (up, d, dx) are what tuned backward kernels will start from.
inline constexpr int kDGemmTileN = 64;

// The plan of one backward pass: every kernel choice (made by plan_backward from the forward's
// plan) and, derived from them, every buffer's size.
struct BackwardPlan {
  MoeShape shape;
  int block_m = 0;  // rows per block of the forward's aligned layout: the backward replays it
  BackwardOptions options;
  // The GEMMs over the aligned layout (ragged M: each block_m-row block is one expert's), with the
  // tiles the forward's plan chose for the same rows per expert until the backward has its own
  // tuned configs:
  GemmConfig up;  // h = x·W13ᵀ (SavedActivations::recompute): the forward's up GEMM, storing h
  GemmConfig d;   // D = dy·W2 [rows, F], K = H, with the dw / dact / dg / du epilogue: the forward's up config
  GemmConfig dx;  // dx_rows = dh·W13 [rows, H], K = 2F: the forward's down config
  int dx_splits = 1;    // split-K of the dx GEMM (decode): FP32 partials that the dx combine sums
  int dw_splits = 1;    // split-K of dW2/dW13 over each expert's rows: FP32 partials, summed in order
  int gate_splits = 1;  // split-K over T of d_w_gate = d_logitsᵀ·x (RouterGrad::gate)
  int tile_rows = 16;   // rows of the backward's mma.sync tiles: 16, 64 or 128 (ragged_tile_rows)
  // The recomputation of h, the D and the dx GEMMs on the forward's wgmma kernel (128 x 256 tiles;
  // W2 / W13 read N-major for D and dx) instead of the mma.sync tile: block_m 128 only (h: with
  // SavedActivations::recompute; dx: unsplit). plan_backward turns on each that the plan allows.
  bool h_wgmma = false;
  bool d_wgmma = false;
  bool dx_wgmma = false;
  // dW2 and dW13 on the wgmma weight-gradient kernel (128 x 256 tiles of dW, both operands read
  // MN-major by cp.async; dw_splits as the mma.sync kernel's): any block_m (its K range is each
  // expert's rows, not the layout's blocks), with options.weight_grads.
  bool dw_wgmma = false;
  std::string source;   // "forward:" + the forward plan's source

  int64_t max_rows() const { return worst_case_rows(shape, block_m); }
  int64_t max_blocks() const { return max_rows() / block_m; }
  // Column tiles of the D GEMM: each writes one partial ⟨D, act⟩ per row (ws.dw_partials).
  int64_t d_col_tiles() const { return (shape.inter + kDGemmTileN - 1) / kDGemmTileN; }
  // E rounded up to 8 (16-byte rows of bf16): the width of each part of ws.d_logits.
  int64_t experts_padded() const { return (shape.experts + 7) / 8 * 8; }
  // The mma.sync tile every ragged GEMM of the backward runs today: 16 or 64 rows by 64 columns
  // (4 warps), or 128 by 256 (8 warps); the weight gradients' tile is 64 x 64 or 128 x 256 alike.
  // tile_rows divides block_m (a tile has one expert); plan_backward picks it from the rows an
  // expert gets. str() names it as what runs; up, d and dx above are the forward's configs that
  // tuned backward kernels will start from.
  int ragged_tile_rows() const { return tile_rows; }
  int ragged_tile_cols() const { return tile_rows == 128 ? 256 : 64; }
  std::string str() const;
};

// The backward of a forward planned as `forward` (a bf16 plan, validated as the forward entries
// validate it) on `device` (a Hopper), with `options` (checked: their errors name
// 'options.<field>'). Pure host code.
BackwardPlan plan_backward(const ForwardPlan& forward, const DeviceInfo& device, const BackwardOptions& options = {});
// Sets each of the backward's GEMMs on the wgmma kernels as asked (h_wgmma, d_wgmma, dx_wgmma,
// dw_wgmma) where `plan` allows it, as moe_backward validates it: h, D and dx at block_m 128 (h
// recomputed, dx computed unsplit), dW wherever weight gradients are computed; the others run on
// the mma.sync tile. plan_backward
// calls it with all four; use_wgmma_gemms(plan, false, false, false, false) is the mma.sync path
// (`moekit bench --backward --backward-mma-sync`, the GPU tests' comparisons).
void use_wgmma_gemms(BackwardPlan& plan, bool h = true, bool d = true, bool dx = true, bool dw = true);

// What the backward reads. The forward's intermediate tensors may be views into the forward's
// workspace, which must then stay untouched until the backward has run (the backward's own
// workspace is another buffer), or copies of them.
struct BackwardInputs {
  Tensor x;                // [T, H] bf16
  Tensor w13;              // [E, 2F, H] bf16
  Tensor w2;               // [E, H, F] bf16
  Tensor w_gate;           // [E, H] bf16 or f32: RouterGrad::gate only
  Tensor router_logits;    // [T, E] f32: the logits the forward scored (RouterGrad::logits: the caller's;
                           // gate: the forward's ws.router_logits); absent with RouterGrad::none
  Tensor topk_ids;         // [T, k] i32: the forward's routing
  Tensor topk_weights;     // [T, k] f32
  Tensor sorted_ids;       // [max_rows] i32: the forward's aligned layout (moekit/moe.hpp, Workspace)
  Tensor block_expert;     // [max_blocks] i32
  Tensor num_rows_padded;  // [1] i32
  Tensor expert_counts;    // [E] i32
  Tensor h;                // [max_rows, 2F] bf16: SavedActivations::h only — the h a forward planned with
                           // ForwardPlan::save_h wrote, or g | u of each sorted row computed elsewhere
  Tensor dy;               // [T, H] bf16: the gradient of the layer's output y
  // [T, E] f32, optional (RouterGrad::gate): the gradient of losses the caller computed from the
  // logits (a load-balancing loss, a z-loss), added to the router's d_logits before d_w_gate and the
  // router's part of dx — the logits never leave the layer otherwise. (With RouterGrad::logits the
  // caller adds its own to d_router_logits.)
  Tensor d_logits_aux;
};

// What the backward writes. Each output is required when the plan computes it and refused when it
// does not (d_topk_weights: optional unless RouterGrad::none); none may overlap another output, an
// input or the workspace.
struct BackwardGrads {
  Tensor dx;               // [T, H] bf16 (options.input_grad): Σ_j dh·W13_e in slot order, plus the
                           // router's part with RouterGrad::gate
  Tensor dw13;             // [E, 2F, H] weight_grad_dtype (options.weight_grads); an expert with no rows: 0
  Tensor dw2;              // [E, H, F] weight_grad_dtype (options.weight_grads)
  Tensor d_topk_weights;   // [T, k] f32: required with RouterGrad::none, optional otherwise
  Tensor d_router_logits;  // [T, E] f32: RouterGrad::logits only
  Tensor d_w_gate;         // [E, H], w_gate's dtype: RouterGrad::gate only
};

// The backward's workspace: one caller-owned device buffer, carved into its intermediate tensors
// (docs/design.md, "Backward": which kernel writes and reads each). Absent pieces view as Tensor{}.
struct BackwardWorkspace {
  Tensor h;                 // [max_rows, 2F] bf16: h recomputed in sorted order (recompute; else empty)
  Tensor dh;                // [max_rows, 2F] bf16: dg|du in sorted order (input_grad or weight_grads)
  Tensor act_w;             // [max_rows, F] bf16: w·act in sorted order, dW2's operand (weight_grads)
  Tensor dw_partials;       // [d_col_tiles, T*k] f32: each D column tile's ⟨D, act⟩ per assignment
  Tensor d_topk_weights;    // [T, k] f32: their sums in tile order, when grads.d_topk_weights is absent
  Tensor dx_rows;           // [T*k, H] bf16: dh·W13_e per assignment (input_grad, dx_splits == 1)
  Tensor dx_partials;       // [S, T*k, H] f32: its split-K partial sums (input_grad, dx_splits > 1)
  Tensor d_logits;          // [T, 2·Ep] bf16 (Ep = experts_padded()): the router's gradient (RouterGrad::gate)
                            // as its high and low bf16 parts, hi = bf16(d) in [0, E), lo = bf16(d − hi) in
                            // [Ep, Ep + E), zeros past E: the gate GEMMs' operand on the tensor cores
  Tensor gate_partials;     // [S, E, H] f32: d_w_gate's split-K partials (gate, gate_splits > 1)
  Tensor expert_row_start;  // [E + 1] i32: each expert's first sorted row (the padded counts' prefix
                            // sum), the dW GEMMs' K ranges (weight_grads)
  Tensor dw13_partials;     // [S, E, 2F, H] f32: dW13's split-K partials (weight_grads, dw_splits > 1)
  Tensor dw2_partials;      // [S, E, H, F] f32: dW2's (weight_grads, dw_splits > 1)
  Tensor gemm_counter;      // [1] i32: the prefill (wgmma) GEMMs' work-item counter, zeroed by each
};
// Bytes of the backward's workspace: a pure host function of the plan, in 64 bits.
size_t backward_workspace_bytes(const BackwardPlan& plan);
// Views into `base` (at least backward_workspace_bytes(plan) bytes, 256-byte aligned).
BackwardWorkspace carve_backward_workspace(const BackwardPlan& plan, void* base, size_t bytes);

// The backward pass of the layer the forward ran as `plan`'s forward plan: validates every argument
// first (detail::check_backward: each error names its argument), then runs the stages on `stream` —
// h recomputed (SavedActivations::recompute), the D GEMM with the dw / dh epilogue, d_topk_weights,
// the router's gradient (RouterGrad::logits or ::gate), dx, and dW13 / dW2 over each expert's sorted
// rows. No allocation, no host synchronisation: capturable in a CUDA graph (after one eager call on
// the device). Deterministic: every output element is one thread's FP32 sum in an order fixed by
// the layout, no atomics. `opt` is the forward's router options (read with a router gradient).
void moe_backward(const BackwardPlan& plan, const BackwardInputs& in, const RouterOptions& opt,
                  const BackwardGrads& grads, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace moekit
