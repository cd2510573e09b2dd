// weight_grad.cuh — the backward's weight gradients on the Hopper tensor cores: k-grouped GEMMs
// (gemm/params.hpp, KGroupedParams) whose K is each expert's sorted rows, composed of the expert
// GEMM's parts — the claimed-item channel (scheduler.cuh), the ring of stages (pipeline.cuh) and
// the wgmma mainloop (mainloop.cuh, both operands MN-major) — with a producer and an epilogue
// (weight_grad_epilogue.cuh) of their own.
//
// A work item is one 128 x 256 tile of out_e for one split of e's K-tiles, expert (and split)
// major, so the CTAs working at once share an expert's rows (its K-tiles come to L2 once and feed
// every tile of the expert); inside an (expert, split) the tiles go in bands of 8 M tiles, N tiles
// outermost in a band (item_order.hpp, as the expert GEMM's blocks): a wave of 132 CTAs reads ~8 M
// tiles' and ~16 N tiles' columns of each K row, not 2-3 M tiles' and every N tile's (dW2 of
// Mixtral: 56 N tiles, all of an expert's act_w each wave, above the L2). An item's K range is
// read on the device: rows [expert_row_start[e], + expert_counts[e]) of the sorted order, the
// split's share of their K-tiles of 64 rows; an expert (or a split) with none stores zeros, or
// adds nothing.
//
// The producer (warpgroup 2) fills a stage with 64 K rows of both operands by cp.async: A's 128 M
// values and B's 256 N values of each row, written straight into the N-major 128-byte-swizzled
// panels wgmma reads with imm-trans (layout.hpp, mn_tile_offset: a panel is 64 K rows of 64
// values). A warp's cp.async covers 512 contiguous bytes of global memory: one K row of B, two of
// A. The gathered operand's rows come from sorted_ids through a table of their addresses in
// shared memory (one id a lane a stage, GatherRows), so a lane's copies are independent of each
// other and two adds each. The ring's turnaround, not the bytes, paces the producer (measured:
// docs/perf/NOTES.md, "Do dW's L2 sectors set its pace?"), at 88-95% of the tensor rate. Rows
// past the expert's count and ids of no assignment copy zeros (kZeroRow), columns past the output
// are zero-filled, so tails add exact zeros and nothing outside the expert's rows is read. Each
// output element is one thread's FP32 sum in K order: bitwise deterministic.
#pragma once

#include <cstdint>

#include "common/device.cuh"  // pdl_enter
#include "gemm/common.cuh"  // pack_bf16x2, KGroupedParams
#include "gemm/item_order.hpp"  // grouped_tile
#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/ptx.cuh"
#include "gemm/sm90/scheduler.cuh"
#include "gemm/sm90/weight_grad_epilogue.cuh"

