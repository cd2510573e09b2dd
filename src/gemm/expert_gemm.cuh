// expert_gemm.cuh — stages 3 and 4: the fused expert GEMMs on the tensor cores (mma.sync bf16).
//
// A CTA owns one block_m-row block of the aligned layout (one expert: block_expert[b]) and one
// column tile. Its rows come from sorted_ids: the up GEMM gathers x rows t = a/k inside the
// A-operand load (padding rows are zero-filled by cp.async and masked on store); the down GEMM
// reads act in sorted order. B is one expert's weights, K contiguous (w13 [2F,H], w2 [H,F]).
// Operands stream global -> shared through a `Stages`-deep cp.async pipeline (16-byte chunks,
// XOR-swizzled rows, ldmatrix-conflict-free), then ldmatrix + mma.m16n8k16 with FP32 accumulators.
// Epilogues: Up — the tile's first half of columns is gate, the second half the same columns of
// up, paired in registers: act = silu(g)·u. Down — multiply by the routing weight of the row's
// assignment and store the row at a = sorted_ids[r].
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/canon.hpp"
#include "common/async_copy.cuh"
#include "common/device.cuh"
#include "gemm/waves.hpp"

namespace moekit::kernels::gemm {

enum class Mode { Up, Down };

struct Params {
  const __nv_bfloat16* a;        // Up: x [T, H]; Down: act [max_rows, F]
  const __nv_bfloat16* b;        // Up: w13 [E, 2F, H]; Down: w2 [E, H, F]
  __nv_bfloat16* out;            // Up: act [max_rows, F]; Down: y_rows [T*k, H]
  const float* topk_weights;     // [T*k] (Down)
  const int32_t* sorted_ids;     // [max_rows]
  const int32_t* block_expert;   // [max_blocks]
  const int32_t* num_rows_padded;
  int32_t* tile_counter;         // [1]: the wgmma kernel's claimed work items (ws.gemm_counter)
  int64_t num_assign;            // T*k: the padding sentinel
  int64_t k_dim;                 // reduction length: H (Up) or F (Down)
  int64_t n_dim;                 // output columns: F (Up) or H (Down)
  int64_t b_expert_stride;       // elements per expert in b
  int64_t n_tiles;               // column tiles: ceil(n_dim / cols_per_tile)
  int topk;
  // Split-K (Down): k_splits slices of k_tiles_per_split K-tiles each; slice s writes FP32
  // partial rows to partials[s][a] instead of bf16 rows to out[a].
  int k_splits;
  int64_t k_tiles_per_split;
  float* partials;               // [k_splits, T*k, n_dim] or null
};

template <int BM, int BN, int BK, int WM, int WN, int STAGES>
struct Tile {
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kChunks = BK / 8;  // 16-byte chunks per smem row
  static constexpr int TM = BM / WM, TN = BN / WN;
  static constexpr int MI = TM / 16, NI = TN / 8;
  static constexpr int kAIters = BM * kChunks / kThreads;
  static constexpr int kBIters = BN * kChunks / kThreads;
  static constexpr int kStageElems = (BM + BN) * BK;
  static constexpr size_t kSmemBytes = size_t(STAGES) * kStageElems * 2 + size_t(BM) * 4;
  // Up: the tile's BN rows of B are BN/2 gate rows and the same BN/2 up rows.
  template <Mode M>
  static constexpr int cols_per_tile() { return M == Mode::Up ? BN / 2 : BN; }
  static_assert(BK == 64 || BK == 128, "the XOR swizzle needs at least 8 chunks per row");
  static_assert(TM % 16 == 0 && TN % 16 == 0, "warp tile must hold whole m16 and pairs of n8 fragments");
  static_assert(BM * kChunks % kThreads == 0 && BN * kChunks % kThreads == 0, "loads must split evenly");
  static_assert(STAGES >= 2, "the pipeline needs two stages at least");
};

using dev::cp_async16;
using dev::cp_async_commit;
using dev::cp_async_wait;
using dev::ldmatrix_x4;
using dev::mma_bf16;
using dev::smem_addr;

// Swizzled element offset of 16-byte chunk `c` of row `r` in a row-of-BK tile.
template <int BK>
__device__ __forceinline__ int swz(int r, int c) {
  return r * BK + ((c ^ (r & 7)) << 3);
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One output tile: rows [block*BM, +BM) of the aligned layout, columns n_tile of the output.
template <Mode M, int BM, int BN, int BK, int WM, int WN, int STAGES>
__device__ __forceinline__ void gemm_tile(const Params& p, int64_t block, int64_t n_tile, int split,
                                          unsigned char* smem_raw) {
  using Cfg = Tile<BM, BN, BK, WM, WN, STAGES>;
  constexpr int CH = Cfg::kChunks, MI = Cfg::MI, NI = Cfg::NI;
  constexpr int kColsPerTile = Cfg::template cols_per_tile<M>();

  const int64_t row0 = block * BM;
  const int expert = p.block_expert[block];
  const int64_t n0 = n_tile * kColsPerTile;

  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  int32_t* s_ids = reinterpret_cast<int32_t*>(smem_raw + size_t(STAGES) * Cfg::kStageElems * 2);
  const int tid = int(threadIdx.x);
  for (int r = tid; r < BM; r += Cfg::kThreads) s_ids[r] = p.sorted_ids[row0 + r];
  __syncthreads();

  // Per-thread source rows of its A and B chunks: fixed for the whole K loop.
  const __nv_bfloat16* a_src[Cfg::kAIters];
  bool a_ok[Cfg::kAIters];
#pragma unroll
  for (int i = 0; i < Cfg::kAIters; ++i) {
    const int r = (tid + i * Cfg::kThreads) / CH, c = (tid + i * Cfg::kThreads) % CH;
    const int64_t id = s_ids[r];
    a_ok[i] = id < p.num_assign;
    const int64_t src_row = M == Mode::Up ? (a_ok[i] ? id / p.topk : 0) : row0 + r;
    a_src[i] = p.a + src_row * p.k_dim + c * 8;
  }
  const __nv_bfloat16* b_src[Cfg::kBIters];
  bool b_ok[Cfg::kBIters];
  const __nv_bfloat16* b_expert = p.b + int64_t(expert) * p.b_expert_stride;
#pragma unroll
  for (int i = 0; i < Cfg::kBIters; ++i) {
    const int r = (tid + i * Cfg::kThreads) / CH, c = (tid + i * Cfg::kThreads) % CH;
    int64_t n, b_row;
    if constexpr (M == Mode::Up) {
      n = n0 + (r < BN / 2 ? r : r - BN / 2);
      b_row = r < BN / 2 ? n : p.n_dim + n;
    } else {
      n = n0 + r;
      b_row = n;
    }
    b_ok[i] = n < p.n_dim;
    b_src[i] = b_expert + (b_ok[i] ? b_row : 0) * p.k_dim + c * 8;
  }

  auto load_stage = [&](int stage, int64_t kt) {
    __nv_bfloat16* sa = smem + stage * Cfg::kStageElems;
    __nv_bfloat16* sb = sa + BM * BK;
    const int64_t k0 = kt * BK;
#pragma unroll
    for (int i = 0; i < Cfg::kAIters; ++i) {
      const int idx = tid + i * Cfg::kThreads, r = idx / CH, c = idx % CH;
      const bool ok = a_ok[i] && k0 + c * 8 < p.k_dim;
      cp_async16(smem_addr(sa + swz<BK>(r, c)), ok ? a_src[i] + k0 : p.a, ok ? 16u : 0u);
    }
#pragma unroll
    for (int i = 0; i < Cfg::kBIters; ++i) {
      const int idx = tid + i * Cfg::kThreads, r = idx / CH, c = idx % CH;
      const bool ok = b_ok[i] && k0 + c * 8 < p.k_dim;
      cp_async16(smem_addr(sb + swz<BK>(r, c)), ok ? b_src[i] + k0 : p.b, ok ? 16u : 0u);
    }
  };

  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WN, wn = warp % WN;
  // smem row of B for n8 fragment f of this warp.
  auto b_frag_row = [&](int f) {
    if constexpr (M == Mode::Up)
      return f < NI / 2 ? wn * (Cfg::TN / 2) + f * 8 : BN / 2 + wn * (Cfg::TN / 2) + (f - NI / 2) * 8;
    else
      return wn * Cfg::TN + f * 8;
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

  // This item's K-tiles: [kt0, kt0 + k_tiles) (all of K unless the down GEMM is split).
  const int64_t kt0 = split * p.k_tiles_per_split;
  const int64_t k_tiles = min(p.k_tiles_per_split, (p.k_dim + BK - 1) / BK - kt0);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, kt0 + s);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for all threads; stage kt-1 is free to refill
    const int64_t next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(int(next % STAGES), kt0 + next);
    cp_async_commit();

    const __nv_bfloat16* sa = smem + int(kt % STAGES) * Cfg::kStageElems;
    const __nv_bfloat16* sb = sa + BM * BK;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int r = wm * Cfg::TM + i * 16 + (lane & 15);
        ldmatrix_x4(af[i], smem_addr(sa + swz<BK>(r, kk * 2 + (lane >> 4))));
      }
      uint32_t bf[NI][2];
#pragma unroll
      for (int f = 0; f < NI; f += 2) {  // one x4: matrices 0,1 of fragment f; 2,3 of f+1
        const int r = b_frag_row(f + (lane >> 4)) + (lane & 7);
        uint32_t t[4];
        ldmatrix_x4(t, smem_addr(sb + swz<BK>(r, kk * 2 + ((lane >> 3) & 1))));
        bf[f][0] = t[0], bf[f][1] = t[1], bf[f + 1][0] = t[2], bf[f + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int f = 0; f < NI; ++f) mma_bf16(acc[i][f], af[i], bf[f][0], bf[f][1]);
    }
  }
  cp_async_wait<0>();

