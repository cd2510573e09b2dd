// kernel.cuh — the Hopper expert GEMM (stages 3 and 4 for prefill: wgmma + TMA), composed of its
// parts: the claimed-item scheduler and its channel (scheduler.cuh), the producer warpgroup
// (producer.cuh), the consumers' wgmma mainloop (mainloop.cuh) and the per-mode epilogue
// (epilogue.cuh), around a STAGES-deep ring of shared-memory stages (pipeline.cuh). The contract
// is gemm/common.cuh's: a work item is one 128-row block of the aligned layout (one expert) times
// one column tile (DownSplitK: and one K-slice); a persistent grid walks the items, their number
// read from the device.
//
// One CTA = 3 warpgroups, warp-specialised: warpgroup 2 produces, warpgroups 0-1 consume, together
// on each tile (consume) or on alternate tiles (Cfg::kPingPong: pingpong.cuh's consume_pingpong).
// FP8 (Cfg::kFp8) swaps in the parts of fp8.cuh: the promoting mainloop and the quantizing up
// epilogue; the producer loads the block scales beside A and B.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "common/device.cuh"  // pdl_enter
#include "gemm/common.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/fp8.cuh"
#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/pingpong.cuh"
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/producer.cuh"
#include "gemm/sm90/ptx.cuh"
#include "gemm/sm90/scheduler.cuh"

namespace moekit::kernels::gemm::sm90 {

// The epilogue of a mode and precision: FP8 up quantizes act; the rest store bf16.
template <Mode M, class Cfg>
using EpilogueOf = std::conditional_t<Cfg::kFp8 && M == Mode::Up, Fp8UpEpilogue<Cfg>, Epilogue<M, Cfg>>;

// A consumer warpgroup: the tiles of the channel, one after another — mainloop, then epilogue.
template <Mode M, class Cfg>
__device__ __forceinline__ void consume(const Params& p, const Smem<Cfg>& sm, int32_t items, int32_t k_tiles) {
  // Consumer warpgroup 0 or 1, broadcast from lane 0 so the compiler knows it is warp-uniform: the
  // wgmma descriptors derived from it are then computed in uniform registers, not moved there.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  const int warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
  const uint64_t desc_a0 = make_desc_k_sw128(sm.a(0) + uint32_t(wg * kWgmmaM * kRowBytes));
  const uint64_t desc_b0 = b_n_major(M) ? make_desc_mn_sw128(sm.b(0)) : make_desc_k_sw128(sm.b(0));

  float acc[Cfg::kAccs];
#pragma unroll
  for (int i = 0; i < Cfg::kAccs; ++i) acc[i] = 0.0f;

  // This thread's two output rows of a tile (acc_row for v%4 = 0 and 2) and the epilogue's data
  // of those rows. A load still in flight when a k-step's proxy fence runs stalls the fence (it
  // compiles to MEMBAR.ALL.CTA, which waits for this thread's memory operations): the next tile's
  // ids are loaded before this tile's epilogue (which hides their latency), and the row data that
  // needs them right after the next tile's first wgmma group is issued, so a stall of the second
  // k-step's fence on them runs under that group's ~1k cycles of tensor work. Loaded at the tile's
  // start, the ids -> weights chain was exposed at every tile (~0.5-1k cycles).
  auto load_ids = [&](int32_t code, int32_t(&ids)[2]) {
    const int32_t row0 = tile_of(code, int32_t(p.n_tiles)).block * kBlockM;
#pragma unroll
    for (int h = 0; h < 2; ++h) ids[h] = p.sorted_ids[row0 + wg * kWgmmaM + acc_row(warp, lane, 2 * h)];
  };

  Pipe<Cfg::kStages> pipe;
  ItemRing ring;
  Item it = take_item(sm, ring, lane);
  int32_t ids[2] = {0, 0};
  if (it.item < items) load_ids(it.item, ids);
  while (it.item < items) {
    const TileCoord tile = tile_of(it.item, int32_t(p.n_tiles));
    const KSlice ks = slice_of<M, Cfg>(p, tile, k_tiles);
    const int32_t row0 = tile.block * kBlockM;
    const bool live = (it.live >> wg) & 1;
    EpilogueOf<M, Cfg> epi;
    auto hook = [&] { epi.load_row_data(p, ids); };
    if constexpr (Cfg::kFp8) {
      const int rows[2] = {wg * kWgmmaM + acc_row(warp, lane, 0), wg * kWgmmaM + acc_row(warp, lane, 2)};
      mma_tile_fp8<Cfg, tma_a<M, Cfg>()>(acc, sm, desc_a0, desc_b0, k_tiles, pipe, lane, live, rows, hook);
    } else if (!splits_k<M, Cfg>() || ks.count > 0) {
      // (A K-slice past K has no stage to multiply, and mma_tile needs one: it hands its last
      // stage back. Its epilogue stores zeros; zeroing acc here instead made ptxas spill it.)
      mma_tile<Cfg, b_n_major(M)>(acc, sm, desc_a0, desc_b0, ks.count, pipe, lane, live, hook);
    }
    if constexpr (splits_k<M, Cfg>()) epi.split = ks.split, epi.empty = ks.count == 0;

    // The next item (the producer published it after issuing this tile's last loads) and its ids.
    const Item next = take_item(sm, ring, lane);
    int32_t next_ids[2] = {0, 0};
    if (next.item < items) load_ids(next.item, next_ids);

    const int32_t n0 = ks.n_tile * cols_per_tile(M, Cfg::kBlockN);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t out_row = epi.out_row(row0 + wg * kWgmmaM + acc_row(warp, lane, 2 * h), ids[h]);
      epi.store(p, acc, h, ids[h], out_row, n0, lane);
    }
    it = next;
    ids[0] = next_ids[0], ids[1] = next_ids[1];
  }
}

