// pipelined.cuh — the router logits x·w_gateᵀ of a bf16 w_gate for prefill with many experts:
// a software-pipelined CTA per 128 x 64 (or 128 x 32) tile, bitwise the cluster and looped
// kernels' logits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/async_copy.cuh"
#include "common/canon.hpp"
#include "common/device.cuh"
#include "router/gate/order.cuh"
#include "router/gate/warp_partial.cuh"  // mma_step_half

namespace moekit::kernels::router {

// The looped kernel keeps the order's structure in its threads (warp w sums role w of each slice,
// for a 64 x 32 tile): each CTA waits for serial batches of loads at one CTA per SM, and x and
// w_gate are re-read from L2 for every 64 x 32 tile (ncu, DeepSeek-V3 T=16384: 717 µs, 2.8 GB
// through L2, no eligible warp 70% of cycles).
//
// This kernel computes the same sums in the same order with the order's roles unrolled in time:
// every warp computes, for its own 32 x 32 outputs, the role partials one after another —
//   for slice r: for role w in 0..7: P = Σ over the role's blocks, ascending, of their 4 steps
//   (two k16 MMAs a step); V = V + P;   then S = S + V   (V and S starting at -0)
// which is bitwise the looped and cluster kernels' logits (same MMAs on the same operands, the
// same additions in the same order). The CTA streams the blocks in exactly that order through a
// ring of STAGES stages, a stage one block (4 steps of 32 columns of 128 x rows and COLS w_gate
// rows), shared by its warps (4 x 2 or 4 x 1 of them over the tile): one barrier per stage. The
// order's blocks are a table in shared memory, written once per CTA, so a stage's loads cost a
// table read. A role ends on a stage's end, so a warp folds at most once a stage, 32 FADDs per
// 64 MMAs (NOTES: when roles owned single 32-column steps, the folds after every step made the
// kernel issue-bound, 0.44 instructions per cycle per scheduler at a tensor pipe ~20% busy).
// Parts: BlockTable (the order), StageLoader (producer), RoleSums (mainloop in the order), and
// the store of S (epilogue).
// COLS: the tile's experts, 64 (8 warps, 4 x 2 over the tile) or 32 (4 warps, 4 x 1): each warp
// sums its own 32 x 32 whatever the tile, so the narrow tile halves a CTA's work and doubles the
// CTAs, for the T where 64-column tiles leave SMs idle.
template <int G, int STAGES, int COLS = kGatePipeCols>
struct GatePipe {
  static_assert(COLS == 64 || COLS == 32, "tiles of 64 or 32 experts");
  static constexpr int kWarps = 4 * (COLS / 32);
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStepBytes = gate_pipe_step_bytes(COLS);
  static constexpr int kStageBytes = G * kStepBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;  // then the table of the blocks' columns
  static constexpr int kXBytes = kGatePipeRows * kGateStep * 2;  // [128][32] bf16 per step, then w [COLS][32]
  // 16-byte chunks a step (4 a row of x and of w_gate), a thread's share: 3 (COLS 64) or 5 (32).
  static constexpr int kChunks = (kGatePipeRows + COLS) * 4 / kThreads;
  static_assert(kChunks * kThreads == (kGatePipeRows + COLS) * 4, "every thread the same number of chunks");
  static_assert(STAGES >= 3 && kSmemBytes <= 200 * 1024, "a ring of at least 3 stages that fits shared memory");
};
static_assert(kGatePipeGroup == kGateBlockSteps, "a stage is one block of the order");
static_assert(GatePipe<kGatePipeGroup, kGatePipeStages>::kSmemBytes + 4 * gate_block_table_entries(0) ==
                  gate_pipelined_smem_bytes(0),
              "params.hpp's shared-memory size (the planner's) must be the kernel's");
static_assert(GatePipe<kGatePipeGroup, kGatePipeStages, kGatePipeNarrowCols>::kSmemBytes + 4 * gate_block_table_entries(0) ==
                  gate_pipelined_smem_bytes(0, kGatePipeNarrowCols),
              "params.hpp's shared-memory size (the planner's) must be the kernel's");

// The order as a table in shared memory: entry n = the first column of the n-th block of the
// order. Thread r < 8 writes slice r's blocks: roles w in order, each role's blocks ascending.
// `total` blocks in all.
struct BlockTable {
  int32_t* k;
  int64_t total;
  __device__ __forceinline__ BlockTable(unsigned char* table_smem, int64_t hidden, int tid)
      : k(reinterpret_cast<int32_t*>(table_smem)), total(gate_blocks(hidden)) {
    if (tid < kGateSlices) {
      int64_t n = 0;
      for (int r = 0; r < tid; ++r) n += gate_slice_blocks(hidden, r);
      for (int w = 0; w < kGateWarps; ++w) {
        const GateRole role(hidden, tid, w);
        for (int64_t j = 0; j < role.blocks(); ++j, ++n) k[n] = int32_t(role.block(j) * kGateBlock);
      }
    }
  }
};

// Producer: every thread's kChunks chunks of every step, 512 x chunks (row id/4, chunk id%4), then
// 4 x COLS w_gate chunks, loaded a block (one stage, G steps) at a time in the table's order.
template <int G, int STAGES, int COLS>
struct StageLoader {
  using Pipe = GatePipe<G, STAGES, COLS>;
  static constexpr int kChunks = Pipe::kChunks;
  const __nv_bfloat16* src[kChunks];
  bool row_ok[kChunks];
  uint32_t dst[kChunks];
  uint32_t smem0;
  int64_t hidden;
  int tid;
  int64_t n_load = 0;  // the next block of the table to load

