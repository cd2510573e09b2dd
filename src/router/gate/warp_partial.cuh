// warp_partial.cuh — the mainloop of the cluster and looped gate kernels (cluster.cuh): one warp's
// partial of one H slice for a CTA's tile of tokens x experts, loaded through shared memory and
// multiplied with mma.sync m16n8k16 (exact bf16 products, FP32 accumulation), in order.cuh's
// order; and the sum of the warps' partials in warp order.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/async_copy.cuh"
#include "common/canon.hpp"
#include "common/device.cuh"
#include "router/gate/order.cuh"

namespace moekit::kernels::router {

// Loads go through shared memory with cp.async (common/async_copy.cuh): every load of a batch is
// issued before any is waited for (register loads issued in order behind an MMA would wait for
// the MMA's operands: one memory round trip per MMA group instead of one per batch). Out-of-range
// chunks are zero-filled (source size 0).

// u32 j (0..3) of a 16-byte vector.
__device__ __forceinline__ uint32_t word(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }
// Half j of a step (a lane's columns 4j..4j+3 of its 8) as one m16n8k16 MMA: x rows g and g + 8
// (x_lo, x_hi) against w_gate row g, the same k slots on both sides (warp_slice_partial).
__device__ __forceinline__ void mma_step_half(float (&acc)[4], const uint4& x_lo, const uint4& x_hi, const uint4& w,
                                              int j) {
  const uint32_t a[4] = {word(x_lo, 2 * j), word(x_hi, 2 * j), word(x_lo, 2 * j + 1), word(x_hi, 2 * j + 1)};
  dev::mma_bf16(acc, a, word(w, 2 * j), word(w, 2 * j + 1));
}

// How a slice's roles spread over the CTA's kGateWarps warps. The non-empty roles of slice r are
// its first min(8, slice blocks) (order.cuh); where they are at most 4 (or 2), each role's tile is
// split between 2 (or 4) warps, each multiplying a part of the tile's 16 x 8 fragments — the same
// MMAs on the same operands for every output, so the same bits — instead of leaving warps idle
// while one warp runs the role's whole chain (Qwen3's H = 2048 has 2 blocks a slice). A split
// F of an MT x NT tile of fragments: by rows where MT allows, else rows and columns, else columns.
template <int MT, int NT, int F>
struct GateSplit {
  static constexpr bool kRows = MT % F == 0;
  static constexpr bool kBoth = !kRows && F == 4 && MT % 2 == 0 && NT % 2 == 0;
  static constexpr bool kOk = kRows || kBoth || NT % F == 0;
  static constexpr int kMT = kRows ? MT / F : kBoth ? MT / 2 : MT;  // the part's fragments
  static constexpr int kNT = kRows ? NT : kBoth ? NT / 2 : NT / F;
};
// Warps a role for slice `slice` of H in an MT x NT tiling: 4, 2 or 1.
template <int MT, int NT>
__device__ __forceinline__ int gate_split(int64_t hidden, int slice) {
  const int64_t roles = min(int64_t(kGateWarps), gate_slice_blocks(hidden, slice));
  if (roles <= 2 && GateSplit<MT, NT, 4>::kOk) return 4;
  if (roles <= 4 && GateSplit<MT, NT, 2>::kOk) return 2;
  return 1;
}

// One warp's part of role `role` of a slice for the CTA's tile (tokens t0.., experts e0..): the
// MTW x NTW fragments from (mt0, nt0), written to the warp's own part of `smem` at their place in
// a [kRows][kCols] float tile: the role's steps in ascending order (order.cuh). The first call
// issues its first w_gate loads before the PDL wait: x may be the previous kernel's output,
// w_gate must not be. That holds for every moekit kernel (none writes a weight) and for any kernel
// that does not trigger its dependents early (griddepcontrol.launch_dependents): such a kernel
// completes before this one starts. A caller whose own PDL kernel writes w_gate right before
// route() must put a plain launch or an event between them.
// kKeepX (an FP8 layer's gate, params.hpp): where keep_x, the x chunks land in the CTA's x tile
// of the slice (`x_tile`, rows of `x_row_bytes`) instead of the warp's staging, where they stay
// for quantize_x_slice; chunks past H still go to the staging (zero-filled, never kept). (Of the
// warps that split a role by columns, one keeps x: the others load the same rows.)
template <int MT, int NT, int MTW, int NTW, bool kKeepX>
__device__ __forceinline__ void warp_role_partial(const GateParams& p, const GateRole& role, int mt0, int nt0, bool keep_x,
                                                  int e0, int64_t t0, unsigned char* smem, bool& waited,
                                                  uint32_t x_tile, int64_t x_row_bytes) {
  using Tile = GateTile<MT, NT>;
  constexpr int kCols = Tile::kCols, kUnroll = Tile::kUnroll;
  constexpr int kChunks = NTW + 2 * MTW;  // of the part: fits the tile's staging
  static_assert(kGateBlockSteps % kUnroll == 0, "a batch of steps never straddles two blocks");
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id();
  const int g = lane >> 2, q = lane & 3;  // the mma fragment's row group and quad lane
  unsigned char* my_smem = smem + warp * Tile::kWarpBytes;
  // Staging: [u][chunk][lane] 16-byte slots; chunk nt (w rows) then NTW + 2*mt + h (x rows).
  const uint32_t stage = uint32_t(__cvta_generic_to_shared(my_smem));
  auto slot = [&](int u, int chunk) { return stage + uint32_t(((u * kChunks + chunk) * 32 + lane) * 16); };
  const int64_t H = p.hidden;
  const int64_t steps = role.steps();
  // Where x chunk (u, mt, h) of the batch at step s0 lands (and is read back from).
  auto x_slot = [&](int u, int mt, int h, int64_t s0, bool in) -> uint32_t {
    if constexpr (kKeepX) {
      if (in && keep_x)
        return x_tile + uint32_t(int64_t((mt0 + mt) * 16 + g + 8 * h) * x_row_bytes +
                                 (role.slice_column(s0 + u) + q * 8) * 2);
    }
    return slot(u, NTW + 2 * mt + h);
  };
  const uint32_t smem_base = uint32_t(__cvta_generic_to_shared(smem));

  // Rows this lane loads: tokens t0 + (mt0 + mt)*16 + g (+8), experts e0 + (nt0 + nt)*8 + g.
  const __nv_bfloat16* xr[MTW][2];
  bool xok[MTW][2];
#pragma unroll
  for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = t0 + (mt0 + mt) * 16 + g + 8 * h;
      xok[mt][h] = t < p.tokens;
      xr[mt][h] = p.x + (xok[mt][h] ? t : 0) * H + q * 8;
    }
  const __nv_bfloat16* wr[NTW];
  bool wok[NTW];
#pragma unroll
  for (int nt = 0; nt < NTW; ++nt) {
    const int e = e0 + (nt0 + nt) * 8 + g;
    wok[nt] = e < p.experts;
    wr[nt] = p.w_gate + int64_t(wok[nt] ? e : 0) * H + q * 8;
  }

