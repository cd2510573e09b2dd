// expert_gemm.cuh — stages 3 and 4: the fused expert GEMMs on the tensor cores (mma.sync bf16).
//
// A work item is one block_m-row block of the aligned layout (one expert: block_expert[b]), one
// column tile and one K-slice; a persistent CTA takes several (expert_gemm_kernel). An item's rows
// come from sorted_ids: the up GEMM gathers x rows t = a/k inside the A-operand load (padding rows
// are zero-filled by cp.async and masked on store); the down GEMM reads act in sorted order. B is
// one expert's weights, K contiguous (w13 [2F,H], w2 [H,F]). Operands stream global -> shared
// through a `STAGES`-deep cp.async pipeline (16-byte chunks, XOR-swizzled rows,
// ldmatrix-conflict-free), then ldmatrix + mma.m16n8k16 with FP32 accumulators.
// Epilogues: Up — the tile's first half of columns is gate, the second half the same columns of
// up, paired in registers: act = silu(g)·u. Down — multiply by the routing weight of the row's
// assignment and store the row at a = sorted_ids[r].
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/canon.hpp"
#include "common/async_copy.cuh"
#include "common/device.cuh"
#include "common/silu.cuh"
#include "gemm/item_order.hpp"
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
  static constexpr size_t kSmemBytes = size_t(STAGES) * kStageElems * 2;
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

// Work items are (block, column tile, K-slice) triples: the tiles in gemm/item_order.hpp's order,
// the K-slices of a tile side by side.
struct Item {
  int64_t block, n_tile;
  int split;
};
__device__ __forceinline__ Item item_at(const Params& p, int64_t item, int64_t blocks) {
  const int split = int(item % p.k_splits);
  const GroupedTile<int64_t> t = grouped_tile(item / p.k_splits, blocks, p.n_tiles);
  return {t.block, t.n_tile, split};
}
// K-tiles [kt0, kt0 + count) of a K-slice; a trailing slice may have none (its partials are 0).
__device__ __forceinline__ int64_t split_k_tiles(const Params& p, int split, int64_t k_tiles_total, int64_t& kt0) {
  kt0 = split * p.k_tiles_per_split;
  return max(int64_t(0), min(p.k_tiles_per_split, k_tiles_total - kt0));
}

