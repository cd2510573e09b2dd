// cluster.cuh — the router logits x·w_gateᵀ of a bf16 w_gate on the tensor cores, for decode
// and mid-size batches: a CTA tile of MT·16 tokens x NT·8 experts, its H slices summed in
// order.cuh's order.
//   gate_logits_kernel         — decode (T <= 256): a cluster of kGateSlices CTAs per tile, CTA r
//                                computing slice r; the slice partials meet through distributed
//                                shared memory. Decode (T <= 16) spreads w_gate over E/8 x 8 CTAs,
//                                each with all its loads in flight at once.
//   gate_logits_looped_kernel  — prefill: one CTA per tile walks the slices itself.
// Both are bitwise the same logits (the same MMAs on the same operands, the same additions in the
// same order). Parts: warp_partial.cuh (mainloop), the reductions and stores here (epilogue), and
// for the cluster kernel with kQuantX (an FP8 layer at decode) x_quant.cuh: the first expert
// tile's CTAs quantize the x they read.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/canon.hpp"
#include "common/device.cuh"
#include "router/gate/warp_partial.cuh"
#include "router/gate/x_quant.cuh"

namespace moekit::kernels::router {

// Decode: a cluster of kGateSlices CTAs per tile, CTA r computing slice r; the slice partials
// meet in distributed shared memory. Many CTAs, each with one batch of loads in flight.
template <int MT, int NT, bool kQuantX>
__global__ void __cluster_dims__(kGateSlices, 1, 1) __launch_bounds__(32 * kGateWarps)
    gate_logits_kernel(GateParams p) {
  namespace cg = cooperative_groups;
  using Tile = GateTile<MT, NT>;
  constexpr int kRows = Tile::kRows, kCols = Tile::kCols;
  extern __shared__ __align__(16) unsigned char gate_smem[];
  __shared__ float s_slice[kRows * kCols];  // this slice's partial, read by the cluster
  const int slice = int(blockIdx.x % kGateSlices);
  const int e0 = int(blockIdx.x / kGateSlices) * kCols;
  const int64_t t0 = int64_t(blockIdx.y) * kRows;

  bool waited = false;
  const int64_t x_row_bytes = gate_x_row_bytes(p.hidden);
  unsigned char* x_tile = gate_smem + Tile::kSmemBytes;  // kQuantX: [kRows][x_row_bytes]
  warp_slice_partial<MT, NT, kQuantX>(p, slice, e0, t0, gate_smem, waited, dev::smem_addr(x_tile), x_row_bytes);
  if (!waited) dev::pdl_enter();
  __syncthreads();
  if constexpr (kQuantX)
    if (e0 == 0) quantize_x_slice<kRows>(p, slice, t0, x_tile, x_row_bytes);
  const int split = gate_split<MT, NT>(p.hidden, slice);
  for (int i = int(threadIdx.x); i < kRows * kCols; i += 32 * kGateWarps)
    s_slice[i] = sum_warp_partials<MT, NT>(split, gate_smem, i);

  // Slice partials, in slice order: CTA r of the cluster sums and stores every kGateSlices-th
  // block of the tile's elements, reading the other CTAs' s_slice.
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const unsigned rank = cluster.block_rank();
  for (int i = int(rank) * 32 * kGateWarps + int(threadIdx.x); i < kRows * kCols; i += kGateSlices * 32 * kGateWarps) {
    const int64_t t = t0 + i / kCols;
    const int e = e0 + i % kCols;
    float v = *cluster.map_shared_rank(&s_slice[i], 0);
#pragma unroll
    for (int sl = 1; sl < kGateSlices; ++sl) v = canon::add(v, *cluster.map_shared_rank(&s_slice[i], sl));
    if (t < p.tokens && e < p.experts) p.logits[t * p.experts + e] = v;
  }
  cluster.sync();  // no CTA leaves while another still reads its s_slice
}

// Prefill: one CTA per tile walks the slices itself, adding each slice's partial into a running
// sum in slice order: bitwise the cluster kernel's logits, without a cluster's launch and
// exchange per few hundred MMAs (at T = 16384 the cluster kernel ran 32768 CTAs).
template <int MT, int NT>
__global__ void __launch_bounds__(32 * kGateWarps) gate_logits_looped_kernel(GateParams p) {
  using Tile = GateTile<MT, NT>;
  constexpr int kRows = Tile::kRows, kCols = Tile::kCols;
  extern __shared__ __align__(16) unsigned char gate_smem[];
  __shared__ float s_sum[kRows * kCols];
  const int e0 = int(blockIdx.x) * kCols;
  const int64_t t0 = int64_t(blockIdx.y) * kRows;

  bool waited = false;
  for (int slice = 0; slice < kGateSlices; ++slice) {
    warp_slice_partial<MT, NT>(p, slice, e0, t0, gate_smem, waited);
    __syncthreads();
    const int split = gate_split<MT, NT>(p.hidden, slice);
    for (int i = int(threadIdx.x); i < kRows * kCols; i += 32 * kGateWarps) {
      const float v = sum_warp_partials<MT, NT>(split, gate_smem, i);
      s_sum[i] = slice == 0 ? v : canon::add(s_sum[i], v);
    }
    __syncthreads();  // the partials are read before the next slice's loads overwrite them
  }
  if (!waited) dev::pdl_enter();
  for (int i = int(threadIdx.x); i < kRows * kCols; i += 32 * kGateWarps) {
    const int64_t t = t0 + i / kCols;
    const int e = e0 + i % kCols;
    if (t < p.tokens && e < p.experts) p.logits[t * p.experts + e] = s_sum[i];
  }
}

}  // namespace moekit::kernels::router