  // Epilogue: fragment (i, f) holds rows lane/4 and lane/4+8, columns 2*(lane%4) + {0,1}.
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * Cfg::TM + i * 16 + (lane >> 2) + h * 8;
      const int64_t id = s_ids[r];
      if (id >= p.num_assign) continue;  // padding row
      if constexpr (M == Mode::Up) {
        __nv_bfloat16* out_row = p.out + (row0 + r) * p.n_dim;
#pragma unroll
        for (int f = 0; f < NI / 2; ++f) {
          const int64_t n = n0 + wn * (Cfg::TN / 2) + f * 8 + (lane & 3) * 2;
          if (n >= p.n_dim) continue;
          const float* g = acc[i][f] + 2 * h;
          const float* u = acc[i][f + NI / 2] + 2 * h;
          *reinterpret_cast<uint32_t*>(out_row + n) =
              pack_bf16(canon::silu(g[0]) * u[0], canon::silu(g[1]) * u[1]);
        }
      } else {
        const float w = p.topk_weights[id];
        __nv_bfloat16* out_row = p.out + id * p.n_dim;
        float* partial_row = p.partials ? p.partials + (split * p.num_assign + id) * p.n_dim : nullptr;
#pragma unroll
        for (int f = 0; f < NI; ++f) {
          const int64_t n = n0 + wn * Cfg::TN + f * 8 + (lane & 3) * 2;
          if (n >= p.n_dim) continue;
          const float* c = acc[i][f] + 2 * h;
          if (partial_row)
            *reinterpret_cast<float2*>(partial_row + n) = make_float2(c[0] * w, c[1] * w);
          else
            *reinterpret_cast<uint32_t*>(out_row + n) = pack_bf16(c[0] * w, c[1] * w);
        }
      }
    }
}

