// pingpong.cuh — the ping-pong consumers of the Hopper expert GEMM (Config::kPingPong): each
// consumer warpgroup owns whole 128 x BN tiles and the two take alternate tiles of the channel, so
// one's epilogue runs under the other's mainloop and the tensor pipe does not stop for it (the
// cooperative consume of kernel.cuh stops it for both warpgroups at once). Made for DGrad, whose
// SwiGLU-backward epilogue (h loaded, dh and act_w stored) is about half of its tile's time. (The
// forward's modes on it, as a config of their own, measured no faster than their cooperative
// 128 x 256 tile: docs/perf/NOTES.md, "Measured and dropped".)
//
// The ring's protocol is the cooperative kernel's: every warp takes every item from the channel,
// and the producer fills the stages in item order. Warpgroup w multiplies the items of ordinal
// parity w; for the others it advances its Pipe by their K-tiles without waiting (every item of a
// ping-pong mode has the whole K: no split), so its stage sequence stays the producer's. The stages
// of its next tile follow the other warpgroup's, so the two alternate on the tensor pipe. A stage
// is released by the 4 warps of the warpgroup that multiplied it (Config::kEmptyArrivals).
//
// The turn: a "full" mbarrier wait names a phase by its parity only, so it is right only if the
// stage's previous fill (STAGES fills earlier) has completed: a warpgroup that skipped ahead and
// waited early would see the parity of a fill of the other's tile and read that stage. So the
// warpgroups take turns at their mainloops through two mbarriers (Smem::turn(w): warpgroup w's
// turn, 4 arrivals): the one ending its mainloop arrives on the other's once it has seen its own
// last stage full (every fill before the other's tile has then completed), before it issues that
// stage's wgmma; the other waits on it before its first stage. Warpgroup 0's first tile needs none.
// A turn is given once per tile and taken before the next: never two phases apart. (Named barriers,
// bar.sync / bar.arrive, did the same, and ptxas then kept DGrad's consumers at 168 registers:
// 1.5 KB of spill.)
#pragma once

#include <cstdint>

#include "gemm/common.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/ptx.cuh"
#include "gemm/sm90/scheduler.cuh"

namespace moekit::kernels::gemm::sm90 {

// acc[m] = A[rows 64m .. 64m + 63 of the tile] · B[BN]ᵀ over the whole K (mainloop.cuh's K loop):
// per stage and k16 slice two wgmma.m64nBNk16, one a set, into one group. last_stage_full() runs
// once the last stage has been seen full, before its group. kSet1: whether rows 64 .. 127 have a
// real row (the padding after an expert's rows fills a block's end); else only set 0 is issued and
// acc[1] is left as it was. A template parameter, so each K loop issues its wgmma unconditionally:
// under a runtime branch ptxas injects warpgroup.arrive around them (C7519).
template <class Cfg, bool kBNMajor, bool kSet1, class Hook, class LastFull>
__device__ __forceinline__ void mma_tile_pair(float (&acc)[2][Cfg::kAccs], const Smem<Cfg>& sm, uint64_t desc_a0,
                                              uint64_t desc_b0, int32_t k_tiles, Pipe<Cfg::kStages>& pipe, int lane,
                                              Hook&& after_first_step, LastFull&& last_stage_full) {
  static_assert(Cfg::kBlockN == 128, "the pair is two m64n128 sets");
  constexpr uint32_t kSetBytes = uint32_t(kWgmmaM * kRowBytes);  // A rows 64 .. 127 of the stage
  auto fence = [&] {
    ptx::fence_operands(acc[0]);
    ptx::fence_operands(acc[1]);
  };
  auto issue = [&](uint32_t stage, int32_t kt) {
    const uint64_t desc_a = desc_advance(desc_a0, stage * Cfg::kABytes);
    const uint64_t desc_b = desc_advance(desc_b0, stage * Cfg::kBBytes);
#pragma unroll
    for (int kk = 0; kk < kBlockK / kWgmmaK; ++kk) {
      const uint32_t a_bytes = uint32_t(kk * kWgmmaK * 2);
      const uint32_t b_bytes = kBNMajor ? mn_k16_bytes(kk) : a_bytes;
      const bool accumulate = kt > 0 || kk > 0;
      ptx::wgmma_m64n128k16<kBNMajor ? 1 : 0>(acc[0], desc_advance(desc_a, a_bytes), desc_advance(desc_b, b_bytes),
                                              accumulate);
      if constexpr (kSet1)
        ptx::wgmma_m64n128k16<kBNMajor ? 1 : 0>(acc[1], desc_advance(desc_a, a_bytes + kSetBytes),
                                                desc_advance(desc_b, b_bytes), accumulate);
    }
  };
  wgmma_k_loop(sm, k_tiles, pipe, lane, fence, issue, after_first_step, last_stage_full);
}

// A ping-pong consumer warpgroup: its tiles of the channel (every other one), mainloop then
// epilogue, each of the tile's 4 rows a thread (2 a set) through the mode's epilogue.
template <Mode M, class Cfg>
__device__ __forceinline__ void consume_pingpong(const Params& p, const Smem<Cfg>& sm, int32_t items, int32_t k_tiles) {
  static_assert(Cfg::kPingPong && !Cfg::kFp8 && !splits_k<M, Cfg>(), "ping-pong: bf16, every tile the whole K");
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);  // warp-uniform (kernel.cuh)
  const int warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
  const uint64_t desc_a0 = make_desc_k_sw128(sm.a(0));
  const uint64_t desc_b0 = b_n_major(M) ? make_desc_mn_sw128(sm.b(0)) : make_desc_k_sw128(sm.b(0));
  const int32_t n_tiles = int32_t(p.n_tiles);

