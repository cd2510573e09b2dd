// ragged.cuh — the backward's GEMMs over the forward's aligned layout (ragged M: each block of
// block_m sorted rows is one expert's), a CTA per BM-row block and 64-column tile:
//   recompute_h_kernel — h = x_t·W13_eᵀ [rows, 2F] (SavedActivations::recompute), stored bf16;
//   d_gemm_kernel      — D = dy_t·W2_e [rows, F] (W2_e [H, F] read N-major), and the epilogue that
//                        turns D, h and the routing weight into dh = dg | du, act_w = w·act and each
//                        column tile's ⟨D, act⟩ per assignment (dw_partials);
//   dx_gemm_kernel     — dx_rows[a] = dh·W13_e [H] (W13_e [2F, H] read N-major), or split-K partials.
// A kernel block of BM rows (16 for the decode layouts, block_m 16 and 32; 64 for block_m 64; 128,
// the 8-warp 128 x 256 tile of tile.cuh, for block_m 128) lies inside one layout block, so it has
// one expert. Shared memory is dynamic (the launcher gives Cfg::kSmemBytes). Row r's assignment is sorted_ids[r];
// padding rows (the sentinel T·k) load zeros and store nothing, and a BM-row block that starts
// with padding holds no assignment (an expert's assignments come first) and exits. The grid covers
// the worst-case rows; num_rows_padded is read on the device, so no host waits for it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "backward/loaders.cuh"
#include "backward/params.hpp"
#include "backward/tile.cuh"
#include "common/device.cuh"
#include "common/swiglu_grad.cuh"