// Persistent grid: a CTA walks work items (block, column tile) with a stride. The number of used
// blocks is read from the device (no host sync, graph-safe). Items are ordered in groups of
// kGroupBlocks blocks, column tiles outermost inside a group, so the CTAs running at once share a
// few experts' B tiles and a few blocks' A rows in L2.
constexpr int64_t kGroupBlocks = 8;

template <Mode M, int BM, int BN, int BK, int WM, int WN, int STAGES>
__global__ void __launch_bounds__(Tile<BM, BN, BK, WM, WN, STAGES>::kThreads, 1)
expert_gemm_kernel(const Params p) {
  dev::pdl_enter();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int64_t blocks = *p.num_rows_padded / BM;
  const int64_t tiles = blocks * p.n_tiles;
  const int64_t items = tiles * p.k_splits;
  const int64_t stride = wave_stride(items, gridDim.x);
  for (int64_t item = blockIdx.x; blockIdx.x < stride && item < items; item += stride) {
    const int split = int(item % p.k_splits);  // the K-slices of a tile run side by side
    const int64_t tile = item / p.k_splits;
    const int64_t group = tile / (kGroupBlocks * p.n_tiles);
    const int64_t first = group * kGroupBlocks;
    const int64_t in_group = min(kGroupBlocks, blocks - first);
    const int64_t j = tile - group * kGroupBlocks * p.n_tiles;
    gemm_tile<M, BM, BN, BK, WM, WN, STAGES>(p, first + j % in_group, j / in_group, split, smem_raw);
    __syncthreads();  // the next item refills the stages and s_ids
  }
}

}  // namespace moekit::kernels::gemm
