// params.hpp — the contract of one expert-GEMM launch, host and device: the mode and the
// parameters both GEMM families take (gemm/common.cuh says what they mean for the kernels).
// No device code: the launchers, the planner's geometry and the CPU tests include it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/canon.hpp"  // MK_HD
#include "common/fast_div.hpp"

namespace moekit::kernels::gemm {

// Up and Down: the forward's two GEMMs. The backward's, on the wgmma kernel only, with B read
// N-major (K rows of N values):
//   Dx    — dx_rows = dh·W13_e: Down's sorted A rows, B = W13_e [2F, H], no routing weight, stored
//           to row a = sorted_ids[r];
//   DGrad — D = dy·W2_e: Up's token gather of dy, B = W2_e [H, F], and the SwiGLU backward in the
//           epilogue (the Params' h, dh, act_w, dw_partials);
// and, with B K-major as Up's:
//   UpH   — the recomputation of h = x·W13_eᵀ: Up's gather and paired gate/up B, g and u stored
//           as they are to h [max_rows, 2F] (out, row stride 2F) in sorted order;
//   UpSaveH — the training forward's Up (ForwardPlan::save_h): act to out as Up, and g and u to
//           h_out as UpH stores them (the wgmma kernel's mode; the mma.sync kernel runs Up with an
//           epilogue part that does the same);
//   DownSplitK — Down with K cut into k_splits slices (the bf16 wgmma kernel's split-K; the
//           mma.sync kernel's Down splits by k_splits alone): slice s stores weight · its sum as
//           FP32 to partials[s][a]. A mode of its own, so Down's kernel carries none of it.
enum class Mode { Up, Down, Dx, DGrad, UpH, UpSaveH, DownSplitK };
// A rows gathered by token (x, dy: row a / k), else the sorted row itself.
MK_HD constexpr bool a_by_token(Mode m) {
  return m == Mode::Up || m == Mode::DGrad || m == Mode::UpH || m == Mode::UpSaveH;
}
// B = a tile's gate rows and the same up rows of w13 (one act column per pair).
MK_HD constexpr bool pairs_gate_up(Mode m) { return m == Mode::Up || m == Mode::UpH || m == Mode::UpSaveH; }
// B read N-major (the backward's modes), else K-major.
MK_HD constexpr bool b_n_major(Mode m) { return m == Mode::Dx || m == Mode::DGrad; }

// FP8 plans: a and b hold e4m3 rows, which the loaders move as 16-byte chunks without reading
// them, so they are addressed in 2-byte units: k_dim and b_expert_stride count units (K/2, the
// expert's bytes / 2); one K-tile of 64 units is one 128-deep scale block. out of Up holds e4m3
// act (bytes); n_dim counts elements in both precisions.
struct Params {
  const __nv_bfloat16* a;        // Up, UpH: x [T, H]; Down: act [max_rows, F]; Dx: dh [max_rows, 2F]; DGrad: dy [T, H]
  const __nv_bfloat16* b;        // Up, UpH, Dx: w13 [E, 2F, H]; Down, DGrad: w2 [E, H, F]
  __nv_bfloat16* out;            // Up: act [max_rows, F]; Down: y_rows [T*k, H]; Dx: dx_rows [T*k, H];
                                 // UpH: h [max_rows, 2F]; DGrad: unused (h, dh, act_w below)
  const float* topk_weights;     // [T*k] (Down, DGrad)
  const int32_t* sorted_ids;     // [max_rows]
  const int32_t* block_expert;   // [max_blocks]
  const int32_t* num_rows_padded;
  int32_t* tile_counter;         // [1]: the wgmma kernel's claimed work items (ws.gemm_counter)
  int64_t num_assign;            // T*k: the padding sentinel
  int64_t k_dim;                 // reduction length: H (Up, UpH, DGrad), F (Down) or 2F (Dx)
  int64_t n_dim;                 // output columns: F (Up, UpH, DGrad) or H (Down, Dx)
  int64_t b_expert_stride;       // elements per expert in b
  int64_t n_tiles;               // column tiles: ceil(n_dim / cols_per_tile)
  int topk;
  // Split-K (Down on mma.sync, DownSplitK on wgmma): k_splits slices of k_tiles_per_split K-tiles
  // each; slice s writes FP32 partial rows to partials[s][a] instead of bf16 rows to out[a].
  int k_splits;
  int64_t k_tiles_per_split;
  float* partials;               // [k_splits, T*k, n_dim] or null
  // Block scales (fp8; null for bf16), kb = ceil(K/128) per row:
  const float* a_scale;          // Up: x_scale [T, kb]; Down: act_scale [max_rows, kb]
  const float* b_scale;          // [E, scale rows, kb]: Up 2·ceil(F/128) (gate's, then up's), Down ceil(H/128)
  float* out_scale;              // Up: act_scale [max_rows, ceil(F/128)]
  int64_t b_scale_expert_stride; // floats per expert in b_scale
  int64_t b_up_block0;           // Up: the scale row of up's first block, ceil(F/128)
  // DGrad (n_dim = F): h = g | u [max_rows, 2F] in; dh = dg | du [max_rows, 2F] and act_w = w·act
  // [max_rows, F] out (either may be null); ⟨D, act⟩ of each 64-column group per assignment to
  // dw_partials[group][a].
  const __nv_bfloat16* h;
  __nv_bfloat16* dh;
  __nv_bfloat16* act_w;
  float* dw_partials;
  // UpSaveH (bf16): h = g | u [max_rows, 2F] of each sorted row, beside act in out.
  __nv_bfloat16* h_out;
  // The forward's up -> down boundary (the mma.sync kernels with Parts::kBoundary, the FP8 ones;
  // set by run_experts on both GEMMs of a layer): Up lets its dependents launch only when its
  // loader finds its loads all issued, not at its start; Down, before its PDL wait, prefetches the
  // B rows of its first item into L2. Down reads the routing for that before its wait, so the flag
  // promises that down's predecessor is this layer's up, which waited for align before it let down
  // start. max_blocks and experts bound those early reads.
  int boundary;
  int64_t max_blocks;  // blocks the layout can hold (block_expert's length)
  int64_t experts;     // E: experts in b
};

// The backward's weight gradients on the wgmma kernel (sm90/weight_grad.cuh): per expert e a
// k-grouped GEMM out_e [m_dim, n_dim] = Σ_r a[r]ᵀ·b[r] over e's sorted rows r (K, in ascending
// order), both operands MN-major: a sorted row holds one K index's M (a) or N (b) values, read as
// the row itself (by_token 0: dh, act_w) or its assignment's token row (1: x, dy).
//   dW2_e  [H, F]  = Σ dy_tᵀ·act_w[r]   (a = dy by token, b = act_w)
//   dW13_e [2F, H] = Σ dh[r]ᵀ·x_t       (a = dh, b = x by token)
struct KGroupedOperand {
  const __nv_bfloat16* base;
  int64_t stride;  // elements per row
};
struct KGroupedParams {
  KGroupedOperand a, b;
  const int32_t* sorted_ids;        // [max_rows]
  const int32_t* expert_row_start;  // [E + 1]: each expert's first sorted row
  const int32_t* expert_counts;     // [E]: its rows (assignments; the padding after them is not read)
  int32_t* tile_counter;            // [1]: claimed work items, zeroed by the launcher
  int64_t num_assign;               // T*k: the padding sentinel
  int topk;
  dev::FastDivU32 topk_div;         // id / topk (the launcher makes it)
  int64_t m_dim, n_dim;             // out rows and columns
  int32_t experts, splits;          // split s of an expert sums its s-th share of the K-tiles
  int32_t m_tiles, n_tiles;         // of the 128 x 256 tile
  void* out;                        // [E, m_dim, n_dim] bf16, or f32 (f32; accumulate: +=)
  float* partials;                  // splits > 1: [splits, E, m_dim, n_dim] f32 instead of out
  int f32, accumulate;
  // The tile goes to a bf16 out (the TMA-store epilogue and its tensor map); else FP32 (partials, or
  // out as f32, accumulate implying f32).
  MK_HD bool bf16_out() const { return !f32 && partials == nullptr; }
};

// Output columns of a tile of `block_n` B rows: Up (and UpH) pairs block_n/2 gate rows with the
// same block_n/2 up rows, so it produces block_n/2 act columns (UpH: their g and u).
MK_HD constexpr int cols_per_tile(Mode m, int block_n) { return pairs_gate_up(m) ? block_n / 2 : block_n; }

}  // namespace moekit::kernels::gemm
