// params.hpp — the contracts of the backward's kernels (host and device; no device code): what
// each launch reads and writes. The launcher (backward.cu) fills them from the plan, the inputs,
// the gradients and the carved workspace; docs/design.md ("Backward") has the math.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moekit::kernels::backward {

using bf16 = __nv_bfloat16;

// The forward's aligned layout, replayed: rows in expert order, each block_m-row block one
// expert's, an expert's assignments before its padding (sentinel num_assign = T·k).
struct Layout {
  const int32_t* sorted_ids;       // [max_rows]
  const int32_t* block_expert;     // [max_blocks]
  const int32_t* num_rows_padded;  // [1]: rows used, read on the device
  int64_t num_assign;              // T·k
  int topk;
  int block_m;
};

// The GEMMs over the layout's rows (ragged M, one expert a block): h, D and dx.
struct RaggedParams {
  Layout layout;
  const bf16* a;            // h: x [T, H] (gathered); D: dy [T, H] (gathered); dx: dh [max_rows, 2F]
  const bf16* b;            // h: w13 [E, 2F, H] (K-major); D: w2 [E, H, F], dx: w13 (N-major)
  int64_t k_dim, n_dim;     // h: H, 2F; D: H, F; dx: 2F, H
  int64_t a_stride;         // elements per row of a: H, H, 2F
  int64_t b_expert_stride;  // elements per expert of b
  int64_t inter;            // F
  bf16* h_out;      // h: [max_rows, 2F], g | u of each sorted row (SavedActivations::recompute)
  const bf16* h;    // D: the same, read (recomputed, or kept by the forward)
  // D only.
  const float* topk_weights;  // [T·k]
  bf16* dh;                   // [max_rows, 2F]: dg | du, or null (neither dx nor dW)
  bf16* act_w;                // [max_rows, F]: w·act, or null (no dW)
  float* dw_partials;         // [ceil(F / kDGemmTileN), T·k]: ⟨D, act⟩ of each column tile
  // dx only: split-K slices of k_tiles_per_split K-tiles (64 deep); slice s writes
  // dx_partials[s][a] (splits > 1) or dx_rows[a] (splits == 1).
  bf16* dx_rows;      // [T·k, H]
  float* dx_partials;  // [S, T·k, H]
  int splits;
  int64_t k_tiles_per_split;
};

// A weight-shaped output [E, M, N] (dW13, dW2; d_w_gate with E = 1): bf16 or f32, assigned or
// accumulated (f32), or split-K partials [S, E, M, N] f32 summed later in slice order.
struct WeightOut {
  void* out;
  bool f32;
  bool accumulate;
  float* partials;  // null: the kernel writes `out`
  int64_t rows, cols;  // M, N
  int64_t experts;     // E
};

// An operand of the weight-gradient GEMMs read along the expert's sorted rows (K): either row r of
// a sorted-order tensor (dh, act_w) or the row of the token of row r's assignment (x, dy).
struct SortedOperand {
  const bf16* base;
  int64_t stride;  // elements per row
  bool by_token;
};

// dW2_e = Σ (w·dy_t)ᵀ·act (A = dy by token [M = H], B = act_w [N = F]) and dW13_e = Σ dhᵀ·x_t
// (A = dh [M = 2F], B = x by token [N = H]) over expert e's sorted rows [row_start[e], + counts[e]).
struct WeightGradParams {
  Layout layout;
  const int32_t* expert_row_start;  // [E + 1]
  const int32_t* expert_counts;     // [E]
  SortedOperand a, b;
  WeightOut out;
  int splits;  // each expert's K-tiles cut into this many contiguous slices
};

// Each expert's first sorted row: the prefix sum of its block_m-padded count (align's layout).
struct RowStartParams {
  const int32_t* expert_counts;  // [E]
  int32_t* expert_row_start;     // [E + 1]
  int experts, block_m;
};

// d_topk_weights[a] = Σ_tile dw_partials[tile][a] in tile order (0 for an id outside [0, E)).
struct DwReduceParams {
  const float* dw_partials;  // [tiles, T·k]
  const int32_t* topk_ids;   // [T·k]
  float* d_topk_weights;     // [T·k]
  int64_t num_assign;
  int tiles, experts;
};

// dx[t] = Σ_j (Σ_s) rows of t's valid slots, j outer, s inner (+ the router's part, summed in the
// router's dx kernel); FP32, bf16 out.
struct DxCombineParams {
  const bf16* dx_rows;        // [T·k, H] (splits == 1)
  const float* dx_partials;   // [S, T·k, H] (splits > 1)
  const int32_t* topk_ids;    // [T·k]
  bf16* dx;                   // [T, H]
  int64_t tokens, hidden;
  int topk, splits, experts;
};

// out[i] = (accumulate ? out[i] : 0) + Σ_s partials[s][i], s in order; out bf16 or f32.
struct SplitSumParams {
  const float* partials;  // [S, n]
  void* out;              // [n]
  int64_t n;              // a multiple of 4
  int splits;
  bool f32, accumulate;
  // Accumulating dW: out's experts are planes of `plane` elements (a multiple of 4), and an expert
  // with expert_counts[e] = 0 adds nothing (its main_grad stays bitwise as it was). Null otherwise.
  const int32_t* expert_counts;
  int64_t plane;
};

// The router's gradient, a warp per token (d_topk_weights -> d_logits through the scoring, the
// renormalisation and the scaling, the selection held fixed).
struct RouterGradParams {
  const float* logits;       // [T, E]: the logits the forward scored
  const int32_t* topk_ids;   // [T, k]
  const float* d_topk;       // [T, k]
  const float* aux;          // [T, E] or null: the caller's losses' gradient at the logits (gate)
  float* d_logits;           // [T, E] f32 (RouterGrad::logits), or null
  bf16* d_logits_split;      // [T, 2·Ep] (RouterGrad::gate): hi = bf16(d), lo = bf16(d − hi), zero past E
  int64_t tokens;
  int experts, experts_padded, topk;
  bool sigmoid, renormalize;
  float scale;  // the routed scaling factor
};

// d_w_gate [E, H] = Σ_t d_logitsᵀ·x (K = 2T: token t's hi and lo rows), and the router's part of dx
// [T, H] = d_logits·w_gate (K = 2·Ep with a bf16 w_gate: hi, lo; 4·Ep with f32: (hi, lo)·w_hi,
// (hi, lo)·w_lo), added to the experts' part in the same kernel (dx_router_combine_kernel).
struct GateGradParams {
  const bf16* d_logits_split;  // [T, 2·Ep]
  const bf16* x;               // [T, H]
  const void* w_gate;          // [E, H] bf16 or f32
  bool w_gate_f32;
  int64_t tokens, hidden;
  int experts, experts_padded;
  WeightOut d_w_gate;          // rows E, cols H, experts 1
  int splits;                  // of d_w_gate's K
};

}  // namespace moekit::kernels::backward
