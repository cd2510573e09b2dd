// fp8.cuh — the FP8 parts of the mma.sync expert GEMM (docs/design.md, "FP8"): e4m3 A and B
// with their block scales, FP32 promotion per 128-deep K-tile, act quantized in the up epilogue.
//
// The tile geometry is the bf16 one in 2-byte units (Cfg::kBlockK = 64 units = 128 e4m3 = one
// scale block), so the Loader's cp.async stream, the ring and the ldmatrix addressing are the
// bf16 parts unchanged (gemm/params.hpp: fp8 rows are addressed in units). What FP8 adds:
//   BlockScales — per K-tile, the A scales of the tile's BM rows and the B scales of its (at most
//                 two) 128-row weight blocks, by 4-byte cp.async into the slot's scale area, in the
//                 same commit group as the slot's A and B;
//   Fp8Mainloop — each K-tile's products summed alone on the tensor cores (mma m16n8k32 e4m3),
//                 then added to the FP32 accumulators times a_scale(row) · b_scale(block): the
//                 promotion, once per scale block;
//   Fp8UpEpilogue — act = silu(g)·u in FP32, each row's 128 act columns of the tile (one group:
//                 the up tile is 128 gate + 128 up rows, split over the warps) reduced to one amax
//                 through shared memory, quantized (common/fp8.cuh), stored as e4m3 with its scale.
// The down epilogue is the bf16 one (bf16 y_rows or FP32 split-K partials).
//
// Shared memory: the ring (Cfg::kSmemBytes), then STAGES scale areas of kScaleFloats, then the up
// epilogue's amax exchange [WN][BM].
#pragma once

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

// Where a slot's scales live: a[BM] (one per tile row), then b[2] (the tile's first and second
// 128-column weight block: Up's gate and up blocks, Down's blocks n0/128 and n0/128 + 1).
template <class Cfg>
struct ScaleArea {
  static constexpr int kB = Cfg::kBlockM;
  static constexpr int kFloats = Cfg::kBlockM + 4;  // a, b[2], 16-byte padding
  static constexpr size_t kBytes = size_t(Cfg::kStages) * kFloats * 4;
  __device__ __forceinline__ static float* slot(unsigned char* smem, int s) {
    return reinterpret_cast<float*>(smem + Cfg::kSmemBytes) + s * kFloats;
  }
};

// The block scales of each K-tile: thread t < BM loads row t's A scale; threads BM and BM+1 the B
// scales. Padding rows and blocks past the weights load zeros (their products are zeros anyway).
template <Mode M, class Cfg>
struct BlockScales {
  static constexpr int BM = Cfg::kBlockM;
  static_assert(Cfg::kThreads >= BM + 2, "a thread per row scale and per B scale");
  int32_t nx_id = 0;          // sorted id of row t of the item after the bound one (t < BM)
  const float* src = nullptr;  // this thread's scale row of the bound item (index: the K-tile)
  bool ok = false;

  __device__ __forceinline__ void fetch(const Params& p, int64_t block, int tid) {
    if (tid < BM) nx_id = p.sorted_ids[block * BM + tid];
  }
  __device__ __forceinline__ void bind(const Params& p, int64_t block, int64_t n0, int expert, int64_t kb, int tid) {
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
  __device__ __forceinline__ void load(const Params& p, unsigned char* smem, int slot, int64_t kt, int tid) {
    if (tid < BM + 2)
      dev::cp_async4(smem_addr(ScaleArea<Cfg>::slot(smem, slot) + tid), ok ? src + kt : p.b_scale, ok ? 4u : 0u);
  }
};

template <Mode M, class Cfg>
struct Fp8Mainloop {
  static constexpr int MI = Cfg::MI, NI = Cfg::NI;
  float acc[MI][NI][4];
  Mainloop<M, Cfg, MmaE4m3> block;  // one K-tile's sums

  __device__ __forceinline__ void zero() { zero_accs(acc); }

  // The B scale block (0 or 1 of the slot's two) of n8 fragment f of this warp.
  __device__ __forceinline__ static int b_block(int f, const WarpTile<M, Cfg>& w) {
    if constexpr (M == Mode::Up) return f < NI / 2 ? 0 : 1;
    else return (w.wn * Cfg::TN + f * 8) / kFp8Block;
  }