// Persistent grid: a CTA takes items blockIdx.x, + stride, ... (wave_stride). The number of used
// blocks is read from the device (no host sync, graph-safe).
//
// The CTA's K-tiles over all its items form one stream through a `STAGES`-deep cp.async ring:
// while the last K-tiles of an item are multiplied and its epilogue stores, the first K-tiles of
// the next item are already in flight, so the weight stream does not drain at item boundaries (a
// decode item is 6-56 K-tiles; a drained pipeline costs a memory round trip plus the epilogue).
// The routing an item's loads need (its expert, the sorted ids of this thread's A rows) is
// fetched one item ahead, and the ids of the epilogue's rows when its first K-tile is computed,
// so an item change does not wait on memory (unless items are shorter than the ring, or a K-slice
// is empty: the routing fetched for the next item is then used within a step). Each tile is still
// summed in K order by one CTA, so results are bitwise those of a tile-at-a-time loop. On the H200 (dev/s7-call2.sh, s7-call4.sh;
// docs/perf/NOTES.md v20) this made the decode GEMMs 1-8% faster than a tile-at-a-time loop that
// drained its pipeline at every item. The loader and the consumer are each inlined once: a first
// version that also unrolled them into the prologue doubled the code (past 4,000 SASS
// instructions) and cost the one-item-per-CTA layers (T = 1) 1.5-4.5 us of their launch overlap.
template <Mode M, int BM, int BN, int BK, int WM, int WN, int STAGES>
__global__ void __launch_bounds__(Tile<BM, BN, BK, WM, WN, STAGES>::kThreads, 1)
expert_gemm_kernel(const Params p) {
  using Cfg = Tile<BM, BN, BK, WM, WN, STAGES>;
  constexpr int CH = Cfg::kChunks, MI = Cfg::MI, NI = Cfg::NI;
  constexpr int kAI = Cfg::kAIters, kBI = Cfg::kBIters;
  constexpr int kColsPerTile = Cfg::template cols_per_tile<M>();
  dev::pdl_enter();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const int64_t blocks = *p.num_rows_padded / BM;
  const int64_t items = blocks * p.n_tiles * p.k_splits;
  const int64_t stride = wave_stride(items, gridDim.x);
  if (blockIdx.x >= stride || blockIdx.x >= items) return;
  const int64_t k_tiles_total = (p.k_dim + BK - 1) / BK;
  const int tid = int(threadIdx.x);

  // ---- Loader: issues the K-tiles of item ld_item, ld_kt .. ld_end (absolute K-tiles). It starts
  // one stride before its first item with nothing left, so its first call moves it there.
  int64_t ld_item = int64_t(blockIdx.x) - stride, ld_kt = 0, ld_end = 0;
  const __nv_bfloat16* a_src[kAI];
  bool a_ok[kAI];
  const __nv_bfloat16* b_src[kBI];
  bool b_ok[kBI];
  // Routing of the item after ld_item (loaded one item ahead; unused past the last item).
  Item nx_it{};
  int nx_expert = 0;
  int32_t nx_ids[kAI];
  auto fetch_routing = [&](int64_t item) {
    if (item >= items) return;
    nx_it = item_at(p, item, blocks);
    nx_expert = p.block_expert[nx_it.block];
#pragma unroll
    for (int i = 0; i < kAI; ++i) nx_ids[i] = p.sorted_ids[nx_it.block * BM + (tid + i * Cfg::kThreads) / CH];
  };
  // Point this thread's chunk sources at item `it` (routing given), and set its K range.
  auto bind = [&](const Item& it, int expert, const int32_t (&ids)[kAI]) {
    const int64_t n = split_k_tiles(p, it.split, k_tiles_total, ld_kt);
    ld_end = ld_kt + n;
#pragma unroll
    for (int i = 0; i < kAI; ++i) {
      const int r = (tid + i * Cfg::kThreads) / CH, c = (tid + i * Cfg::kThreads) % CH;
      const int64_t id = ids[i];
      a_ok[i] = id < p.num_assign;
      const int64_t src_row = M == Mode::Up ? (a_ok[i] ? id / p.topk : 0) : it.block * BM + r;
      a_src[i] = p.a + src_row * p.k_dim + c * 8;
    }
    const int64_t n0 = it.n_tile * kColsPerTile;
    const __nv_bfloat16* b_expert = p.b + int64_t(expert) * p.b_expert_stride;
#pragma unroll
    for (int i = 0; i < kBI; ++i) {
      const int r = (tid + i * Cfg::kThreads) / CH, c = (tid + i * Cfg::kThreads) % CH;
      int64_t col, b_row;
      if constexpr (M == Mode::Up) {
        col = n0 + (r < BN / 2 ? r : r - BN / 2);
        b_row = r < BN / 2 ? col : p.n_dim + col;
      } else {
        col = n0 + r;
        b_row = col;
      }
      b_ok[i] = col < p.n_dim;
      b_src[i] = b_expert + (b_ok[i] ? b_row : 0) * p.k_dim + c * 8;
    }
  };
  // Move the loader to the next item that has K-tiles (items of empty K-slices load nothing).
  auto advance = [&]() {
    do {
      ld_item += stride;
      if (ld_item >= items) return;
      bind(nx_it, nx_expert, nx_ids);
      fetch_routing(ld_item + stride);
    } while (ld_kt == ld_end);
  };
  fetch_routing(blockIdx.x);
  // Issue the next K-tile of the stream into ring slot `slot` (nothing once the stream is done).
  // Every piece of the loader and the consumer is inlined once (one loop below, no unrolled
  // prologue): the kernel's code stays as small as a tile-at-a-time loop's.
  auto load_next = [&](int slot) {
    if (ld_kt == ld_end) advance();
    if (ld_item >= items) return;
    __nv_bfloat16* sa = smem + slot * Cfg::kStageElems;
    __nv_bfloat16* sb = sa + BM * BK;
    const int64_t k0 = ld_kt * BK;
#pragma unroll
    for (int i = 0; i < kAI; ++i) {
      const int idx = tid + i * Cfg::kThreads, r = idx / CH, c = idx % CH;
      const bool ok = a_ok[i] && k0 + c * 8 < p.k_dim;
      cp_async16(smem_addr(sa + swz<BK>(r, c)), ok ? a_src[i] + k0 : p.a, ok ? 16u : 0u);
    }
#pragma unroll
    for (int i = 0; i < kBI; ++i) {
      const int idx = tid + i * Cfg::kThreads, r = idx / CH, c = idx % CH;
      const bool ok = b_ok[i] && k0 + c * 8 < p.k_dim;
      cp_async16(smem_addr(sb + swz<BK>(r, c)), ok ? b_src[i] + k0 : p.b, ok ? 16u : 0u);
    }
    ++ld_kt;
  };

  // ---- Consumer: multiplies the K-tiles of item c_item (c_left of them left), then stores it.
  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WN, wn = warp % WN;
  // smem row of B for n8 fragment f of this warp.
  auto b_frag_row = [&](int f) {
    if constexpr (M == Mode::Up)
      return f < NI / 2 ? wn * (Cfg::TN / 2) + f * 8 : BN / 2 + wn * (Cfg::TN / 2) + (f - NI / 2) * 8;
    else
      return wn * Cfg::TN + f * 8;
  };
  // Fragment (i, f) holds rows lane/4 and lane/4 + 8 of m16 tile i, columns 2*(lane%4) + {0,1}.
  auto epi_row = [&](int i, int h) { return wm * Cfg::TM + i * 16 + (lane >> 2) + h * 8; };

  float acc[MI][NI][4];
  auto zero_acc = [&]() {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  };
  zero_acc();

  int64_t c_item = int64_t(blockIdx.x) - stride, c_left = 0;
  bool have_item = false;
  Item c_it{};
  int32_t epi_ids[MI][2];
  auto epilogue = [&]() {
    const int64_t row0 = c_it.block * BM;
    const int64_t n0 = c_it.n_tile * kColsPerTile;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = epi_row(i, h);
        const int64_t id = epi_ids[i][h];
        if (id >= p.num_assign) continue;  // padding row
        if constexpr (M == Mode::Up) {
          __nv_bfloat16* out_row = p.out + (row0 + r) * p.n_dim;
#pragma unroll
          for (int f = 0; f < NI / 2; ++f) {
            const int64_t n = n0 + wn * (Cfg::TN / 2) + f * 8 + (lane & 3) * 2;
            if (n >= p.n_dim) continue;
            const float* g = acc[i][f] + 2 * h;
            const float* u = acc[i][f + NI / 2] + 2 * h;
            const float gate[2] = {g[0], g[1]};
            float silu[2];
            dev::silu_group(gate, silu);  // canon::silu's bits; one range branch a pair (unmeasured)
            *reinterpret_cast<uint32_t*>(out_row + n) = pack_bf16(silu[0] * u[0], silu[1] * u[1]);
          }
        } else {
          const float w = p.topk_weights[id];
          __nv_bfloat16* out_row = p.out + id * p.n_dim;
          float* partial_row = p.partials ? p.partials + (c_it.split * p.num_assign + id) * p.n_dim : nullptr;
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
    zero_acc();
  };

  // Steps -(STAGES - 1) .. -1 only fill the ring; step >= 0 multiplies K-tile `step` of the stream.
  for (int64_t step = 1 - STAGES;; ++step) {
    if (step >= 0) {
      while (c_left == 0) {  // the item is summed (or has no K-tiles): store it, take the next
        if (have_item) epilogue();
        have_item = true;
        c_item += stride;
        if (c_item >= items) {
          cp_async_wait<0>();
          return;
        }
        c_it = item_at(p, c_item, blocks);
        int64_t kt0;
        c_left = split_k_tiles(p, c_it.split, k_tiles_total, kt0);
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) epi_ids[i][h] = p.sorted_ids[c_it.block * BM + epi_row(i, h)];
      }
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // K-tile `step` landed for all threads; the slot of step - 1 is free to refill
    }
    load_next(int((step + STAGES - 1) % STAGES));
    cp_async_commit();
    if (step < 0) continue;

    const __nv_bfloat16* sa = smem + int(step % STAGES) * Cfg::kStageElems;
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
    --c_left;
  }
}

}  // namespace moekit::kernels::gemm
