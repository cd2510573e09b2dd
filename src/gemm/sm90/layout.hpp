// sm90_layout.hpp — the layout arithmetic of the Hopper (wgmma) expert GEMM, host and device.
//
// Everything here is a pure function so the CPU tests (tests/cpu/sm90_layout_test.cpp) can check
// it against the PTX ISA's definitions before the kernel (sm90_expert_gemm.cuh) ever runs:
// the 128-byte shared-memory swizzle the A producer writes and TMA/wgmma use, the wgmma matrix
// descriptor, where the m64nNk16 accumulator fragment puts each element, and the 4-lane
// transpose the epilogue uses to turn 4-byte fragments into 16-byte row stores.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/canon.hpp"  // MK_HD
#include "gemm/item_order.hpp"

namespace moekit::kernels::sm90 {

// ---- tile geometry ------------------------------------------------------------------------------
inline constexpr int kBlockM = 128;      // rows per tile: the aligned layout's block_m
inline constexpr int kBlockK = 64;       // bf16 per smem row = one 128-byte swizzle row
inline constexpr int kRowBytes = kBlockK * 2;
inline constexpr int kSwizzleAtomBytes = 8 * kRowBytes;  // 8 rows: the 128B pattern's period
inline constexpr int kWgmmaM = 64;       // rows per wgmma (one consumer warpgroup)
inline constexpr int kWgmmaK = 16;       // bf16 reduction depth per wgmma
inline constexpr int kConsumerWarpgroups = kBlockM / kWgmmaM;
inline constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
inline constexpr int kProducerThreads = 128;  // one warpgroup: A gather (cp.async) + B (TMA)
inline constexpr int kThreads = kConsumerThreads + kProducerThreads;
inline constexpr int kItemSlots = 2;  // the work-item channel's ring (sm90_expert_gemm.cuh)
static_assert(kRowBytes == 128, "the 128B swizzle needs rows of exactly 128 bytes");

// The tile configuration of one compiled instance: BN columns of B per tile, STAGES-deep ring.
template <int BN, int STAGES>
struct Config {
  static constexpr int kBlockN = BN;
  static constexpr int kStages = STAGES;
  static constexpr int kAccs = BN / 2;  // m64nBN f32 accumulators per consumer thread
  static constexpr uint32_t kABytes = kBlockM * kRowBytes;  // one stage of A: [128][64] bf16
  static constexpr uint32_t kBBytes = BN * kRowBytes;       // one stage of B: [BN][64] bf16
  static constexpr uint32_t kAOffset = 0;
  static constexpr uint32_t kBOffset = kAOffset + STAGES * kABytes;
  static constexpr uint32_t kBarOffset = kBOffset + STAGES * kBBytes;  // full[STAGES], empty[STAGES]
  // The work-item channel (sm90_expert_gemm.cuh "Work items"): item_full[2], item_empty[2], then
  // the two slots of {item, live warpgroups} (int32 each).
  static constexpr uint32_t kItemBarOffset = kBarOffset + 2 * STAGES * 8;
  static constexpr uint32_t kItemSlotOffset = kItemBarOffset + 2 * kItemSlots * 8;
  // +1024: the dynamic-smem base is only guaranteed 16-byte aligned; the kernel rounds it up.
  static constexpr size_t kSmemBytes = kItemSlotOffset + kItemSlots * 8 + kSwizzleAtomBytes;
  // full: 128 cp.async arrivals (.noinc) + 1 arrive.expect_tx of the TMA thread.
  static constexpr uint32_t kFullArrivals = kProducerThreads + 1;
  // empty: lane 0 of every consumer warp, once its warpgroup's wgmma on the stage completed.
  static constexpr uint32_t kEmptyArrivals = kConsumerThreads / 32;
  // item_full: the claiming thread; item_empty: lane 0 of every warp of the CTA, once it read the slot.
  static constexpr uint32_t kItemFullArrivals = 1;
  static constexpr uint32_t kItemEmptyArrivals = kThreads / 32;
  // 128·64 + 256·216 = 63488 <= the 384 × 168 registers the CTA is launched with. The producer
  // needs 64 since it publishes work items (claim, two ids); the consumers fit 216 without a spill.
  static constexpr int kProducerRegs = 64;
  static constexpr int kConsumerRegs = 216;
  // Output columns per tile: Up pairs BN/2 gate with the same BN/2 up columns.
  static constexpr int cols_per_tile(bool up) { return up ? BN / 2 : BN; }

  static_assert(BN == 128 || BN == 256, "wgmma wrappers exist for n128 and n256");
  static_assert(BN % 64 == 0, "Up stores BN/2 columns in groups of 32 (the quad transpose)");
  static_assert(STAGES >= 3, "a consumer holds two stages (one wgmma group in flight): 3 stages at least");
  static_assert(kABytes % kSwizzleAtomBytes == 0 && kBBytes % kSwizzleAtomBytes == 0,
                "every stage must start on a 1024-byte swizzle atom");
  static_assert(kBlockM * kBlockK / 8 == kProducerThreads * 8, "A gather: 8 chunks of 16 B per producer thread");
  static_assert(kProducerRegs * kProducerThreads + kConsumerRegs * kConsumerThreads <= 168 * kThreads,
                "setmaxnreg must stay within the registers the CTA was launched with");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0, "setmaxnreg takes multiples of 8");
};