namespace moekit::kernels::gemm::sm90 {

// 128 x 256 tiles, 4 stages of 48 KB: the expert GEMM's geometry (its B region holds the N side),
// plus each producer warp's table of the rows it gathers in a stage (16 addresses, see GatherRows).
// And each consumer warp's two 2 KB chunks for the bf16 epilogue (store_bf16_rows: 16 rows x 64
// columns each, filled in turn while the TMA stores the other), 1024-byte aligned: the store reads
// them through the 128-byte swizzle, a function of the address.
struct WeightGradCfg : Config<256, 4> {
  static constexpr uint32_t kRowTableOffset = (kTurnBarOffset + 15) / 16 * 16;
  static constexpr uint32_t kRowTableBytes = kProducerThreads / 32 * 16 * 8;
  // Each item slot's decoded work (WeightGradWork, 32 bytes), beside the channel's {item, live}.
  static constexpr uint32_t kWorkOffset = kRowTableOffset + kRowTableBytes;
  static constexpr uint32_t kWorkBytes = 32;
  static constexpr uint32_t kEpiStageOffset = (kWorkOffset + kItemSlots * kWorkBytes + 1023) / 1024 * 1024;
  static constexpr uint32_t kEpiChunkBytes = 16 * 64 * 2;
  static constexpr uint32_t kEpiStageBytes = 2 * kEpiChunkBytes;  // a warp's
  static constexpr size_t kSmemBytes = kEpiStageOffset + kConsumerThreads / 32 * kEpiStageBytes + kSwizzleAtomBytes;
  static_assert(kSmemBytes <= kSm90SmemPerBlockOptin, "an sm_90 CTA has at most 227 KB of shared memory");
  static_assert(kBlockN / 64 % 2 == 0, "a tile's 64-column chunks alternate between a warp's two: chunk c refills c - 2's");
};
inline constexpr int kWeightGradM = kBlockM, kWeightGradN = WeightGradCfg::kBlockN;

// How a producer warp copies an operand W values wide (load_rows): a warp-wide cp.async is 32
// chunks of 16 bytes, W / 8 a row, so it covers kRowsAtOnce rows, and warp w copies the stage's K
// rows w·kRowsAtOnce + s + kStep·i (s < kRowsAtOnce, i < kIters): 16 of the 64. For the gathered
// operand, lane l < 16 of the warp finds the l-th of them (s = l / kIters, i = l % kIters) and
// writes the address of its token row at the tile's first column to the warp's table at l (a row of
// no token: kZeroRow's); a lane copying rows s + kStep·i then reads its kIters addresses two at a
// time (LDS.128, the same address across the row's lanes) and adds its column.
template <int W>
struct GatherRows {
  static constexpr int kRowChunks = W / 8, kRowsAtOnce = 32 / kRowChunks, kStep = 4 * kRowsAtOnce;
  static constexpr int kIters = kBlockK / kStep;
  static_assert(32 % kRowChunks == 0 && kBlockK % kStep == 0 && (kStep == 4 || kStep == 8), "a warp copies whole rows");
  static_assert(kRowsAtOnce * kIters == 16 && kIters % 2 == 0, "16 rows a warp, read 2 at a time");
  __device__ static int table_row(int warp, int l) { return warp * kRowsAtOnce + l / kIters + kStep * (l % kIters); }
};

// What a gathered row of no token copies: one of kZeroRows rows of zeros as wide as a tile's row
// (its table address, plus a lane's column, stays inside the row). Spread over 16 KB, chosen by
// the CTA and the K row, so the padding rows of all SMs at once (half an expert's at ~32 rows an
// expert) do not all read the same four L2 lines. A __device__ array without an initializer is
// zero-initialized, as static storage is; nothing writes it.
inline constexpr int kZeroRows = 32;
static __device__ uint4 kZeroRow[kZeroRows][kWeightGradN * 2 / 16];

__device__ __forceinline__ WeightGradItem weight_grad_item(const KGroupedParams& p, int32_t item) {
  const int32_t tiles = p.m_tiles * p.n_tiles;
  const GroupedTile<int32_t> t = grouped_tile<int32_t>(item % tiles, p.m_tiles, p.n_tiles);
  item /= tiles;
  return {item / p.splits, item % p.splits, t.block * kWeightGradM, t.n_tile * kWeightGradN};
}

// The item's K range: its split's K-tiles of the expert's rows, from sorted row `first` (K-tile 0)
// to `end` (the expert's last row + 1).
struct KRange {
  int32_t first, end, k_tiles;
};
__device__ __forceinline__ KRange k_range(const KGroupedParams& p, const WeightGradItem& w) {
  const int32_t start = p.expert_row_start[w.expert], count = p.expert_counts[w.expert];
  const int32_t tiles = (count + kBlockK - 1) / kBlockK, per_split = (tiles + p.splits - 1) / p.splits;
  const int32_t kt0 = w.split * per_split;
  const int32_t k_tiles = kt0 < tiles ? min(tiles - kt0, per_split) : 0;
  return {start + kt0 * kBlockK, start + count, k_tiles};
}

// An item as every warp of the CTA uses it, decoded once by the claiming thread into the item's
// slot (post_work): decoding it in each warp (the divisions of weight_grad_item, k_range's two
// loads) took ~250 instructions a consumer warp an item, with the tensor pipe idle in both
// warpgroups at once (13% of the consumers' samples at 4 K-tiles an item: docs/perf/NOTES.md).
struct WeightGradWork {
  int32_t item;  // >= items: the end (the rest unset)
  WeightGradItem w;
  KRange k;
};
static_assert(sizeof(WeightGradWork) == WeightGradCfg::kWorkBytes, "a slot's work is two 16-byte words");

// The claiming thread: `item` decoded into the ring's slot once the slot is free.
template <class Cfg>
__device__ __forceinline__ void post_work(const KGroupedParams& p, const Smem<Cfg>& sm, const ItemRing& ring,
                                          int32_t item, int32_t items) {
  WeightGradItem w{};
  KRange k{};
  if (item < items) {
    w = weight_grad_item(p, item);
    k = k_range(p, w);
  }
  post_slot(sm, ring, [&](uint32_t slot) {
    const uint32_t at = sm.base + Cfg::kWorkOffset + slot * Cfg::kWorkBytes;
    ptx::st_shared_v4_u32(at, {item, w.expert, w.split, w.m0});
    ptx::st_shared_v4_u32(at + 16, {w.n0, k.first, k.end, k.k_tiles});
  });
}

// Every thread of the CTA: the next item's work, read before this thread's arrival on item_empty
// (every thread arrives, so racecheck sees each read ordered before its arrival; the loads are of
// one address a warp, so uniform).
template <class Cfg>
__device__ __forceinline__ WeightGradWork take_work(const Smem<Cfg>& sm, ItemRing& ring) {
  return take_slot(
      sm, ring,
      [&](uint32_t slot) {
        const uint32_t at = sm.base + Cfg::kWorkOffset + slot * Cfg::kWorkBytes;
        int32_t a[4], b[4];
        ptx::ld_shared_v4_u32(at, a);
        ptx::ld_shared_v4_u32(at + 16, b);
        return WeightGradWork{a[0], {a[1], a[2], a[3], b[0]}, {b[1], b[2], b[3]}};
      },
      [](uint32_t empty) { ptx::mbar_arrive(empty); });
}

// One stage's K rows [row0, row0 + 64) of an operand W values wide from column mn0, by the
// producer warp `warp` (0..3): lane l copies chunk j = l % (W / 8) of K rows r0 + kStep·i
// (GatherRows). kByToken: the rows' addresses at column mn0 are the warp's table, so a copy is
// the address plus the lane's column (two adds) and the cp.async, independent of the others and
// with no test of its own (a row of no token reads kZeroRow); else one pointer walks the rows. What
// stays in registers across the K loop is a lane's two shared-memory bases (mn_parity_base) and
// its bounds.
template <int W, bool kByToken>
__device__ __forceinline__ void load_rows(const KGroupedOperand& op, uint32_t dst, uint32_t table, int32_t row0,
                                          int32_t end, int64_t mn0, int64_t mn_dim, int warp, int lane) {
  using G = GatherRows<W>;
  constexpr int kStep = G::kStep, kIters = G::kIters;
  const int j = lane % G::kRowChunks;                           // this lane's chunk of every row it copies
  const int r0 = warp * G::kRowsAtOnce + lane / G::kRowChunks;  // its first K row of the stage
  const int64_t col = mn0 + j * 8;
  const bool col_ok = col < mn_dim;
  const uint32_t base[2] = {dst + mn_parity_base(uint32_t(r0), uint32_t(j * 8), kStep, 0),
                            dst + mn_parity_base(uint32_t(r0), uint32_t(j * 8), kStep, 1)};
  if constexpr (kByToken) {
    const uint32_t lane_bytes = uint32_t(j) * 16u;  // from the tile's first column: < 512, inside a kZeroRow row
    const uint32_t my_table = table + uint32_t(lane / G::kRowChunks) * kIters * 8u;
    // 8 addresses (4 loads) before their 8 copies: one wait on the loads' latency, and ptxas puts
    // its three dummy LDS before a cp.async that follows an LDS once a batch, not once a pair.
    constexpr int kBatch = kIters < 8 ? kIters : 8;
#pragma unroll
    for (int i0 = 0; i0 < kIters; i0 += kBatch) {
      uint64_t row[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; i += 2) {
        uint64_t two[2];
        ptx::ld_shared_v2_u64(my_table + uint32_t(i0 + i) * 8u, two);
        row[i] = two[0], row[i + 1] = two[1];
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        ptx::cp_async16(base[(i0 + i) % 2] + uint32_t((i0 + i) * kStep * kRowBytes),
                        reinterpret_cast<const void*>(row[i] + lane_bytes), col_ok ? 16u : 0u);
    }
  } else {
    // Byte addresses: a copy's source is one IMAD.WIDE.U32 (row · row bytes + row_src); the row
    // bytes fit 32 bits (the shape limits: a static_assert beside the launcher), the product is 64-bit.
    const int32_t rows_left = col_ok ? end - row0 - r0 : 0;  // copy i is real iff kStep·i < rows_left
    const uint32_t row_bytes = uint32_t(op.stride) * 2u;
    const unsigned char* row_src = reinterpret_cast<const unsigned char*>(op.base + col) +
                                   uint64_t(uint32_t(row0 + r0)) * row_bytes;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const bool ok = kStep * i < rows_left;
      ptx::cp_async16(base[i % 2] + uint32_t(i * kStep * kRowBytes), row_src + uint64_t(uint32_t(kStep * i)) * row_bytes,
                      ok ? 16u : 0u);
    }
  }
}

template <bool kATokens, class Cfg>
__device__ __forceinline__ void produce_weight_grad(const KGroupedParams& p, const Smem<Cfg>& sm, int32_t items) {
  using G = GatherRows<kATokens ? kWeightGradM : kWeightGradN>;  // the gathered operand's copies
  const int t = int(threadIdx.x) - kConsumerThreads;
  const int warp = t / 32, lane = t % 32;
  const uint32_t table = sm.base + Cfg::kRowTableOffset + uint32_t(warp) * 128u;
  const int my_row = G::table_row(warp, lane % 16);  // lanes < 16: the stage's K row whose token row it finds
  const KGroupedOperand& gathered = kATokens ? p.a : p.b;
  const uint32_t gathered_row_bytes = uint32_t(gathered.stride) * 2u;
  Pipe<Cfg::kStages> pipe;
  ItemRing ring;
  int32_t next = int32_t(blockIdx.x);  // thread 0: the item to publish next
  for (;;) {
    if (t == 0) post_work(p, sm, ring, next, items);  // both warpgroups take every item (consume_weight_grad)
    const WeightGradWork work = take_work(sm, ring);
    if (work.item >= items) break;
    if (t == 0) next = claim_item(p.tile_counter);  // claimed now: its latency hides under the item
    const WeightGradItem& w = work.w;
    const KRange& k = work.k;
    // Lane l < 16's id of its K row, loaded two stages ahead and made a token row (id / topk; -1:
    // past the expert's rows, or an id of no assignment) when its stage comes. One stage ahead,
    // the load's latency (an L2 round trip) had only one stage's copies to hide under when the
    // ring has room: the likely pace of the producer alone, a stage every ~1,060 cycles, about the
    // tensor rate (docs/perf/NOTES.md, "Backward"). The stages go in pairs, even ones reading
    // ids[0] and odd ones ids[1], each reloaded right after its use: a register copy between the
    // two (id = id_next) would wait for the load at once.
    auto load_id = [&](int32_t row0) -> int32_t {
      const int32_t r = row0 + my_row;
      return lane < 16 && r < k.end ? p.sorted_ids[r] : -1;
    };
    int32_t ids[2] = {k.k_tiles > 0 ? load_id(k.first) : -1, k.k_tiles > 1 ? load_id(k.first + kBlockK) : -1};
    // The gathered operand's rows at the tile's first column (its M or N offset).
    const uint64_t tile_cols = reinterpret_cast<uint64_t>(gathered.base + (kATokens ? w.m0 : w.n0));
    auto stage = [&](int32_t kt, int32_t& id) {
      const int32_t row0 = k.first + kt * kBlockK;
      const bool has_row = id >= 0 && id < p.num_assign;
      const uint64_t src = has_row ? tile_cols + uint64_t(p.topk_div.div(uint32_t(id))) * gathered_row_bytes
                                   : reinterpret_cast<uint64_t>(kZeroRow[(blockIdx.x + uint32_t(my_row)) % kZeroRows]);
      id = kt + 2 < k.k_tiles ? load_id(row0 + 2 * kBlockK) : -1;
      __syncwarp();  // every lane has read the last stage's table
      if (lane < 16) ptx::st_shared_u64(table + uint32_t(lane) * 8u, src);
      __syncwarp();
      ptx::mbar_wait(sm.empty(pipe.stage), pipe.phase ^ 1);  // the consumers released this stage
      load_rows<kWeightGradM, kATokens>(p.a, sm.a(pipe.stage), table, row0, k.end, w.m0, p.m_dim, warp, lane);
      load_rows<kWeightGradN, !kATokens>(p.b, sm.b(pipe.stage), table, row0, k.end, w.n0, p.n_dim, warp, lane);
      ptx::cp_async_arrive_noinc(sm.full(pipe.stage));
      pipe.advance();
    };
    for (int32_t kt = 0; kt < k.k_tiles; kt += 2) {
      stage(kt, ids[0]);
      if (kt + 1 < k.k_tiles) stage(kt + 1, ids[1]);
    }
  }
  ptx::cp_async_wait_all();  // leave no copy of this thread in flight when it exits
}

template <class Cfg>
__device__ __forceinline__ void consume_weight_grad(const KGroupedParams& p, const CUtensorMap* out_map,
                                                    const Smem<Cfg>& sm, int32_t items) {
  // warp-uniform (see kernel.cuh's consume): the descriptors then live in uniform registers
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  const int warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
  // Warpgroup wg multiplies the tile's M rows [64wg, +64): A's panel wg.
  const uint64_t desc_a0 = make_desc_mn_sw128(sm.a(0) + uint32_t(wg) * kMnPanelBytes);
  const uint64_t desc_b0 = make_desc_mn_sw128(sm.b(0));
  const uint32_t epi_stage = sm.base + Cfg::kEpiStageOffset + uint32_t(threadIdx.x / 32) * Cfg::kEpiStageBytes;
  float acc[Cfg::kAccs];
  Pipe<Cfg::kStages> pipe;
  ItemRing ring;
  WeightGradWork it = take_work(sm, ring);
  while (it.item < items) {
    const WeightGradItem& w = it.w;
    const KRange& k = it.k;
    const bool live = w.m0 + wg * kWgmmaM < p.m_dim;  // a partial last M tile may leave warpgroup 1 none
    // Zeroed here (the first wgmma overwrites them where there is K): no accumulator is live from
    // the epilogue to here, the registers the item's bookkeeping needs.
#pragma unroll
    for (int i = 0; i < Cfg::kAccs; ++i) acc[i] = 0.0f;
    if (k.k_tiles > 0) mma_tile<Cfg, true, true>(acc, sm, desc_a0, desc_b0, k.k_tiles, pipe, lane, live, [] {});
    const WeightGradWork next = take_work(sm, ring);
    // Accumulating unsplit, an expert with no rows adds nothing (main_grad bitwise as it was, unread).
    const bool adds_nothing = p.accumulate && !p.partials && k.k_tiles == 0;
    if (live && !adds_nothing) store_weight_grad<Cfg>(p, out_map, acc, w, wg, warp, lane, epi_stage);
    it = next;
  }
  if (lane == 0) ptx::bulk_wait_group<0>();  // this warp's bf16 stores written before it exits
}

// out_map: the bf16 out [E][m_dim][n_dim] as (n_dim, m_dim, E, 1), 64 x 16 boxes, 128-byte swizzle
// (unused, and zeros, for an f32 out or split partials).
template <bool kATokens>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_weight_grad_kernel(const KGroupedParams p, const __grid_constant__ CUtensorMap out_map) {
  using Cfg = WeightGradCfg;
  extern __shared__ unsigned char smem_raw[];
  // The expert GEMM kernel's barriers (kernel.cuh), its "full" expecting the cp.async arrivals only.
  if (threadIdx.x == 0) {
    const Smem<Cfg> sm = smem_layout<Cfg>(smem_raw);
    for (uint32_t s = 0; s < Cfg::kStages; ++s) {
      ptx::mbar_init(sm.full(s), kProducerThreads);
      ptx::mbar_init(sm.empty(s), Cfg::kEmptyArrivals);
    }
    for (uint32_t s = 0; s < kItemSlots; ++s) {
      ptx::mbar_init(sm.item_full(s), Cfg::kItemFullArrivals);
      ptx::mbar_init(sm.item_empty(s), kThreads);  // every thread arrives (take_work)
    }
    ptx::mbar_init_fence();
    if (p.bf16_out()) ptx::tma_prefetch_desc(&out_map);
  }
  dev::pdl_enter();  // launched with PDL: the rows, their order and the counts come from predecessors
  __syncthreads();
  const int32_t items = p.experts * p.splits * p.m_tiles * p.n_tiles;  // < 2^31: the launcher checks
  // Nothing stays live across setmaxnreg (kernel.cuh): each role derives its state after it.
  if (threadIdx.x >= kConsumerThreads) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    produce_weight_grad<kATokens>(p, smem_layout<Cfg>(smem_raw), items);
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    consume_weight_grad(p, &out_map, smem_layout<Cfg>(smem_raw), items);
  }
}

}  // namespace moekit::kernels::gemm::sm90
