// scheduler.cuh — which tile a CTA of the Hopper (prefill) expert GEMM computes next: work items
// claimed from a global counter, handed to the CTA's warps through a shared-memory channel.
//
// Work of the whole grid: (used blocks) x (column tiles), the block count read on the device
// (num_rows_padded). CTA c starts with item c, then takes the next unclaimed one from
// p.tile_counter (zeroed by the launcher). Items that share a B tile (the blocks of one expert) or
// an A block (its column tiles) are neighbours in item order (gemm/item_order.hpp: chunks that
// follow the experts), so with claims they start within a few microseconds of each other and the
// second reader finds the bytes in L2. Dealt round-robin, the CTAs drifted apart over the waves
// and re-read most B tiles from DRAM (ncu, DeepSeek-V3 T=16384 up: 70 GB read for 15 GB of
// weights; Mixtral T=4096 up: 10 GB for 1.9).
//
// The channel: a ring of kItemSlots slots of {tile, live}. The producer's warp 0 turns each item
// its CTA will load (its first is blockIdx.x, the next ones claimed) into its tile, block ·
// n_tiles + column tile (the chunk of an item needs block_expert around it: one warp-wide load),
// and its lane 0 posts it, and finally the end (>= items); every warp of the CTA takes the tiles
// in the same order. `live` has bit w set when consumer warpgroup w has a real row: padding rows
// sit at the end of an expert's last block, so a warpgroup whose first row is padding has no
// other. The publisher reads those two ids, off the consumers' path (the producer runs stages
// ahead of them).
// Protocol per slot: the publisher waits for item_empty (every thread read the slot's previous
// item), stores, arrives on item_full (release); every thread waits on item_full (acquire), reads,
// and arrives on item_empty (take_item).
#pragma once

#include <cstdint>

#include "gemm/common.cuh"
#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/ptx.cuh"

