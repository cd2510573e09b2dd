// weight_grad.cuh — the weight gradients: k-grouped GEMMs whose K is an expert's sorted rows.
//   expert_row_start_kernel — each expert's first sorted row (the padded counts' prefix sum);
//   weight_grad_kernel      — one tile of dW_e per CTA (64 x 64 on 4 warps for the decode layouts
//                             and block_m 64, 128 x 256 on 8 for block_m 128): dW2_e = Σ_r dy_tᵀ·act_w[r] and
//                             dW13_e = Σ_r dh[r]ᵀ·x_t over e's rows r in ascending order (both
//                             operands MN-major: a sorted row holds a K index's M or N values);
//                             with S > 1 slices of the rows, FP32 partials;
//   split_sum_kernel        — the partials summed in slice order into the output (dW, d_w_gate).
// An expert with no rows sums nothing: its tiles store exact zeros (or add nothing when
// accumulating). Every element is one thread's FP32 sum in row order, then slice order.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "backward/loaders.cuh"
#include "backward/params.hpp"
#include "backward/tile.cuh"
#include "common/device.cuh"

namespace moekit::kernels::backward {

// dW tiles, K steps of 64 sorted rows: by the ragged tile's rows (BackwardPlan::ragged_tile_rows).
template <int RaggedRows>
using WeightTile = std::conditional_t<RaggedRows == 128, Tile<128, 256, 2, 4, Major::MN, Major::MN, 4>,
                                      Tile<64, 64, 2, 2, Major::MN, Major::MN>>;

// One warp per launch: expert_row_start[e] = Σ_{e' < e} ceil(counts[e'] / block_m)·block_m, and
// [E] = their sum, as align laid the experts out in id order.
__global__ void __launch_bounds__(32) expert_row_start_kernel(const RowStartParams p) {
  dev::pdl_enter();
  const int lane = dev::lane_id();
  int32_t carry = 0;
  for (int base = 0; base < p.experts; base += 32) {
    const int e = base + lane;
    const int32_t padded = e < p.experts ? (p.expert_counts[e] + p.block_m - 1) / p.block_m * p.block_m : 0;
    const int32_t incl = dev::warp_inclusive_sum(padded);
    if (e < p.experts) p.expert_row_start[e] = carry + incl - padded;
    carry += __shfl_sync(dev::kFullMask, incl, 31);
  }
  if (lane == 0) p.expert_row_start[p.experts] = carry;
}

// Store a finished tile of a weight-shaped output: rows [m0, + BM) of expert e, split `split`.
template <class Cfg>
__device__ __forceinline__ void store_weight_tile(const WeightOut& o, const Mma<Cfg>& mma, int64_t e, int split,
                                                  int64_t m0, int64_t n0) {
  const int64_t plane = o.rows * o.cols;
#pragma unroll
  for (int i = 0; i < Cfg::MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + mma.row(i, h);
      if (m >= o.rows) continue;
#pragma unroll
      for (int f = 0; f < Cfg::NI; ++f) {
        const int64_t n = n0 + mma.col(f);
        if (n >= o.cols) continue;
        const int64_t at = e * plane + m * o.cols + n;
        float2 v = make_float2(mma.acc[i][f][2 * h], mma.acc[i][f][2 * h + 1]);
        if (o.partials) {
          *reinterpret_cast<float2*>(o.partials + split * o.experts * plane + at) = v;
        } else if (o.f32) {
          float2* dst = static_cast<float2*>(o.out) + at / 2;  // at is even: n and cols are
          if (o.accumulate) {
            const float2 old = *dst;
            v = make_float2(old.x + v.x, old.y + v.y);
          }
          *dst = v;
        } else {
          *reinterpret_cast<uint32_t*>(static_cast<bf16*>(o.out) + at) = pack_bf16x2(v.x, v.y);
        }
      }
    }
}

// grid: (m tiles x n tiles, E, S). M = out.rows, N = out.cols; WeightTile<RaggedRows>.
template <int RaggedRows>
__global__ void __launch_bounds__(WeightTile<RaggedRows>::kThreads) weight_grad_kernel(const WeightGradParams p) {
  using Cfg = WeightTile<RaggedRows>;
  constexpr int NT = Cfg::kThreads;
  dev::pdl_enter();
  bf16* smem = reinterpret_cast<bf16*>(backward_smem);
  const int tid = int(threadIdx.x);
  const Layout& L = p.layout;
  const int64_t e = blockIdx.y, n_tiles = (p.out.cols + Cfg::BN - 1) / Cfg::BN;
  const int64_t m0 = int64_t(blockIdx.x) / n_tiles * Cfg::BM, n0 = int64_t(blockIdx.x) % n_tiles * Cfg::BN;
  const int split = int(blockIdx.z);
  const int64_t first = p.expert_row_start[e], end = first + p.expert_counts[e];  // the assignments, not the padding
  // This slice's K-tiles of the expert's rows (a trailing slice may have none).
  const int64_t k_tiles = (end - first + kTileK - 1) / kTileK, per_split = (k_tiles + p.splits - 1) / p.splits;
  const int64_t kt0 = split * per_split;
  const int64_t count = kt0 < k_tiles ? (k_tiles - kt0 < per_split ? k_tiles - kt0 : per_split) : 0;
  const MNRows<SortedRows, Cfg::BM, NT> a(SortedRows{p.a, L.sorted_ids, first, end, L.num_assign, L.topk}, p.a.base,
                                          m0, p.out.rows, tid);
  const MNRows<SortedRows, Cfg::BN, NT> b(SortedRows{p.b, L.sorted_ids, first, end, L.num_assign, L.topk}, p.b.base,
                                          n0, p.out.cols, tid);
  // Accumulating into f32 dW, an expert with no rows adds nothing: its main_grad is left bitwise as
  // it was (adding +0 would turn a -0 into +0) and unread (at a few tokens on many experts, most of
  // the bytes). Split, its partials are zeros and the split sum skips it.
  if (p.out.accumulate && !p.out.partials && end == first) return;
  Mma<Cfg> mma(tid);
  k_loop(mma, smem, a, b, kt0, count);
  store_weight_tile(p.out, mma, e, split, m0, n0);
}

// A thread per 4 elements: out = (accumulate ? out : 0) + (p_0 + p_1 + ... + p_{S-1}); accumulating,
// an expert with no rows is left alone.
__global__ void __launch_bounds__(256) split_sum_kernel(const SplitSumParams p) {
  dev::pdl_enter();
  const int64_t i = (int64_t(blockIdx.x) * 256 + threadIdx.x) * 4;
  if (i >= p.n) return;
  if (p.expert_counts && p.expert_counts[i / p.plane] == 0) return;  // accumulating: nothing to add
  float4 s = *reinterpret_cast<const float4*>(p.partials + i);
  for (int k = 1; k < p.splits; ++k) {
    const float4 v = *reinterpret_cast<const float4*>(p.partials + k * p.n + i);
    s = make_float4(s.x + v.x, s.y + v.y, s.z + v.z, s.w + v.w);
  }
  if (p.f32) {
    float4* dst = static_cast<float4*>(p.out) + i / 4;
    if (p.accumulate) {
      const float4 old = *dst;
      s = make_float4(old.x + s.x, old.y + s.y, old.z + s.z, old.w + s.w);
    }
    *dst = s;
  } else {
    *reinterpret_cast<uint2*>(static_cast<bf16*>(p.out) + i) = make_uint2(pack_bf16x2(s.x, s.y), pack_bf16x2(s.z, s.w));
  }
}

}  // namespace moekit::kernels::backward