  __device__ __forceinline__ StageLoader(const GateParams& p, uint32_t smem, int t, int e0, int64_t t0)
      : smem0(smem), hidden(p.hidden), tid(t) {
    const int64_t H = p.hidden;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int id = tid + i * Pipe::kThreads;
      const int c = id & 3;
      if (id < kGatePipeRows * 4) {
        const int64_t t = t0 + id / 4;
        row_ok[i] = t < p.tokens;
        src[i] = p.x + (row_ok[i] ? t : 0) * H + c * 8;
        dst[i] = uint32_t((id / 4) * kGateStep * 2 + c * 16);
      } else {
        const int e = e0 + (id - kGatePipeRows * 4) / 4;
        row_ok[i] = e < p.experts;
        src[i] = p.w_gate + int64_t(row_ok[i] ? e : 0) * H + c * 8;
        dst[i] = uint32_t(Pipe::kXBytes + ((id - kGatePipeRows * 4) / 4) * kGateStep * 2 + c * 16);
      }
    }
  }

  __device__ __forceinline__ void load(const BlockTable& table, int slot) {
    if (n_load < table.total) {
      const int64_t k0 = table.k[n_load];
#pragma unroll
      for (int u = 0; u < G; ++u) {
        const int64_t k = k0 + u * kGateStep;
        const uint32_t base = smem0 + uint32_t(slot * Pipe::kStageBytes + u * Pipe::kStepBytes);
#pragma unroll
        for (int i = 0; i < kChunks; ++i) {
          const int c = (tid + i * Pipe::kThreads) & 3;
          const bool ok = row_ok[i] && k + c * 8 < hidden;  // zero-filled past H
          dev::cp_async16(base + dst[i], src[i] + k, ok ? 16u : 0u);
        }
      }
      ++n_load;
    }
    dev::cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  }
};

// Consumer: one warp's 32 x 32 of the tile, its sums in the fixed order. P is the current role's
// partial; closing a role folds P into V (and, at the slice's end, V into S); roles without a
// block fold a zero P, as the cluster and looped kernels add a zero partial for them. (r, w,
// left): slice, role, blocks of the role still to come.
struct RoleSums {
  float P[2][4][4], V[2][4][4], S[2][4][4];
  int64_t hidden;
  int r = 0, w = 0;
  int64_t left;