  float acc[MTW][NTW][4];
#pragma unroll
  for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  for (int64_t s0 = 0; s0 < steps; s0 += kUnroll) {  // kUnroll divides a block's 4 steps
    __syncwarp();  // the previous batch's slots have been read by every lane
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = role.column(s0 + u) + q * 8;
      const bool in = k < H;
#pragma unroll
      for (int nt = 0; nt < NTW; ++nt) dev::cp_async16(slot(u, nt), wr[nt] + (k - q * 8), in && wok[nt] ? 16u : 0u);
    }
    if (!waited) {
      dev::pdl_enter();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = role.column(s0 + u) + q * 8;
      const bool in = k < H;
#pragma unroll
      for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          dev::cp_async16(x_slot(u, mt, h, s0, in), xr[mt][h] + (k - q * 8), in && xok[mt][h] ? 16u : 0u);
    }
    dev::cp_async_wait_all();  // each lane reads back only its own slots
    // A lane's 8 columns feed two k16 MMAs: columns 0-3 are the fragment's k slots {2q, 2q+1,
    // 2q+8, 2q+9} of the first, columns 4-7 of the second. A and B use the same assignment, so
    // each MMA still pairs x[t][c] with w[e][c].
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = role.column(s0 + u) + q * 8;
      const bool in = k < H;
      uint4 wv[NTW], xv[MTW][2];
#pragma unroll
      for (int nt = 0; nt < NTW; ++nt) wv[nt] = *reinterpret_cast<const uint4*>(my_smem + (slot(u, nt) - stage));
#pragma unroll
      for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          xv[mt][h] = *reinterpret_cast<const uint4*>(smem + (x_slot(u, mt, h, s0, in) - smem_base));
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
          for (int nt = 0; nt < NTW; ++nt) mma_step_half(acc[mt][nt], xv[mt][0], xv[mt][1], wv[nt], j);
    }
  }
  __syncwarp();  // staging reads done before the partial overwrites it

  // C fragment: c0,c1 row g cols 2q,2q+1; c2,c3 row g+8.
  float (*part)[kCols] = reinterpret_cast<float (*)[kCols]>(my_smem);