namespace moekit::kernels::gemm::sm90 {

// Work of the whole grid, 32-bit: see tile_code (layout.hpp).
struct Work {
  int32_t items, blocks, k_tiles;
};
__device__ __forceinline__ Work read_work(const Params& p) {
  const int32_t blocks = *p.num_rows_padded / kBlockM;
  return {blocks * int32_t(p.n_tiles), blocks, int32_t((p.k_dim + kBlockK - 1) / kBlockK)};
}

// The output column tile and K-tiles of tile t: its whole K, or with split-K (splits_k) its slice.
template <Mode M, class Cfg>
__device__ __forceinline__ KSlice slice_of(const Params& p, TileCoord t, int32_t k_tiles) {
  if constexpr (splits_k<M, Cfg>())
    return k_slice(t.n_tile, p.k_splits, int32_t(p.k_tiles_per_split), k_tiles);
  else
    return {t.n_tile, 0, 0, k_tiles};
}

struct ItemRing {
  uint32_t slot = 0, phase = 0;
  __device__ void advance() {
    if (++slot == kItemSlots) slot = 0, phase ^= 1;
  }
};
struct Item {
  int32_t item, live;
};

// The channel's protocol, whatever a slot holds: the claiming thread waits until the ring's slot
// is free (every reader of its last use arrived on item_empty), writes it (`write(slot)`) and
// arrives on item_full; a reader waits on item_full, reads, arrives on item_empty (as many
// arrivals as item_empty was initialised for) and moves on.
template <class Cfg, class Write>
__device__ __forceinline__ void post_slot(const Smem<Cfg>& sm, const ItemRing& ring, Write&& write) {
  ptx::mbar_wait(sm.item_empty(ring.slot), ring.phase ^ 1);
  write(ring.slot);
  ptx::mbar_arrive(sm.item_full(ring.slot));
}
template <class Cfg, class Read, class Arrive>
__device__ __forceinline__ auto take_slot(const Smem<Cfg>& sm, ItemRing& ring, Read&& read, Arrive&& arrive) {
  ptx::mbar_wait(sm.item_full(ring.slot), ring.phase);
  const auto v = read(ring.slot);
  arrive(sm.item_empty(ring.slot));
  ring.advance();
  return v;
}

// The claiming thread: posts `item` (>= items: the end) and its live warpgroups (bit w: warpgroup
// w has work) to the ring once its slot is free.
template <class Cfg>
__device__ __forceinline__ void post_item(const Smem<Cfg>& sm, const ItemRing& ring, int32_t item, int32_t live) {
  post_slot(sm, ring, [&](uint32_t slot) {
    ptx::st_shared_u32(sm.item_slot(slot), item);
    ptx::st_shared_u32(sm.item_slot(slot) + 4, live);
  });
}

// The expert GEMM's publishing warp (all 32 lanes; `item` the same in each): posts the tile of
// `item` (tile_code) with its live warpgroups (those with a row of an assignment), or the end.
template <class Cfg>
__device__ __forceinline__ void publish_tile(const Params& p, const Smem<Cfg>& sm, const ItemRing& ring, int32_t item,
                                             int32_t items, int32_t blocks, int lane) {
  const int32_t n_tiles = int32_t(p.n_tiles);
  int32_t code = item, live = 0;
  if (item < items) {
    // The chunk of the item's block b: which of blocks b - kGroupBlocks .. b + kGroupBlocks have
    // b's expert (item_order.hpp), a block a lane.
    const int32_t b = item / n_tiles, q = b - kGroupBlocks + lane;
    const bool in = lane < kChunkWindow && q >= 0 && q < blocks;
    const int32_t e = in ? p.block_expert[q] : -1;
    const int32_t e_b = __shfl_sync(0xffffffffu, e, kGroupBlocks);
    const uint32_t same = __ballot_sync(0xffffffffu, in && e == e_b);
    const TileCoord t = chunk_tile(item, expert_chunk(same, b), n_tiles);
    code = tile_code(t, n_tiles);
    const bool row_live = lane < kConsumerWarpgroups && p.sorted_ids[t.block * kBlockM + lane * kWgmmaM] < p.num_assign;
    live = int32_t(__ballot_sync(0xffffffffu, row_live));
  }
  if (lane == 0) post_item(sm, ring, code, live);
}

// The next unclaimed item, for the claiming thread (its first item is blockIdx.x).
__device__ __forceinline__ int32_t claim_item(int32_t* tile_counter) { return int32_t(gridDim.x) + atomicAdd(tile_counter, 1); }

// Called by all 32 lanes of a warp: the next item, read by every lane from the slot (a value
// every lane loads from one shared-memory address ptxas sees is uniform, so the loops after it
// stay in uniform registers). Lane 0 arrives on item_empty after a __syncwarp that orders the
// other lanes' reads before it (item_empty counts kThreads / 32). Sound; racecheck reports it as
// hazards between the slot's store and its reads where a CTA takes many tiles (it does not credit
// the __syncwarp: Sm90GemmTest.ManyTilesPerCta, docs/perf/NOTES.md "Known gaps"). Every lane
// arriving after its own read leaves racecheck nothing to miss (the weight-gradient kernel's
// take_work: 0 hazards), but the expert GEMM's 64-register producer spills 16-48 bytes with it.
// (Lane 0 reading alone and shuffling the item to its warp kept the weight-gradient consumers'
// loop state in vector registers, the shuffled value not being provably uniform: 120 static
// instructions a k-stage with 16 R2UR moving the wgmma descriptors, against 77 with none.)
template <class Cfg>
__device__ __forceinline__ Item take_item(const Smem<Cfg>& sm, ItemRing& ring, int lane) {
  return take_slot(
      sm, ring,
      [&](uint32_t slot) { return Item{ptx::ld_shared_u32(sm.item_slot(slot)), ptx::ld_shared_u32(sm.item_slot(slot) + 4)}; },
      [&](uint32_t empty) {
        __syncwarp();
        if (lane == 0) ptx::mbar_arrive(empty);
      });
}

}  // namespace moekit::kernels::gemm::sm90