  // f(mt, nt, i) for every accumulator element of this warp's 32 x 32.
  template <class F>
  __device__ __forceinline__ static void each_acc(F&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) f(mt, nt, i);
  }
  // V and S start each sum at -0, and every fold is an add: -0 + x is x for every float x (+0 and
  // -0 included; a NaN's payload aside, which the later folds canonicalize either way), so V = -0
  // + P is the first role's P and S = -0 + V the first slice's V, bit for bit. NOTES: the folds
  // were `V = w == 0 ? P : V + P` (and S alike); with the role and slice known only at run time
  // ptxas compiled each to a copy of P, a predicated FADD and a copy back.
  static constexpr float kNegZero = -0.0f;
  __device__ __forceinline__ explicit RoleSums(int64_t h) : hidden(h), left(gate_role_blocks(h, 0, 0)) {
    each_acc([&](int mt, int nt, int i) { P[mt][nt][i] = 0.0f, V[mt][nt][i] = kNegZero, S[mt][nt][i] = kNegZero; });
    close_roles();
  }
  __device__ __forceinline__ void close_roles() {
    while (r < kGateSlices && left == 0) {
      each_acc([&](int mt, int nt, int i) {
        V[mt][nt][i] = canon::add(V[mt][nt][i], P[mt][nt][i]);
        P[mt][nt][i] = 0.0f;
      });
      if (++w == kGateWarps) {
        each_acc([&](int mt, int nt, int i) {
          S[mt][nt][i] = canon::add(S[mt][nt][i], V[mt][nt][i]);
          V[mt][nt][i] = kNegZero;
        });
        w = 0, ++r;
      }
      if (r < kGateSlices) left = gate_role_blocks(hidden, r, w);
    }
  }
  // One step of a block (x rows then w_gate rows of its stage slot): two k16 MMAs into P.
  __device__ __forceinline__ void step(const unsigned char* xs, const unsigned char* ws, int wm, int wn, int g, int q) {
    uint4 xv[2][2], wv[4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        xv[mt][h] = *reinterpret_cast<const uint4*>(xs + (wm * 32 + mt * 16 + g + 8 * h) * kGateStep * 2 + q * 16);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
      wv[nt] = *reinterpret_cast<const uint4*>(ws + (wn * 32 + nt * 8 + g) * kGateStep * 2 + q * 16);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_step_half(P[mt][nt], xv[mt][0], xv[mt][1], wv[nt], j);
  }
  // A block's end: its role may close.
  __device__ __forceinline__ void end_block() {
    --left;
    close_roles();
  }
};

template <int G, int STAGES, int COLS>
__global__ void __launch_bounds__(GatePipe<G, STAGES, COLS>::kThreads, 1) gate_logits_pipelined_kernel(GateParams p) {
  using Pipe = GatePipe<G, STAGES, COLS>;
  extern __shared__ __align__(128) unsigned char gate_smem[];
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  const int wm = warp % 4, wn = warp / 4;  // this warp's 32 x 32 of the tile
  const int e0 = int(blockIdx.x) * COLS;
  const int64_t t0 = int64_t(blockIdx.y) * kGatePipeRows;

  StageLoader<G, STAGES, COLS> loader(p, dev::smem_addr(gate_smem), tid, e0, t0);
  const BlockTable table(gate_smem + Pipe::kSmemBytes, p.hidden, tid);
  __syncthreads();

  dev::pdl_enter();  // x may be the previous kernel's output
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) loader.load(table, st);

  RoleSums sums(p.hidden);
  int slot = 0;
  for (int64_t n = 0; n < table.total; ++n) {
    dev::cp_async_wait<STAGES - 2>();
    __syncthreads();  // the stage landed for every thread; the slot refilled next was read by all
    loader.load(table, slot == 0 ? STAGES - 1 : slot - 1);
#pragma unroll
    for (int u = 0; u < G; ++u) {
      const unsigned char* xs = gate_smem + slot * Pipe::kStageBytes + u * Pipe::kStepBytes;
      sums.step(xs, xs + Pipe::kXBytes, wm, wn, g, q);
    }
    sums.end_block();
    slot = slot + 1 == STAGES ? 0 : slot + 1;
  }
  dev::cp_async_wait_all();

  // Epilogue: the C fragment's c0,c1 are row g cols 2q,2q+1; c2,c3 row g+8.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t t = t0 + wm * 32 + mt * 16 + g + 8 * h;
        const int e = e0 + wn * 32 + nt * 8 + 2 * q;
        if (t >= p.tokens) continue;
        if (e < p.experts) p.logits[t * p.experts + e] = sums.S[mt][nt][2 * h];
        if (e + 1 < p.experts) p.logits[t * p.experts + e + 1] = sums.S[mt][nt][2 * h + 1];
      }
}

}  // namespace moekit::kernels::router
