// layout.hpp — the layout arithmetic of the Hopper (wgmma) expert GEMM, host and device.
//
// Everything here is a pure function so the CPU tests (tests/cpu/sm90_layout_test.cpp) can check
// it against the PTX ISA's definitions before the kernel ever runs: the 128-byte shared-memory
// swizzle the A producer writes and TMA/wgmma use, the wgmma matrix descriptor, where the
// m64nNk16 accumulator fragment puts each element, the 4-lane transpose the epilogue uses to turn
// 4-byte fragments into 16-byte row stores, and the work-item -> tile map.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/canon.hpp"  // MK_HD
#include "gemm/item_order.hpp"
#include "gemm/sm90/geometry.hpp"

namespace moekit::kernels::gemm::sm90 {

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
// N-major bf16 tile (the Dx and DGrad GEMMs' B, imm-trans-b = 1), 128B-swizzled, as the producer stores it:
// BN / 64 panels of [64 K rows][64 N values] (one TMA box each, kMnPanelBytes apart), each K row
// 128 bytes. The PTX ISA's canonical N-major layout with 128B swizzle, ((8, 8, n), (8, k)) :
// ((1, 8, LBO), (64, SBO)) in elements, is that with LBO = the panel stride and SBO = 8 K rows.
inline constexpr uint32_t kMnPanelBytes = kBlockK * kRowBytes;  // 64 K rows of 64 N values
MK_HD constexpr uint64_t make_desc_mn_sw128(uint32_t smem_addr) {
  return desc_encode(smem_addr) | (desc_encode(kMnPanelBytes) << 16) | (desc_encode(kSwizzleAtomBytes) << 32) |
         (kDescSwizzle128B << 62);
}
// Byte offset of element (k, n) in that tile, as the TMA boxes place it: panel n / 64, K row k,
// then the 128-byte swizzle of the row.
MK_HD constexpr uint32_t mn_tile_offset(uint32_t k, uint32_t n) {
  return (n / 64) * kMnPanelBytes + sw128_address_bits(k * uint32_t(kRowBytes) + (n % 64) * 2);
}
// The producers' unrolled copies of K rows r0 + step·i (step 4 or 8, r0 < step): the swizzle XORs
// with the row % 8, which then depends on i % 2 only, so copy i lands at
// mn_parity_base(r0, n, step, i % 2) + i·step rows — two base registers instead of one an i.
MK_HD constexpr uint32_t mn_parity_base(uint32_t r0, uint32_t n, uint32_t step, uint32_t parity) {
  return mn_tile_offset(r0 + parity * step, n) - parity * step * uint32_t(kRowBytes);
}
// The k16 slice kk of an N-major stage starts kk·16 K rows in (K-major: kk·32 bytes along the row).
MK_HD constexpr uint32_t mn_k16_bytes(int kk) { return uint32_t(kk) * 16u * uint32_t(kRowBytes); }

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

// ---- the ring of stages ----------------------------------------------------------------------------
// Position in the ring (pipeline.cuh): the mbarrier phase parity flips each time the ring wraps.
template <int STAGES>
struct Pipe {
  uint32_t stage = 0, phase = 0;
  MK_HD void advance() {
    if (++stage == STAGES) stage = 0, phase ^= 1;
  }
  // n advances at once: a ping-pong warpgroup passing over the other one's tile (pingpong.cuh).
  MK_HD void skip(int32_t n) {
    const uint32_t t = stage + uint32_t(n);
    stage = t % STAGES, phase ^= (t / STAGES) & 1u;
  }
};

// ---- persistent schedule -------------------------------------------------------------------------
// Work item -> (block, column tile): the chunks of gemm/item_order.hpp, found by the publishing
// warp (scheduler.cuh), which posts the tile as one code: block · n_tiles + column tile. 32-bit on
// purpose: items = blocks · n_tiles stays far below 2^31 (blocks <= rows / 128 with rows indexed
// by int32 sorted_ids), and 64-bit division would cost the producer's few registers.
using gemm::kChunkWindow;
using gemm::kGroupBlocks;
using TileCoord = gemm::GroupedTile<int32_t>;
MK_HD constexpr int32_t tile_code(TileCoord t, int32_t n_tiles) { return t.block * n_tiles + t.n_tile; }
MK_HD constexpr TileCoord tile_of(int32_t code, int32_t n_tiles) { return {code / n_tiles, code % n_tiles}; }

// Split-K (the bf16 down GEMM, geometry.hpp: splits_k): with `splits` K-slices a tile's column
// index counts n_tile · splits + split (the slices of one output tile are neighbours in item
// order, as the mma.sync kernel's), and slice s multiplies the K-tiles of gemm::k_slice_range.
// splits = 1 is the unsplit tile.
struct KSlice {
  int32_t n_tile, split, kt0, count;
};
MK_HD constexpr KSlice k_slice(int32_t column, int32_t splits, int32_t per_split, int32_t k_tiles) {
  const int32_t split = column % splits;
  const gemm::KRange<int32_t> r = gemm::k_slice_range(split, per_split, k_tiles);
  return {column / splits, split, r.kt0, r.count};
}

}  // namespace moekit::kernels::gemm::sm90