  __device__ __forceinline__ void k_tile(const __nv_bfloat16* smem, int slot, const WarpTile<M, Cfg>& w) {
    block.zero();
    block.k_tile(smem, slot, w);
    const float* sc = ScaleArea<Cfg>::slot(reinterpret_cast<unsigned char*>(const_cast<__nv_bfloat16*>(smem)), slot);
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

// Up, FP8: act quantized per row and 128-column group; the tile's 128 act columns are one group.
template <class Cfg>
struct Fp8UpEpilogue : EpilogueRows<Mode::Up, Cfg> {
  using Base = EpilogueRows<Mode::Up, Cfg>;
  using Base::ids, Base::MI, Base::NI, Base::BM;
  static constexpr int WN = Cfg::kWarpsN;
  static_assert(Cfg::kWarpsM == 1, "the amax exchange assumes the warps split N only");
  static_assert(cols_per_tile(Mode::Up, Cfg::kBlockN) == kFp8Block, "an up tile is one act group wide");
  static constexpr size_t kExchangeBytes = size_t(WN) * BM * 4;

  __device__ __forceinline__ void store(const Params& p, const float (&acc)[MI][NI][4], const Item& it,
                                        const WarpTile<Mode::Up, Cfg>& w, unsigned char* smem) const {
    float* exchange = reinterpret_cast<float*>(smem + Cfg::kSmemBytes + ScaleArea<Cfg>::kBytes);  // [WN][BM]
    constexpr int NG = NI / 2;  // gate fragments of this warp
    float act[MI][2][NG][2];
    float amax[MI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        amax[i][h] = 0.0f;
#pragma unroll
        for (int f = 0; f < NG; ++f) {
          const float gate[2] = {acc[i][f][2 * h], acc[i][f][2 * h + 1]};
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
    const int64_t row0 = it.block * BM;
    const int64_t n0 = it.n_tile * kFp8Block;
    uint8_t* out = reinterpret_cast<uint8_t*>(p.out);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = w.row(i, h);
        float m = exchange[r];
#pragma unroll
        for (int x = 1; x < WN; ++x) m = dev::max_nan(m, exchange[x * BM + r]);
        if (ids[i][h] >= p.num_assign) continue;  // padding row
        const dev::Fp8Scale s = dev::fp8_scale(m);
        uint8_t* out_row = out + (row0 + r) * p.n_dim;
#pragma unroll
        for (int f = 0; f < NG; ++f) {
          const int64_t n = n0 + w.wn * (Cfg::TN / 2) + f * 8 + (w.lane & 3) * 2;
          if (n < p.n_dim)
            *reinterpret_cast<uint16_t*>(out_row + n) = dev::pack_e4m3x2(act[i][h][f][0] * s.inv, act[i][h][f][1] * s.inv);
        }
        if (w.wn == 0 && (w.lane & 3) == 0) p.out_scale[(row0 + r) * ((p.n_dim + kFp8Block - 1) / kFp8Block) + it.n_tile] = s.scale;
      }
  }
};

template <Mode M, class Cfg>
struct Fp8Parts {
  // The up tile must be one act group wide; any down tile (at most two weight blocks wide).
  static constexpr bool kCompiled =
      M == Mode::Down ? Cfg::kBlockN <= 2 * kFp8Block : cols_per_tile(M, Cfg::kBlockN) == kFp8Block;
  using Loader = mma_sync::Loader<M, Cfg, BlockScales<M, Cfg>>;
  using Mainloop = Fp8Mainloop<M, Cfg>;
  using Epilogue = std::conditional_t<M == Mode::Up, Fp8UpEpilogue<Cfg>, mma_sync::Epilogue<Mode::Down, Cfg>>;
  static constexpr size_t kSmemBytes =
      Cfg::kSmemBytes + ScaleArea<Cfg>::kBytes + (M == Mode::Up ? size_t(Cfg::kWarpsN) * Cfg::kBlockM * 4 : 0);
};

}  // namespace moekit::kernels::gemm::mma_sync