namespace moekit::kernels::backward {

// The D GEMM's partial ⟨D, act⟩: one per row and 64-column group (moekit::kDGemmTileN); a tile
// covers BN / 64 groups.
inline constexpr int kRaggedTileN = 64;

// 16-row blocks by 64 on 1 x 4 warps (warp tile 16 x 16), 64-row blocks by 64 on 2 x 2 (32 x 32),
// 128-row blocks by 256 on 2 x 4 (64 x 64) over 4 stages.
template <int BM, Major B>
using RaggedTile = std::conditional_t<BM == 128, Tile<128, 256, 2, 4, Major::K, B, 4>,
                                      Tile<BM, kRaggedTileN, BM == 16 ? 1 : 2, BM == 16 ? 4 : 2, Major::K, B>>;

__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// This CTA's rows [row0, row0 + BM) and their expert; false when they hold no assignment.
template <int BM>
__device__ __forceinline__ bool ragged_rows(const Layout& L, int64_t& row0, int& expert) {
  row0 = int64_t(blockIdx.x) * BM;
  if (row0 >= *L.num_rows_padded) return false;
  if (L.sorted_ids[row0] >= L.num_assign) return false;
  expert = L.block_expert[row0 / L.block_m];
  return expert >= 0;
}

// Tile row r's A source: the token row of its assignment (x, dy), or, sorted, row r itself (dh).
__device__ __forceinline__ const bf16* token_row(const Layout& L, int64_t row, const bf16* base, int64_t stride) {
  const int64_t id = L.sorted_ids[row];
  return id < L.num_assign ? base + (id / L.topk) * stride : nullptr;
}
__device__ __forceinline__ const bf16* sorted_row(const Layout& L, int64_t row, const bf16* base, int64_t stride) {
  return L.sorted_ids[row] < L.num_assign ? base + row * stride : nullptr;
}

// The assignment of each of this thread's accumulator rows (the sentinel on padding rows).
template <class Cfg>
struct RowIds {
  int64_t id[Cfg::MI][2];
  __device__ __forceinline__ RowIds(const Layout& L, int64_t row0, const Mma<Cfg>& mma) {
#pragma unroll
    for (int i = 0; i < Cfg::MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) id[i][h] = L.sorted_ids[row0 + mma.row(i, h)];
  }
};

template <int BM>
__global__ void __launch_bounds__(RaggedTile<BM, Major::K>::kThreads) recompute_h_kernel(const RaggedParams p) {
  using Cfg = RaggedTile<BM, Major::K>;
  constexpr int NT = Cfg::kThreads;
  dev::pdl_enter();
  int64_t row0;
  int expert;
  if (!ragged_rows<BM>(p.layout, row0, expert)) return;
  bf16* smem = reinterpret_cast<bf16*>(backward_smem);
  const int tid = int(threadIdx.x);
  const Layout& L = p.layout;
  const int64_t n0 = int64_t(blockIdx.y) * Cfg::BN;
  const bf16* w13 = p.b + expert * p.b_expert_stride;  // [2F, H]
  const KRows<BM, NT> a([&](int r) { return token_row(L, row0 + r, p.a, p.a_stride); }, p.a, p.k_dim, p.k_dim, tid);
  const KRows<Cfg::BN, NT> b([&](int r) { return n0 + r < p.n_dim ? w13 + (n0 + r) * p.k_dim : nullptr; }, p.b,
                             p.k_dim, p.k_dim, tid);
  Mma<Cfg> mma(tid);
  const RowIds<Cfg> ids(L, row0, mma);
  k_loop(mma, smem, a, b, 0, ceil_div(p.k_dim, kTileK));
#pragma unroll
  for (int i = 0; i < Cfg::MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (ids.id[i][h] >= L.num_assign) continue;
      bf16* out = p.h_out + (row0 + mma.row(i, h)) * p.n_dim;
#pragma unroll
      for (int f = 0; f < Cfg::NI; ++f) {
        const int64_t n = n0 + mma.col(f);
        if (n < p.n_dim)
          *reinterpret_cast<uint32_t*>(out + n) = pack_bf16x2(mma.acc[i][f][2 * h], mma.acc[i][f][2 * h + 1]);
      }
    }
}

using dev::SwigluGrad;  // common/swiglu_grad.cuh

template <int BM>
__global__ void __launch_bounds__(RaggedTile<BM, Major::MN>::kThreads) d_gemm_kernel(const RaggedParams p) {
  using Cfg = RaggedTile<BM, Major::MN>;
  constexpr int NT = Cfg::kThreads;
  // A warp's columns lie in one 64-column group; a group's warps are consecutive in wn.
  constexpr int kGroups = Cfg::BN / kRaggedTileN, kGroupWarps = Cfg::WN / kGroups;
  static_assert(Cfg::BN % kRaggedTileN == 0 && kRaggedTileN % Cfg::TN == 0, "a warp's columns are in one group");
  dev::pdl_enter();
  int64_t row0;
  int expert;
  if (!ragged_rows<BM>(p.layout, row0, expert)) return;
  bf16* smem = reinterpret_cast<bf16*>(backward_smem);
  const int tid = int(threadIdx.x);
  const Layout& L = p.layout;
  const int64_t n0 = int64_t(blockIdx.y) * Cfg::BN, F = p.inter;
  const bf16* w2 = p.b + expert * p.b_expert_stride;  // [H, F]: row k = h holds the N = F values
  const KRows<BM, NT> a([&](int r) { return token_row(L, row0 + r, p.a, p.a_stride); }, p.a, p.k_dim, p.k_dim, tid);
  const MNRows<DenseRows, Cfg::BN, NT> b(DenseRows{w2, F, p.k_dim}, p.b, n0, F, tid);
  Mma<Cfg> mma(tid);
  const RowIds<Cfg> ids(L, row0, mma);
  k_loop(mma, smem, a, b, 0, ceil_div(p.k_dim, kTileK));

  // Each row's ⟨D, act⟩ over each 64-column group: the thread's columns in order, then its lane
  // quad (xor 1, 2: commutative adds, so the four lanes agree bitwise), then the group's warps in
  // order, through the (now free) ring.
  float* red = reinterpret_cast<float*>(smem);  // [WN][BM]
#pragma unroll
  for (int i = 0; i < Cfg::MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t id = ids.id[i][h], row = row0 + mma.row(i, h);
      float dot = 0.0f;
      if (id < L.num_assign) {
        const float w = p.topk_weights[id];
        const bf16* hr = p.h + row * 2 * F;  // g | u
#pragma unroll
        for (int f = 0; f < Cfg::NI; ++f) {
          const int64_t n = n0 + mma.col(f);
          if (n >= F) continue;
          const float2 g = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(hr + n));
          const float2 u = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(hr + F + n));
          const SwigluGrad e0(g.x, u.x, mma.acc[i][f][2 * h], w);
          const SwigluGrad e1(g.y, u.y, mma.acc[i][f][2 * h + 1], w);
          dot += mma.acc[i][f][2 * h] * e0.act;
          dot += mma.acc[i][f][2 * h + 1] * e1.act;
          if (p.dh) {
            *reinterpret_cast<uint32_t*>(p.dh + row * 2 * F + n) = pack_bf16x2(e0.dg, e1.dg);
            *reinterpret_cast<uint32_t*>(p.dh + row * 2 * F + F + n) = pack_bf16x2(e0.du, e1.du);
          }
          if (p.act_w) *reinterpret_cast<uint32_t*>(p.act_w + row * F + n) = pack_bf16x2(w * e0.act, w * e1.act);
        }
      }
      dot += __shfl_xor_sync(dev::kFullMask, dot, 1);
      dot += __shfl_xor_sync(dev::kFullMask, dot, 2);
      if ((mma.lane & 3) == 0) red[mma.wn * BM + mma.row(i, h)] = dot;
    }
  __syncthreads();
  for (int j = tid; j < kGroups * BM; j += NT) {
    const int g = j / BM, r = j % BM;
    const int64_t id = L.sorted_ids[row0 + r], group = n0 / kRaggedTileN + g;
    if (id < L.num_assign && group * kRaggedTileN < F) {
      float dot = 0.0f;
#pragma unroll
      for (int wn = 0; wn < kGroupWarps; ++wn) dot += red[(g * kGroupWarps + wn) * BM + r];
      p.dw_partials[group * L.num_assign + id] = dot;
    }
  }
}

