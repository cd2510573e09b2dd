// item_order.hpp — the order in which the expert GEMMs walk their tiles: fixed groups of blocks
// (mma.sync: mma_sync/scheduler.cuh; the weight gradients: sm90/weight_grad.cuh) or chunks that
// follow the experts (the wgmma expert GEMM: sm90/scheduler.cuh). Host and device: the CPU tests
// check both.
#pragma once

#include <cstdint>

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

// The wgmma expert GEMM's order: the same walk (column tiles outermost) over chunks that follow
// the experts instead of fixed groups. A fixed group of 8 blocks cut most experts of 4-5 blocks
// in two (DeepSeek-V3 T=16384), and the two parts of an expert ran a wave apart, each streaming
// the expert's 59 MB of w13 from DRAM: ncu read 33.6 GB for 15 GB of weights. A chunk is a run of
// one expert's blocks, whole when it has at most kGroupBlocks blocks, else its part inside one
// kGroupBlocks-aligned window (as the fixed groups; the bound keeps a chunk's A rows in L2 while
// its column tiles re-read them). The chunk of block p is a function of block_expert around p
// alone, p ± kGroupBlocks, so whichever item of a chunk is claimed first finds the same chunk.
struct BlockChunk {
  int32_t first, count;
};
// Lanes of the window: block p - kGroupBlocks + l for l = 0 .. 2·kGroupBlocks.
inline constexpr int kChunkWindow = 2 * kGroupBlocks + 1;
// same: bit l set when block p - kGroupBlocks + l exists (in [0, blocks)) and has p's expert (so
// bit kGroupBlocks is set).
MK_HD BlockChunk expert_chunk(uint32_t same, int32_t p) {
  constexpr int G = kGroupBlocks;
  const uint32_t below = ~same & ((1u << G) - 1u);                               // lanes 0 .. G-1
  const uint32_t above = ~same & ((1u << kChunkWindow) - 1u) & ~((2u << G) - 1u);  // lanes G+1 .. 2G
#if defined(__CUDA_ARCH__)
  const int highest_below = below ? 31 - __clz(below) : -1;
  const int lowest_above = above ? __ffs(above) - 1 : kChunkWindow;
#else
  const int highest_below = below ? 31 - __builtin_clz(below) : -1;
  const int lowest_above = above ? __builtin_ctz(above) : kChunkWindow;
#endif
  // The run's lanes [lo, hi): longer than G whenever the window does not show both of its ends.
  const int lo = highest_below + 1, hi = lowest_above;
  if (hi - lo <= G) return {p - G + lo, hi - lo};
  const int32_t w = p - p % G;  // the window's part; the run's ends, where they fall inside it
  const int32_t first = w > p - G + lo ? w : p - G + lo;
  const int32_t end = w + G < p - G + hi ? w + G : p - G + hi;
  return {first, end - first};
}
// Split-K: slice `split` multiplies K-tiles [kt0, kt0 + count) of the tile's k_tiles, kt0 = split ·
// per_split (per_split = ceil(k_tiles / splits): the launchers' k_tiles_per_split) and count =
// min(per_split, k_tiles - kt0), none for a slice past K (its partials are zeros): the mma.sync
// Down's slices and the wgmma DownSplitK's (the backward's dx GEMM computes the same inline,
// backward/ragged.cuh). I: int32_t in the wgmma kernel (its registers), int64_t in mma.sync. The
// form (min, then the clamp at zero) is the one the mma.sync kernels compiled before it was
// shared: their machine code is unchanged (scripts/sass-diff).
template <class I>
struct KRange {
  I kt0, count;
};
template <class I>
MK_HD constexpr KRange<I> k_slice_range(I split, I per_split, I k_tiles) {
  const I kt0 = split * per_split, left = k_tiles - kt0, count = left < per_split ? left : per_split;
  return {kt0, count > 0 ? count : I(0)};
}

// Item -> (block, column tile) inside its chunk (items of chunk c: [c.first, c.first + c.count)
// times n_tiles, as blocks · n_tiles items are numbered block-major).
MK_HD GroupedTile<int32_t> chunk_tile(int32_t item, BlockChunk c, int32_t n_tiles) {
  const int32_t j = item - c.first * n_tiles;
  return {c.first + j % c.count, j / c.count};
}

}  // namespace moekit::kernels::gemm