#pragma unroll
  for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt) {
      const int r = (mt0 + mt) * 16 + g, c = (nt0 + nt) * 8 + 2 * q;
      part[r][c] = acc[mt][nt][0];
      part[r][c + 1] = acc[mt][nt][1];
      part[r + 8][c] = acc[mt][nt][2];
      part[r + 8][c + 1] = acc[mt][nt][3];
    }
}

// The part of a role that warp `warp` takes in a split F: role warp / F, part warp % F, its
// first fragment (mt0, nt0).
template <int MT, int NT, int F>
struct GatePart {
  using S = GateSplit<MT, NT, F>;
  static constexpr int kColParts = NT / S::kNT;
  __device__ static int mt0(int part) { return part / kColParts * S::kMT; }
  __device__ static int nt0(int part) { return part % kColParts * S::kNT; }
};

template <int MT, int NT, int F, bool kKeepX>
__device__ __forceinline__ void warp_split_partial(const GateParams& p, int slice, int e0, int64_t t0,
                                                   unsigned char* smem, bool& waited, uint32_t x_tile,
                                                   int64_t x_row_bytes) {
  using S = GateSplit<MT, NT, F>;
  using Part = GatePart<MT, NT, F>;
  const int warp = int(threadIdx.x >> 5), part = warp % F;
  const GateRole role(p.hidden, slice, warp / F);  // past the slice's roles: no steps
  warp_role_partial<MT, NT, S::kMT, S::kNT, kKeepX>(p, role, Part::mt0(part), Part::nt0(part), Part::nt0(part) == 0,
                                                    e0, t0, smem, waited, x_tile, x_row_bytes);
}

// f(std::integral_constant<int, F>{}) for the split F = split (gate_split's: 4, 2 or 1), each F
// compiled only where the tiling allows it: the one dispatch of the slice's loads and of its sum.
template <int MT, int NT, class Fn>
__device__ __forceinline__ auto with_gate_split(int split, Fn&& f) {
  if constexpr (GateSplit<MT, NT, 4>::kOk) {
    if (split == 4) return f(std::integral_constant<int, 4>{});
  }
  if constexpr (GateSplit<MT, NT, 2>::kOk) {
    if (split == 2) return f(std::integral_constant<int, 2>{});
  }
  return f(std::integral_constant<int, 1>{});
}

// This warp's share of one slice for the CTA's tile (gate_split: a role alone, or a part of one).
template <int MT, int NT, bool kKeepX = false>
__device__ __forceinline__ void warp_slice_partial(const GateParams& p, int slice, int e0, int64_t t0,
                                                   unsigned char* smem, bool& waited, uint32_t x_tile = 0,
                                                   int64_t x_row_bytes = 0) {
  with_gate_split<MT, NT>(gate_split<MT, NT>(p.hidden, slice), [&](auto f) {
    warp_split_partial<MT, NT, decltype(f)::value, kKeepX>(p, slice, e0, t0, smem, waited, x_tile, x_row_bytes);
  });
}

// Element i of the tile of slice `slice` summed over its role partials, in role order (after a
// __syncthreads): role w's value of element i is in the slab of the warp whose part holds it;
// a role past the slice's roles adds a zero partial (as the pipelined kernel folds one).
template <int MT, int NT, int F>
__device__ __forceinline__ float sum_role_partials(const unsigned char* smem, int i) {
  using Tile = GateTile<MT, NT>;
  using S = GateSplit<MT, NT, F>;
  const int mt = i / Tile::kCols / 16, nt = i % Tile::kCols / 8;
  const int part = mt / S::kMT * GatePart<MT, NT, F>::kColParts + nt / S::kNT;
  auto at = [&](int w) { return reinterpret_cast<const float*>(smem + (w * F + part) * Tile::kWarpBytes)[i]; };
  float v = at(0);
#pragma unroll
  for (int w = 1; w < kGateWarps; ++w) v = canon::add(v, w * F < kGateWarps ? at(w) : 0.0f);
  return v;
}
// split: gate_split's for the slice, as warp_slice_partial took it.
template <int MT, int NT>
__device__ __forceinline__ float sum_warp_partials(int split, const unsigned char* smem, int i) {
  return with_gate_split<MT, NT>(split, [&](auto f) { return sum_role_partials<MT, NT, decltype(f)::value>(smem, i); });
}

}  // namespace moekit::kernels::router
