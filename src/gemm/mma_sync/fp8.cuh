// fp8.cuh — the FP8 parts of the mma.sync expert GEMM (docs/design.md, "FP8"): e4m3 A and B
// with their block scales, FP32 promotion per 128-deep K-tile, act quantized in the up epilogue.
//
// The tile geometry is the bf16 one in 2-byte units (Cfg::kBlockK = 64 or 128 units: one or two
// 128-deep scale blocks of e4m3), so the Loader's cp.async stream, the ring and the ldmatrix
// addressing are the bf16 parts unchanged (gemm/params.hpp: fp8 rows are addressed in units).
// Two scale blocks a K-tile move a bf16 tile's 256 bytes a row per stage: half the K-tiles, and so
// half the waits and barriers, per byte of weights. What FP8 adds:
//   BlockScales — per K-tile, for each of its scale blocks, the A scales of the tile's BM rows and
//                 the B scales of its (at most two) 128-row weight blocks, by 4-byte cp.async into
//                 the slot's scale area, in the same commit group as the slot's A and B;
//   Fp8Mainloop — each scale block's products summed alone on the tensor cores (mma m16n8k32
//                 e4m3), then added to the FP32 accumulators times a_scale(row) · b_scale(block):
//                 the promotion, once per scale block;
//   Fp8UpEpilogue — act = silu(g)·u in FP32, each row's 128-column act group (one up tile of 128
//                 gate + 128 up rows, or a cluster of 2-8 narrower tiles) reduced to one amax
//                 through shared memory (and distributed shared memory across the cluster),
//                 quantized (common/fp8.cuh), stored as e4m3 with its scale.
// The down epilogue is the bf16 one (bf16 y_rows or FP32 split-K partials).
//
// Shared memory: the ring (Cfg::kSmemBytes), then STAGES scale areas, then the up epilogue's amax
// exchange [WN][BM] (and with a cluster the CTA's [2][BM]).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "common/async_copy.cuh"
#include "common/fp8.cuh"
#include "common/silu.cuh"
#include "gemm/common.cuh"
#include "gemm/mma_sync/epilogue.cuh"
#include "gemm/mma_sync/loader.cuh"
#include "gemm/mma_sync/mainloop.cuh"
#include "gemm/mma_sync/scheduler.cuh"
#include "gemm/mma_sync/tile.hpp"

namespace moekit::kernels::gemm::mma_sync {

using dev::kFp8Block;  // K and N of a weight scale block, the columns of an act group

// Scale blocks per K-tile: 64 units (128 e4m3) each.
template <class Cfg>
inline constexpr int kScaleBlocks = Cfg::kBlockK / 64;

// Where a slot's scales live: per scale block of the K-tile, a[BM] (one per tile row), then b[2]
// (the tile's first and second 128-column weight block: Up's gate and up blocks, Down's blocks
// n0/128 and n0/128 + 1).
template <class Cfg>
struct ScaleArea {
  static constexpr int kB = Cfg::kBlockM;
  static constexpr int kSub = Cfg::kBlockM + 4;                    // a, b[2], 16-byte padding
  static constexpr int kFloats = kScaleBlocks<Cfg> * kSub;         // a slot
  static constexpr size_t kBytes = size_t(Cfg::kStages) * kFloats * 4;
  // Scale block `sub` of slot `s`.
  __device__ __forceinline__ static float* slot(unsigned char* smem, int s, int sub = 0) {
    return reinterpret_cast<float*>(smem + Cfg::kSmemBytes) + s * kFloats + sub * kSub;
  }
};

// The block scales of each K-tile: thread t < BM loads row t's A scale; threads BM and BM+1 the B
// scales. Padding rows and blocks past the weights load zeros (their products are zeros anyway).
template <Mode M, class Cfg>
struct BlockScales {
  static constexpr int BM = Cfg::kBlockM, kSubs = kScaleBlocks<Cfg>;
  static_assert(Cfg::kThreads >= BM + 2, "a thread per row scale and per B scale");
  static_assert(Cfg::kBlockK == 64 * kSubs && (kSubs == 1 || kSubs == 2), "one or two scale blocks a K-tile");
  int32_t nx_id = 0;          // sorted id of row t of the item after the bound one (t < BM)
  const float* src = nullptr;  // this thread's scale row of the bound item (index: the scale block)
  bool ok = false;

  // Scale blocks along K: the length of a scale row (k_dim in units, 64 a block). Recomputed from
  // the kernel parameters where needed: a register held across the loop spilled the widest tile.
  __device__ __forceinline__ static int64_t scale_blocks_k(const Params& p) { return (p.k_dim + 63) / 64; }

