// tile.cuh — the tensor-core tile every GEMM of the backward is made of: mma.sync m16n8k16 (bf16
// operands, FP32 accumulators) over a cp.async ring of 64-deep K-tiles in shared memory.
//
// An operand tile is stored in one of two layouts, each a set of 64-element (128-byte) rows:
//   K-major  — a row holds 64 K values of one M (or N) index: x, dy, dh rows, w13 rows read along H.
//              ldmatrix reads it as the fragments are laid out.
//   MN-major — a row holds 64 M (or N) values of one K index: w2 [H, F] read with K = H, w13 read
//              with K = 2F, and both operands of the weight gradients (K = the sorted rows).
//              ldmatrix.trans reads it transposed into the same fragments. A tile wider than 64
//              is a run of 64-column panels, each 64 K rows (mn_swz).
// The 16-byte chunks of a row are XOR-swizzled with the row's low 3 bits, so the 8 rows one
// ldmatrix phase reads (consecutive, from a multiple of 8) fall in 8 different bank groups.
//
// Two sizes: the 4-warp tiles of 16 or 64 rows by 64 (static shared memory, 3 stages: the decode
// layouts, block_m 64, the router's gate GEMMs), and the 8-warp prefill tile, 128 x 256 outputs
// on 64 x 64 warp tiles over 4 stages of 48 KiB (dynamic shared memory): a k16 step issues 8
// ldmatrix for 32 mma (the 32 x 32 warp tile: 4 for 8) and a K-tile moves 48 KiB for 4.2 MFLOP
// (the 64 x 64 tile: 16 KiB for 0.5).
//
// Fragments (PTX ISA, m16n8k16): thread `lane` holds A at rows lane/4 (+8), columns 2·(lane%4)
// (+1, +8); B at K rows 2·(lane%4) (+1, +8), column lane/4; C at row lane/4 (+8), columns
// 2·(lane%4) + {0, 1}. Each output element is one thread's FP32 sum in K order: deterministic.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backward/params.hpp"
#include "common/async_copy.cuh"
#include "common/sm90_limits.hpp"

namespace moekit::kernels::backward {

inline constexpr int kTileK = 64;     // K values a ring slot holds of each operand
inline constexpr int kStages = 3;     // the 4-warp tiles' ring: two K-tiles in flight while one is multiplied
inline constexpr int kThreads = 128;  // the 4-warp tiles' CTA
inline constexpr int kChunks = 8;     // 16-byte chunks of a 64-element row

enum class Major { K, MN };

// Element offset of chunk c of row r in a tile of 64-element rows.
__device__ __forceinline__ int swz(int r, int c) { return r * 64 + ((c ^ (r & 7)) << 3); }
// Element offset of chunk c (of W / 8) of K row k in an MN-major tile W wide: panel c / 8.
__device__ __forceinline__ int mn_swz(int k, int c) { return (c >> 3) * (kTileK * 64) + swz(k, c & 7); }

// BM x BN outputs on WM x WN warps; A and B stored K- or MN-major; a ring of Stages K-tiles.
template <int BM_, int BN_, int WM_, int WN_, Major A_, Major B_, int Stages_ = kStages>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_;
  static constexpr Major A = A_, B = B_;
  static constexpr int kThreads = WM * WN * 32, kStages = Stages_;
  static constexpr int TM = BM / WM, TN = BN / WN;  // one warp's rows and columns
  static constexpr int MI = TM / 16, NI = TN / 8;   // its m16 and n8 fragments
  static constexpr int kAElems = BM * kTileK, kBElems = BN * kTileK;
  static constexpr int kStageElems = kAElems + kBElems;
  static constexpr int kSmemElems = kStages * kStageElems;
  static constexpr size_t kSmemBytes = size_t(kSmemElems) * 2;
  static_assert(TM % 16 == 0 && TN % 16 == 0, "a warp holds whole m16 tiles and pairs of n8 fragments");
  static_assert(A == Major::K || BM % 64 == 0, "an MN-major tile is whole 64-column panels");
  static_assert(B == Major::K || BN % 64 == 0, "an MN-major tile is whole 64-column panels");
  static_assert(kSmemBytes <= kSm90SmemPerBlockOptin, "the ring fits in a CTA's shared memory");
};

// The ring of the ragged and weight-gradient GEMMs: dynamic shared memory, Cfg::kSmemBytes (the
// 128-row tile's 192 KiB needs the launcher's opt-in).
extern __shared__ __align__(128) uint4 backward_smem[];