template <int BM>
__global__ void __launch_bounds__(RaggedTile<BM, Major::MN>::kThreads) dx_gemm_kernel(const RaggedParams p) {
  using Cfg = RaggedTile<BM, Major::MN>;
  constexpr int NT = Cfg::kThreads;
  dev::pdl_enter();
  int64_t row0;
  int expert;
  if (!ragged_rows<BM>(p.layout, row0, expert)) return;
  bf16* smem = reinterpret_cast<bf16*>(backward_smem);
  const int tid = int(threadIdx.x);
  const Layout& L = p.layout;
  const int64_t n0 = int64_t(blockIdx.y) * Cfg::BN, H = p.n_dim;
  const int split = int(blockIdx.z);
  // K-slice `split`: K-tiles [kt0, kt0 + count); a trailing slice may have none (its partials are 0).
  const int64_t k_tiles = ceil_div(p.k_dim, kTileK), kt0 = split * p.k_tiles_per_split;
  const int64_t count = kt0 < k_tiles ? (k_tiles - kt0 < p.k_tiles_per_split ? k_tiles - kt0 : p.k_tiles_per_split) : 0;
  const bf16* w13 = p.b + expert * p.b_expert_stride;  // [2F, H]: row k = j holds the N = H values
  const KRows<BM, NT> a([&](int r) { return sorted_row(L, row0 + r, p.a, p.a_stride); }, p.a, p.k_dim, p.k_dim, tid);
  const MNRows<DenseRows, Cfg::BN, NT> b(DenseRows{w13, H, p.k_dim}, p.b, n0, H, tid);
  Mma<Cfg> mma(tid);
  const RowIds<Cfg> ids(L, row0, mma);
  k_loop(mma, smem, a, b, kt0, count);
#pragma unroll
  for (int i = 0; i < Cfg::MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t id = ids.id[i][h];
      if (id >= L.num_assign) continue;
#pragma unroll
      for (int f = 0; f < Cfg::NI; ++f) {
        const int64_t n = n0 + mma.col(f);
        if (n >= H) continue;
        const float v0 = mma.acc[i][f][2 * h], v1 = mma.acc[i][f][2 * h + 1];
        if (p.splits > 1)
          *reinterpret_cast<float2*>(p.dx_partials + (split * L.num_assign + id) * H + n) = make_float2(v0, v1);
        else
          *reinterpret_cast<uint32_t*>(p.dx_rows + id * H + n) = pack_bf16x2(v0, v1);
      }
    }
}

}  // namespace moekit::kernels::backward