  __device__ __forceinline__ void fetch(const Params& p, int64_t block, int tid) {
    if (tid < BM) nx_id = p.sorted_ids[block * BM + tid];
  }
  __device__ __forceinline__ void bind(const Params& p, int64_t block, int64_t n0, int expert, int tid) {
    const int64_t kb = scale_blocks_k(p);
    if (tid < BM) {
      ok = nx_id < p.num_assign;
      // Up: the token's x_scale row; Down: act_scale row r (sorted order).
      const int64_t row = M == Mode::Up ? (ok ? nx_id / p.topk : 0) : block * BM + tid;
      src = p.a_scale + row * kb;
    } else if (tid < BM + 2) {
      const int j = tid - BM;
      int64_t blk;
      if constexpr (M == Mode::Up) {
        blk = (j == 0 ? 0 : p.b_up_block0) + n0 / kFp8Block;  // gate's block, up's block
        ok = true;
      } else {
        blk = n0 / kFp8Block + j;
        ok = (n0 / kFp8Block + j) * kFp8Block < p.n_dim;
      }
      src = p.b_scale + int64_t(expert) * p.b_scale_expert_stride + (ok ? blk : 0) * kb;
    }
  }
  // K-tile kt's scale blocks kt·kSubs + s; one past K (a K tail of one block) loads a zero.
  __device__ __forceinline__ void load(const Params& p, unsigned char* smem, int slot, int64_t kt, int tid) {
    if (tid < BM + 2) {
#pragma unroll
      for (int s = 0; s < kSubs; ++s) {
        const int64_t b = kt * kSubs + s;
        const bool in = ok && b < scale_blocks_k(p);
        dev::cp_async4(smem_addr(ScaleArea<Cfg>::slot(smem, slot, s) + tid), in ? src + b : p.b_scale, in ? 4u : 0u);
      }
    }
  }
};

template <Mode M, class Cfg>
struct Fp8Mainloop {
  static constexpr int MI = Cfg::MI, NI = Cfg::NI;
  float acc[MI][NI][4];
  Mainloop<M, Cfg, MmaE4m3> block;  // one scale block's sums

  __device__ __forceinline__ void zero() { zero_accs(acc); }

  // The B scale block (0 or 1 of the slot's two) of n8 fragment f of this warp.
  __device__ __forceinline__ static int b_block(int f, const WarpTile<M, Cfg>& w) {
    if constexpr (M == Mode::Up) return f < NI / 2 ? 0 : 1;
    else return (w.wn * Cfg::TN + f * 8) / kFp8Block;
  }

  __device__ __forceinline__ void k_tile(const __nv_bfloat16* smem, int slot, const WarpTile<M, Cfg>& w) {
    scale_block<0>(smem, slot, w);
    if constexpr (kScaleBlocks<Cfg> == 2) scale_block<1>(smem, slot, w);
  }

  // Scale block S of the K-tile (K-steps 4S .. 4S + 3): its sums alone, then promoted.
  template <int S>
  __device__ __forceinline__ void scale_block(const __nv_bfloat16* smem, int slot, const WarpTile<M, Cfg>& w) {
    block.zero();
    block.template k_steps<4 * S, 4 * S + 4>(smem, slot, w);
    const float* sc =
        ScaleArea<Cfg>::slot(reinterpret_cast<unsigned char*>(const_cast<__nv_bfloat16*>(smem)), slot, S);
    float sa[MI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) sa[i][h] = sc[w.row(i, h)];
    const float sb[2] = {sc[ScaleArea<Cfg>::kB], sc[ScaleArea<Cfg>::kB + 1]};
#pragma unroll
    for (int f = 0; f < NI; ++f) {
      const float b = b_block(f, w) ? sb[1] : sb[0];  // a select: an indexed array would live in local memory
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][f][q] += block.acc[i][f][q] * (sa[i][q >> 1] * b);
    }
  }
};

// Up, FP8: act quantized per row and 128-column group. A tile of 128 act columns (block_n 256)
// is one group: its rows' amax meet through shared memory. A narrower tile (block_n 64: 32 act
// columns) is 1/kCluster of a group, and the kCluster CTAs of a cluster take the group's tiles
// together (DealtSchedule<Cfg, kCluster>): each CTA's row amax is exchanged through distributed
// shared memory, so decode's few up items spread over kCluster times the CTAs (Qwen3 T=1: 48 CTAs
// of 256 columns on 132 SMs).
template <class Cfg>
struct Fp8UpEpilogue : EpilogueRows<Mode::Up, Cfg> {
  using Base = EpilogueRows<Mode::Up, Cfg>;
  using Base::ids, Base::MI, Base::NI, Base::BM;
  static constexpr int WN = Cfg::kWarpsN;
  static constexpr int kCols = cols_per_tile(Mode::Up, Cfg::kBlockN);  // act columns of a tile
  static constexpr int kCluster = kFp8Block / kCols;
  static_assert(Cfg::kWarpsM == 1, "the amax exchange assumes the warps split N only");
  static_assert(kFp8Block % kCols == 0 && kCluster <= 8, "an act group is 1, 2, 4 or 8 tiles wide (a portable cluster)");
  // The warps' row amax [WN][BM]; with a cluster, then the CTA's row amax [2][BM] (items alternate
  // halves, so one cluster barrier an item orders the writes of item i + 2 after the reads of i).
  static constexpr size_t kExchangeBytes = size_t(WN) * BM * 4 + (kCluster > 1 ? 2 * size_t(BM) * 4 : 0);
  uint32_t items_done = 0;