  float acc[2][Cfg::kAccs];
  Pipe<Cfg::kStages> pipe;
  ItemRing ring;
  // The loop tests the item at its head (as consume's does): written as for (;;) with a break at
  // the end item, ptxas kept this region to the launch's 168 registers and spilled 1.2 KB.
  uint32_t turn_phase = 0;
  Item it = take_item(sm, ring, lane);
  for (int32_t ordinal = 0; it.item < items; ++ordinal, it = take_item(sm, ring, lane)) {
    if ((ordinal & 1) != wg) {  // the other warpgroup's tile: its stages pass this one by
      pipe.skip(k_tiles);
      continue;
    }
    const TileCoord tile = tile_of(it.item, n_tiles);
    const int32_t row0 = tile.block * kBlockM;
    // This thread's rows: set m, half h. Loaded before the first stage's wait (the other
    // warpgroup's mainloop is running: the latency is hidden there).
    int32_t ids[2][2];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) ids[m][h] = p.sorted_ids[row0 + m * kWgmmaM + acc_row(warp, lane, 2 * h)];
    Epilogue<M, Cfg> epi[2];
    auto hook = [&] {
      epi[0].load_row_data(p, ids[0]);
      epi[1].load_row_data(p, ids[1]);
    };
    if (ordinal > 0) {  // this warpgroup's turn
      ptx::mbar_wait(sm.turn(wg), turn_phase);
      turn_phase ^= 1;
    }
    auto give_turn = [&] {
      if (lane == 0) ptx::mbar_arrive(sm.turn(wg ^ 1));
    };
    // Rows 64 .. 127 all padding (publish_tile's live bit 1): half the tensor work, no epilogue.
    const bool set1 = (it.live >> 1) & 1;
    if (set1)
      mma_tile_pair<Cfg, b_n_major(M), true>(acc, sm, desc_a0, desc_b0, k_tiles, pipe, lane, hook, give_turn);
    else
      mma_tile_pair<Cfg, b_n_major(M), false>(acc, sm, desc_a0, desc_b0, k_tiles, pipe, lane, hook, give_turn);

    const int32_t n0 = tile.n_tile * cols_per_tile(M, Cfg::kBlockN);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (m == 1 && !set1) continue;
        const int32_t out_row = epi[m].out_row(row0 + m * kWgmmaM + acc_row(warp, lane, 2 * h), ids[m][h]);
        epi[m].store(p, acc[m], h, ids[m][h], out_row, n0, lane);
      }
  }
}

}  // namespace moekit::kernels::gemm::sm90
