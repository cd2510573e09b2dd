// scheduler.cuh — which work items a CTA of the mma.sync (decode) expert GEMM takes, and in what
// order: the persistent grid's items dealt round-robin, over as many CTAs as even waves allow.
//
// A work item is (block, column tile, K-slice): the tiles in gemm/item_order.hpp's order, the
// K-slices of one tile side by side. CTA c takes items c, c + stride, ... with stride =
// wave_stride(items, grid) (waves.hpp: the CTAs past it exit at once). The number of used blocks
// is read from the device (num_rows_padded), so the grid is sized for the worst case on the host
// and the launch needs no host sync.
#pragma once

#include <cstdint>

#include "gemm/common.cuh"
#include "gemm/item_order.hpp"
#include "gemm/mma_sync/waves.hpp"

namespace moekit::kernels::gemm::mma_sync {

struct Item {
  int64_t block, n_tile;
  int split;
};

// kCluster > 1 (the FP8 up GEMM's narrow tiles, fp8.cuh): a cluster of kCluster CTAs takes
// each item together, CTA rank r its column tile kCluster·j + r of the item's column group j;
// the clusters are dealt the items as single CTAs are.
template <class Cfg, int kCluster = 1>
struct DealtSchedule {
  int64_t blocks, n_groups, items, stride;

  __device__ __forceinline__ explicit DealtSchedule(const Params& p)
      : blocks(*p.num_rows_padded / Cfg::kBlockM),
        n_groups((p.n_tiles + kCluster - 1) / kCluster),
        items(blocks * n_groups * p.k_splits),
        stride(wave_stride(items, gridDim.x / kCluster)) {}

  // This CTA's place: its cluster (the unit items are dealt to) and its rank in it.
  __device__ __forceinline__ static int64_t unit() { return int64_t(blockIdx.x / kCluster); }
  __device__ __forceinline__ static int rank() { return int(blockIdx.x % kCluster); }

  // Whether this CTA takes any item (else it exits before touching shared memory; a cluster's
  // CTAs decide alike).
  __device__ __forceinline__ bool cta_has_items() const { return unit() < stride && unit() < items; }
  // The item this CTA takes after `item` (its first: its unit); >= items once it is done.
  __device__ __forceinline__ int64_t first() const { return unit(); }
  __device__ __forceinline__ int64_t next(int64_t item) const { return item + stride; }
  __device__ __forceinline__ bool done(int64_t item) const { return item >= items; }

  __device__ __forceinline__ Item at(const Params& p, int64_t item) const {
    const int split = int(item % p.k_splits);
    const GroupedTile<int64_t> t = grouped_tile(item / p.k_splits, blocks, n_groups);
    return {t.block, t.n_tile * kCluster + rank(), split};
  }
};

// K-tiles [kt0, kt0 + count) of a K-slice (k_slice_range); a trailing slice may have none.
__device__ __forceinline__ int64_t split_k_tiles(const Params& p, int split, int64_t k_tiles_total, int64_t& kt0) {
  const KRange<int64_t> r = k_slice_range<int64_t>(split, p.k_tiles_per_split, k_tiles_total);
  kt0 = r.kt0;
  return r.count;
}

}  // namespace moekit::kernels::gemm::mma_sync