// ---- 128-byte swizzle -----------------------------------------------------------------------------
// PTX ISA / CUDA driver (CU_TENSOR_MAP_SWIZZLE_128B, wgmma layout type 1): inside each 1024-byte
// atom, address bits [4,7) (the 16-byte chunk) are XORed with bits [7,10) (the row within 8).
// The tile starts 1024-byte aligned, so the row within the atom is row % 8.
MK_HD constexpr uint32_t sw128_address_bits(uint32_t linear_byte) {
  return linear_byte ^ (((linear_byte >> 7) & 7u) << 4);
}
// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a swizzled [rows][64] bf16 tile.
MK_HD constexpr uint32_t sw128_offset(uint32_t row, uint32_t chunk) {
  return row * uint32_t(kRowBytes) + ((chunk ^ (row & 7u)) << 4);
}

// ---- wgmma matrix descriptor (PTX ISA "Matrix Descriptor Format", sm_90a) ---------------------------
//   bits  0-13  start address          encode(addr)
//   bits 16-29  leading byte offset    encode(LBO): unused for K-major swizzled tiles; 16 B by convention
//   bits 32-45  stride byte offset     encode(SBO): from one 8-row core-matrix group to the next
//   bits 49-51  base offset            0: every descriptor start keeps address bits [7,10) = 0
//   bits 62-63  swizzle mode           1 = 128B, 2 = 64B, 3 = 32B, 0 = none
// with encode(x) = (x & 0x3FFFF) >> 4.
inline constexpr uint64_t kDescSwizzle128B = 1;
MK_HD constexpr uint64_t desc_encode(uint32_t x) { return uint64_t((x & 0x3FFFFu) >> 4); }
// K-major bf16 tile of 128-byte rows, 128B-swizzled: SBO = 8 rows * 128 B.
MK_HD constexpr uint64_t make_desc_k_sw128(uint32_t smem_addr) {
  return desc_encode(smem_addr) | (desc_encode(16) << 16) | (desc_encode(kSwizzleAtomBytes) << 32) |
         (kDescSwizzle128B << 62);
}
// Descriptor of the k16 slice `kk` (0..3) of the BK=64 tile starting `row0` rows in: the start moves
// kk * 32 bytes along the (pre-swizzle) row, as CUTLASS/DeepGEMM do — the hardware applies the
// XOR on the final address bits, so the slice stays consistent with the tile's swizzle.
MK_HD constexpr uint64_t desc_advance(uint64_t desc, uint32_t byte_offset) {
  return desc + desc_encode(byte_offset);
}

// ---- m64nNk16 f32 accumulator fragment (PTX ISA "wgmma .m64nNk16 register fragment layout D") ------
// Element v of a thread's N/2 accumulators, for warp `warp` (0..3) of the warpgroup and `lane`:
// each n8 column block j = v/4 is an m16n8 fragment: rows lane/4 (+8 for v%4 >= 2), columns
// 2*(lane%4) + v%2.
MK_HD constexpr int acc_row(int warp, int lane, int v) { return 16 * warp + lane / 4 + 8 * ((v >> 1) & 1); }
MK_HD constexpr int acc_col(int lane, int v) { return 8 * (v >> 2) + 2 * (lane & 3) + (v & 1); }

// ---- the epilogue's quad transpose ---------------------------------------------------------------
// Lane q (0..3 within a quad) holds x[i] = packed bf16 pair of columns 8i + 2q, +1 of one row, for
// four n8 blocks i. After the transpose it holds x[c] = columns 8q + 2c, +1: eight consecutive
// columns, one 16-byte store: a 4x4 transpose across the quad in two butterfly steps (lane masks
// 1 and 2). `shfl_xor(v, m)` returns lane q^m's v and must be called by all four lanes in the same
// order (it is __shfl_xor_sync on the device).
template <class ShflXor>
MK_HD void quad_exchange(uint32_t& lo, uint32_t& hi, bool upper, int m, ShflXor& shfl_xor) {
  // The lower lane of the pair keeps `lo` and sends `hi`; the upper lane keeps `hi`, sends `lo`.
  const uint32_t recv = shfl_xor(upper ? lo : hi, m);
  if (upper)
    lo = recv;
  else
    hi = recv;
}
template <class ShflXor>
MK_HD void quad_transpose(uint32_t (&x)[4], int q, ShflXor&& shfl_xor) {
  const bool bit0 = (q & 1) != 0, bit1 = (q & 2) != 0;
  quad_exchange(x[0], x[1], bit0, 1, shfl_xor);  // transpose the 2x2 blocks' insides
  quad_exchange(x[2], x[3], bit0, 1, shfl_xor);
  quad_exchange(x[0], x[2], bit1, 2, shfl_xor);  // swap the off-diagonal 2x2 blocks
  quad_exchange(x[1], x[3], bit1, 2, shfl_xor);
}

// The epilogue walks the output columns in groups g of 4 n8 blocks. Element i of group g, row
// half h, starts at accumulator epi_acc(g, i, h) (+1: the next column); after the transpose lane q
// stores the group's columns [epi_store_col(g, q), +8).
MK_HD constexpr int epi_acc(int g, int i, int h) { return 4 * (4 * g + i) + 2 * h; }
MK_HD constexpr int epi_store_col(int g, int q) { return 8 * (4 * g + q); }

// ---- persistent schedule -------------------------------------------------------------------------
// Work item -> (block, column tile): the order of both expert GEMMs (gemm/item_order.hpp).
using gemm::kGroupBlocks;
using TileCoord = gemm::GroupedTile<int32_t>;
// 32-bit on purpose: items = blocks · n_tiles stays far below 2^31 (blocks <= rows / 128 with rows
// indexed by int32 sorted_ids), and 64-bit division would cost the producer's few registers.
MK_HD constexpr TileCoord item_to_tile(int32_t item, int32_t blocks, int32_t n_tiles) {
  return gemm::grouped_tile(item, blocks, n_tiles);
}

}  // namespace moekit::kernels::sm90
