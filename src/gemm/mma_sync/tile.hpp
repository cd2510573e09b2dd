// tile.hpp — the geometry of one compiled mma.sync expert-GEMM config (host and device): the CTA
// tile, its warp grid, the cp.async ring, and the XOR swizzle of its shared-memory rows.
// The configs compiled are gemm/configs.hpp's MOEKIT_GEMM_CONFIGS.
#pragma once

#include <cstddef>

#include "common/canon.hpp"  // MK_HD

namespace moekit::kernels::gemm::mma_sync {

// BM x BN output tile (BN rows of B), BK-deep K-tiles, WM x WN warps, a STAGES-deep ring.
template <int BM, int BN, int BK, int WM, int WN, int STAGES>
struct Tile {
  static constexpr int kBlockM = BM, kBlockN = BN, kBlockK = BK, kStages = STAGES;
  static constexpr int kWarpsM = WM, kWarpsN = WN;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kChunks = BK / 8;  // 16-byte chunks per smem row
  static constexpr int TM = BM / WM, TN = BN / WN;  // one warp's rows and B rows
  static constexpr int MI = TM / 16, NI = TN / 8;   // its m16 and n8 fragments
  static constexpr int kAIters = BM * kChunks / kThreads;  // A chunks a thread loads per K-tile
  static constexpr int kBIters = BN * kChunks / kThreads;  // B chunks
  static constexpr int kStageElems = (BM + BN) * BK;
  static constexpr size_t kSmemBytes = size_t(STAGES) * kStageElems * 2;
  static_assert(BK == 64 || BK == 128, "the XOR swizzle needs at least 8 chunks per row");
  static_assert(TM % 16 == 0 && TN % 16 == 0, "warp tile must hold whole m16 and pairs of n8 fragments");
  static_assert(BM * kChunks % kThreads == 0 && BN * kChunks % kThreads == 0, "loads must split evenly");
  static_assert(STAGES >= 2, "the pipeline needs two stages at least");
};

// Swizzled element offset of 16-byte chunk `c` of row `r` in a row-of-BK tile: the chunk index is
// XORed with the row's low 3 bits, so the 8 rows an ldmatrix reads hit 8 different bank groups.
template <int BK>
MK_HD constexpr int swz(int r, int c) {
  return r * BK + ((c ^ (r & 7)) << 3);
}

}  // namespace moekit::kernels::gemm::mma_sync