  __device__ __forceinline__ void store(const Params& p, const float (&acc)[MI][NI][4], const Item& it,
                                        const WarpTile<Mode::Up, Cfg>& w, unsigned char* smem) {
    float* exchange = reinterpret_cast<float*>(smem + Cfg::kSmemBytes + ScaleArea<Cfg>::kBytes);  // [WN][BM]
    constexpr int NG = NI / 2;  // gate fragments of this warp
    float act[MI][2][NG][2];
    float amax[MI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        amax[i][h] = 0.0f;
        // A padding row (never stored; its sums are exact zeros) takes a gate of 1: zero is outside
        // SiLU's fast range, and the exact fallback is a branch its whole warp would wait for.
        const bool row_ok = ids[i][h] < p.num_assign;
#pragma unroll
        for (int f = 0; f < NG; ++f) {
          const float gate[2] = {row_ok ? acc[i][f][2 * h] : 1.0f, row_ok ? acc[i][f][2 * h + 1] : 1.0f};
          float silu[2];
          dev::silu_group(gate, silu);
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            act[i][h][f][c] = silu[c] * acc[i][f + NG][2 * h + c];
            amax[i][h] = dev::amax_step(amax[i][h], act[i][h][f][c]);
          }
        }
        amax[i][h] = dev::lanes_amax<4>(amax[i][h]);  // the quad's lanes hold the warp's columns of the row
        if ((w.lane & 3) == 0) exchange[w.wn * BM + w.row(i, h)] = amax[i][h];
      }
    __syncthreads();  // every warp's amax of every row (the next item's exchange is a K-step away)
    float m[MI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = w.row(i, h);
        m[i][h] = exchange[r];
#pragma unroll
        for (int x = 1; x < WN; ++x) m[i][h] = dev::max_nan(m[i][h], exchange[x * BM + r]);
      }
    if constexpr (kCluster > 1) {
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      float* mine = exchange + WN * BM + (items_done & 1) * BM;  // [BM]
      ++items_done;
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (w.wn == 0 && (w.lane & 3) == 0) mine[w.row(i, h)] = m[i][h];
      cluster.sync();  // every CTA's amax of every row of the group
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = w.row(i, h);
          float g = *cluster.map_shared_rank(mine + r, 0);
#pragma unroll
          for (int c = 1; c < kCluster; ++c) g = dev::max_nan(g, *cluster.map_shared_rank(mine + r, c));
          m[i][h] = g;
        }
    }
    const int64_t row0 = it.block * BM;
    const int64_t n0 = it.n_tile * kCols;
    const bool stores_scale = n0 % kFp8Block == 0 && w.wn == 0 && (w.lane & 3) == 0;  // the group's first tile
    uint8_t* out = reinterpret_cast<uint8_t*>(p.out);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = w.row(i, h);
        if (ids[i][h] >= p.num_assign) continue;  // padding row
        const dev::Fp8Scale s = dev::fp8_scale(m[i][h]);
        uint8_t* out_row = out + (row0 + r) * p.n_dim;
#pragma unroll
        for (int f = 0; f < NG; ++f) {
          const int64_t n = n0 + w.wn * (Cfg::TN / 2) + f * 8 + (w.lane & 3) * 2;
          if (n < p.n_dim)
            *reinterpret_cast<uint16_t*>(out_row + n) = dev::pack_e4m3x2(act[i][h][f][0] * s.inv, act[i][h][f][1] * s.inv);
        }
        if (stores_scale) p.out_scale[(row0 + r) * ((p.n_dim + kFp8Block - 1) / kFp8Block) + n0 / kFp8Block] = s.scale;
      }
  }
};

// The down GEMM's epilogue exchanges nothing.
struct NoExchange {
  static constexpr size_t kExchangeBytes = 0;
};

template <Mode M, class Cfg>
struct Fp8Parts {
  // Up: whole act groups per tile or per cluster of tiles; any down tile (at most two weight
  // blocks wide).
  static constexpr int kUpCols = cols_per_tile(Mode::Up, Cfg::kBlockN);
  static constexpr bool kCompiled =
      M == Mode::Down ? Cfg::kBlockN <= 2 * kFp8Block : kFp8Block % kUpCols == 0 && kFp8Block / kUpCols <= 8;
  static constexpr int kCluster = M == Mode::Up && kCompiled ? kFp8Block / kUpCols : 1;
  static constexpr bool kBoundary = true;  // Params::boundary (kernel.cuh)
  using Sched = DealtSchedule<Cfg, kCluster>;
  using Loader = mma_sync::Loader<M, Cfg, BlockScales<M, Cfg>, Sched>;
  using Mainloop = Fp8Mainloop<M, Cfg>;
  using Epilogue = std::conditional_t<M == Mode::Up, Fp8UpEpilogue<Cfg>, mma_sync::Epilogue<Mode::Down, Cfg>>;
  static constexpr size_t kSmemBytes = Cfg::kSmemBytes + ScaleArea<Cfg>::kBytes +
                                       std::conditional_t<M == Mode::Up, Fp8UpEpilogue<Cfg>, NoExchange>::kExchangeBytes;
};

}  // namespace moekit::kernels::gemm::mma_sync