// a_map: A by TMA where tma_a<M, Cfg>() (the FP8 down GEMM: act's rows are contiguous in sorted
// order); unused otherwise.
template <Mode M, int BN, int STAGES, bool FP8, bool PINGPONG = false>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_expert_gemm_kernel(const Params p, const __grid_constant__ CUtensorMap b_map,
                            const __grid_constant__ CUtensorMap a_map) {
  using Cfg = Config<BN, STAGES, FP8, PINGPONG>;
  extern __shared__ unsigned char smem_raw[];
  if (threadIdx.x == 0) {
    const Smem<Cfg> sm = smem_layout<Cfg>(smem_raw);
    for (uint32_t s = 0; s < STAGES; ++s) {
      ptx::mbar_init(sm.full(s), Cfg::kFullArrivals);
      ptx::mbar_init(sm.empty(s), Cfg::kEmptyArrivals);
    }
    for (uint32_t s = 0; s < kItemSlots; ++s) {
      ptx::mbar_init(sm.item_full(s), Cfg::kItemFullArrivals);
      ptx::mbar_init(sm.item_empty(s), Cfg::kItemEmptyArrivals);
    }
    if constexpr (PINGPONG)
      for (uint32_t w = 0; w < 2; ++w) ptx::mbar_init(sm.turn(w), Cfg::kTurnArrivals);
    ptx::mbar_init_fence();
  }
  if (threadIdx.x == kConsumerThreads) {
    ptx::tma_prefetch_desc(&b_map);
    if constexpr (tma_a<M, Cfg>()) ptx::tma_prefetch_desc(&a_map);
  }
  dev::pdl_enter();  // launched with PDL (common/launch.hpp): the routing and A come from predecessors
  __syncthreads();

  // NOTES: nothing stays live across setmaxnreg (a value held in a register the producer gives
  // up would be spilled): each role derives its state from the parameters after the switch.
  if (threadIdx.x >= kConsumerThreads) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    const Work w = read_work(p);
    produce<M, Cfg>(p, &b_map, &a_map, smem_layout<Cfg>(smem_raw), w.items, w.blocks, w.k_tiles);
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const Work w = read_work(p);
    if constexpr (PINGPONG)
      consume_pingpong<M, Cfg>(p, smem_layout<Cfg>(smem_raw), w.items, w.k_tiles);
    else
      consume<M, Cfg>(p, smem_layout<Cfg>(smem_raw), w.items, w.k_tiles);
  }
}

}  // namespace moekit::kernels::gemm::sm90
