// mainloop.cuh — the consumer side of the mma.sync expert GEMM: one K-tile of the warp's
// fragments, ldmatrix from the swizzled ring slot and mma.m16n8k16 (bf16 in, FP32 accumulators).
//
// Warp (wm, wn) of the WM x WN grid owns rows [wm·TM, +TM) and B rows [wn·TN, +TN) of the tile.
// Up: its B rows are TN/2 gate rows from the tile's gate half and the same TN/2 columns from its up
// half, so the epilogue finds each gate value and its up value in the same thread.
#pragma once

#include <cstdint>

#include "common/async_copy.cuh"
#include "gemm/common.cuh"
#include "gemm/mma_sync/tile.hpp"

namespace moekit::kernels::gemm::mma_sync {

// This warp's place in the tile and the fragment layout: fragment (i, f) holds rows lane/4 and
// lane/4 + 8 of m16 tile i and columns 2·(lane%4) + {0, 1} of n8 fragment f.
template <Mode M, class Cfg>
struct WarpTile {
  int wm, wn, lane;
  __device__ __forceinline__ explicit WarpTile(int tid) : wm((tid >> 5) / Cfg::kWarpsN), wn((tid >> 5) % Cfg::kWarpsN), lane(tid & 31) {}
  // Tile row of fragment row half h of m16 tile i.
  __device__ __forceinline__ int row(int i, int h) const { return wm * Cfg::TM + i * 16 + (lane >> 2) + h * 8; }
  // Shared-memory row of B for n8 fragment f.
  __device__ __forceinline__ int b_frag_row(int f) const {
    constexpr int NI = Cfg::NI, TN = Cfg::TN;
    if constexpr (M == Mode::Up)
      return f < NI / 2 ? wn * (TN / 2) + f * 8 : Cfg::kBlockN / 2 + wn * (TN / 2) + (f - NI / 2) * 8;
    else
      return wn * TN + f * 8;
  }
};

// The tensor-core instruction of a K-step: bf16 m16n8k16, or e4m3 m16n8k32 (the same fragment
// bytes: common/async_copy.cuh), FP32 accumulators.
struct MmaBf16 {
  __device__ __forceinline__ static void apply(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    dev::mma_bf16(c, a, b0, b1);
  }
};
struct MmaE4m3 {
  __device__ __forceinline__ static void apply(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    dev::mma_e4m3(c, a, b0, b1);
  }
};

// Cfg's BK counts 2-byte units of the smem rows (an e4m3 K-tile of 128 is 64 units): the
// ldmatrix addressing is the same for both instructions.
template <int MI, int NI>
__device__ __forceinline__ void zero_accs(float (&acc)[MI][NI][4]) {
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
}

template <Mode M, class Cfg, class Mma = MmaBf16>
struct Mainloop {
  static constexpr int MI = Cfg::MI, NI = Cfg::NI, BM = Cfg::kBlockM, BK = Cfg::kBlockK;
  float acc[MI][NI][4];

  __device__ __forceinline__ void zero() { zero_accs(acc); }

  // acc += A·Bᵀ over the K-tile in ring slot `slot`.
  __device__ __forceinline__ void k_tile(const __nv_bfloat16* smem, int slot, const WarpTile<M, Cfg>& w) {
    k_steps<0, BK / 16>(smem, slot, w);
  }

  // acc += A·Bᵀ over K-steps [KK0, KK1) of the K-tile in `slot` (16 units each: an FP8 K-tile of
  // two scale blocks is summed one block at a time).
  template <int KK0, int KK1>
  __device__ __forceinline__ void k_steps(const __nv_bfloat16* smem, int slot, const WarpTile<M, Cfg>& w) {
    const __nv_bfloat16* sa = smem + slot * Cfg::kStageElems;
    const __nv_bfloat16* sb = sa + BM * BK;
#pragma unroll
    for (int kk = KK0; kk < KK1; ++kk) {
      uint32_t af[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int r = w.wm * Cfg::TM + i * 16 + (w.lane & 15);
        dev::ldmatrix_x4(af[i], smem_addr(sa + swz<BK>(r, kk * 2 + (w.lane >> 4))));
      }
      uint32_t bf[NI][2];
#pragma unroll
      for (int f = 0; f < NI; f += 2) {  // one x4: matrices 0,1 of fragment f; 2,3 of f+1
        const int r = w.b_frag_row(f + (w.lane >> 4)) + (w.lane & 7);
        uint32_t t[4];
        dev::ldmatrix_x4(t, smem_addr(sb + swz<BK>(r, kk * 2 + ((w.lane >> 3) & 1))));
        bf[f][0] = t[0], bf[f][1] = t[1], bf[f + 1][0] = t[2], bf[f + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int f = 0; f < NI; ++f) Mma::apply(acc[i][f], af[i], bf[f][0], bf[f][1]);
    }
  }
};

}  // namespace moekit::kernels::gemm::mma_sync