// One warp's accumulators and the K-steps that feed them.
template <class Cfg>
struct Mma {
  static constexpr int MI = Cfg::MI, NI = Cfg::NI;
  float acc[MI][NI][4];
  int wm, wn, lane;

  __device__ __forceinline__ explicit Mma(int tid) : wm((tid >> 5) / Cfg::WN), wn((tid >> 5) % Cfg::WN), lane(tid & 31) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int f = 0; f < NI; ++f)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][f][q] = 0.0f;
  }
  // Tile row of accumulator half h of m16 tile i, and tile column of n8 fragment f (and + 1).
  __device__ __forceinline__ int row(int i, int h) const { return wm * Cfg::TM + i * 16 + (lane >> 2) + h * 8; }
  __device__ __forceinline__ int col(int f) const { return wn * Cfg::TN + f * 8 + (lane & 3) * 2; }

  // acc += A·Bᵀ over one K-tile: sa, sb the slot's A and B tiles.
  __device__ __forceinline__ void k_tile(const bf16* sa, const bf16* sb) {
    const int q = lane >> 3;  // the 8x8 matrix this lane addresses a row of
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      uint32_t af[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int m0 = wm * Cfg::TM + i * 16;
        if constexpr (Cfg::A == Major::K) {  // matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
          dev::ldmatrix_x4(af[i], dev::smem_addr(sa + swz(m0 + (lane & 15), kk * 2 + (lane >> 4))));
        } else {  // the same four, each stored as 8 K rows of 8 M values
          dev::ldmatrix_x4_trans(af[i], dev::smem_addr(sa + mn_swz(kk * 16 + (q >> 1) * 8 + (lane & 7), m0 / 8 + (q & 1))));
        }
      }
      uint32_t bf[NI][2];
#pragma unroll
      for (int f = 0; f < NI; f += 2) {  // one x4: (n8 f, k 0-7), (f, k 8-15), (f + 1, k 0-7), (f + 1, k 8-15)
        const int n0 = wn * Cfg::TN + f * 8;
        uint32_t t[4];
        if constexpr (Cfg::B == Major::K) {
          dev::ldmatrix_x4(t, dev::smem_addr(sb + swz(n0 + (q >> 1) * 8 + (lane & 7), kk * 2 + (q & 1))));
        } else {
          dev::ldmatrix_x4_trans(t, dev::smem_addr(sb + mn_swz(kk * 16 + (q & 1) * 8 + (lane & 7), n0 / 8 + (q >> 1))));
        }
        bf[f][0] = t[0], bf[f][1] = t[1], bf[f + 1][0] = t[2], bf[f + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int f = 0; f < NI; ++f) dev::mma_bf16(acc[i][f], af[i], bf[f][0], bf[f][1]);
    }
  }
};

// K-tiles [kt0, kt0 + count) into the accumulators: the ring is filled kStages - 1 K-tiles ahead;
// step i waits for K-tile i, refills the slot step i - 1 freed, and multiplies K-tile i. A loader's
// load(tile, kt) issues this thread's share of K-tile kt (cp.async, or plain shared stores, which
// the step's barrier publishes alike). Returns with every copy landed and every thread past its
// last read, so the epilogue may reuse the ring.
template <class Cfg, class ALoader, class BLoader>
__device__ __forceinline__ void k_loop(Mma<Cfg>& mma, bf16* smem, ALoader& a, BLoader& b, int64_t kt0, int64_t count) {
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < count) {
      a.load(smem + s * Cfg::kStageElems, kt0 + s);
      b.load(smem + s * Cfg::kStageElems + Cfg::kAElems, kt0 + s);
    }
    dev::cp_async_commit();
  }
#pragma unroll 1
  for (int64_t i = 0; i < count; ++i) {
    dev::cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();  // K-tile i landed for every thread; every thread is done with the slot of i - 1
    const int64_t next = i + Cfg::kStages - 1;
    if (next < count) {
      bf16* slot = smem + int(next % Cfg::kStages) * Cfg::kStageElems;
      a.load(slot, kt0 + next);
      b.load(slot + Cfg::kAElems, kt0 + next);
    }
    dev::cp_async_commit();
    const bf16* slot = smem + int(i % Cfg::kStages) * Cfg::kStageElems;
    mma.k_tile(slot, slot + Cfg::kAElems);
  }
  dev::cp_async_wait<0>();
  __syncthreads();
}

// Two floats as one bf16x2 word (round to nearest even), the lower column first.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

}  // namespace moekit::kernels::backward
