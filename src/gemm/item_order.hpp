// item_order.hpp — the order in which both expert GEMMs (mma.sync: expert_gemm.cuh; wgmma:
// sm90_expert_gemm.cuh) walk their tiles (host and device: the CPU tests check it).
#pragma once

#include "common/canon.hpp"  // MK_HD

namespace moekit::kernels::gemm {

// Tiles are (block, column tile) pairs in groups of kGroupBlocks blocks, column tiles outermost
// inside a group, so the CTAs running at once share a few experts' B tiles and a few blocks' A
// rows in L2. I: int32_t where the caller's counts are known to fit (the wgmma producer, which
// cannot spare the registers of 64-bit division), else int64_t.
inline constexpr int kGroupBlocks = 8;
template <class I>
struct GroupedTile {
  I block, n_tile;
};
template <class I>
MK_HD constexpr GroupedTile<I> grouped_tile(I tile, I blocks, I n_tiles) {
  const I group = tile / (kGroupBlocks * n_tiles);
  const I first = group * kGroupBlocks;
  const I in_group = blocks - first < kGroupBlocks ? blocks - first : I(kGroupBlocks);
  const I j = tile - group * kGroupBlocks * n_tiles;
  return {first + j % in_group, j / in_group};
}

}  // namespace moekit::kernels::gemm
