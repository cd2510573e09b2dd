// loader.cuh — the producer side of the mma.sync expert GEMM: every thread's cp.async loads of A
// and B, one K-tile at a time, as one stream across all the work items of its CTA.
//
// A decode item is 6-56 K-tiles. A loader that drained the ring at every item (load the item's
// ids, wait, refill; nothing in flight during the epilogue) lost a memory round trip plus the
// epilogue per item; here the next item's first K-tiles load while the current one finishes, and
// the routing those loads need (its expert, the sorted ids of this thread's A rows) is fetched one
// item ahead. Measured on the H200: every decode GEMM 1-8% faster (docs/perf/NOTES.md, "Decode
// GEMM"). Chunks are 16 bytes; padding rows and the K tail are zero-filled (source size 0).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "common/async_copy.cuh"
#include "gemm/common.cuh"
#include "gemm/mma_sync/scheduler.cuh"
#include "gemm/mma_sync/tile.hpp"

namespace moekit::kernels::gemm::mma_sync {

// What a loader adds to each K-tile beyond A and B: nothing (bf16), or the FP8 block scales
// (fp8.cuh). fetch: the routing of the item after the bound one; bind: point at an item;
// load: issue K-tile kt's loads into ring slot `slot`.
struct NoScales {
  __device__ __forceinline__ void fetch(const Params&, int64_t, int) {}
  __device__ __forceinline__ void bind(const Params&, int64_t, int64_t, int, int) {}
  __device__ __forceinline__ void load(const Params&, unsigned char*, int, int64_t, int) {}
};

template <Mode M, class Cfg, class Scales = NoScales, class Sched = DealtSchedule<Cfg>>
struct Loader {
  static constexpr int CH = Cfg::kChunks, kAI = Cfg::kAIters, kBI = Cfg::kBIters, BN = Cfg::kBlockN;
  static constexpr int BM = Cfg::kBlockM, BK = Cfg::kBlockK;
  // A wide tile (the fp8 up tile: 256 B rows, 16 chunks a thread) would hold 16 pointers; it keeps
  // one base per half and steps kRowStep rows per chunk at the load instead (no spill).
  static constexpr bool kCompactB = kBI > 8;
  static constexpr int kRowStep = Cfg::kThreads / CH;  // rows between a thread's chunks

  const Params& p;
  const Sched& sched;
  const int64_t k_tiles_total;
  const int tid;
  // The stream: K-tiles ld_kt .. ld_end (absolute) of item ld_item. It starts one stride before
  // its first item with nothing left, so the first load moves it there.
  int64_t ld_item, ld_kt = 0, ld_end = 0;
  const __nv_bfloat16* a_src[kAI];  // this thread's A and B chunk sources for the current item
  bool a_ok[kAI];
  const __nv_bfloat16* b_src[kCompactB ? 2 : kBI];  // compact: the first chunk's row of each half
  bool b_ok[kCompactB ? 1 : kBI];
  uint32_t b_ok_bits = 0;  // compact: bit i = chunk i's row is inside the weights
  // Routing of the item after ld_item (loaded one item ahead; unused past the last item).
  Item nx_it{};
  int nx_expert = 0;
  int32_t nx_ids[kAI];
  Scales scales;

  __device__ __forceinline__ Loader(const Params& p_, const Sched& s, int64_t k_tiles, int t)
      : p(p_), sched(s), k_tiles_total(k_tiles), tid(t), ld_item(s.first() - s.stride) {
    fetch_routing(s.first());
  }

  __device__ __forceinline__ void fetch_routing(int64_t item) {
    if (sched.done(item)) return;
    nx_it = sched.at(p, item);
    nx_expert = p.block_expert[nx_it.block];
#pragma unroll
    for (int i = 0; i < kAI; ++i) nx_ids[i] = p.sorted_ids[nx_it.block * BM + (tid + i * Cfg::kThreads) / CH];
    scales.fetch(p, nx_it.block, tid);
  }

  // Point this thread's chunk sources at item `it` (routing given), and set its K range.
  // Up gathers x row a/k of assignment a; Down reads act row r in sorted order. Up's B tile is
  // BN/2 gate rows, then the same BN/2 up rows (w13 holds gate rows [0, F), up rows [F, 2F)).
  __device__ __forceinline__ void bind(const Item& it, int expert, const int32_t (&ids)[kAI]) {
    const int64_t n = split_k_tiles(p, it.split, k_tiles_total, ld_kt);
    ld_end = ld_kt + n;
#pragma unroll
    for (int i = 0; i < kAI; ++i) {
      const int r = (tid + i * Cfg::kThreads) / CH, c = (tid + i * Cfg::kThreads) % CH;
      const int64_t id = ids[i];
      a_ok[i] = id < p.num_assign;
      const int64_t src_row = M == Mode::Up ? (a_ok[i] ? id / p.topk : 0) : it.block * BM + r;
      a_src[i] = p.a + src_row * p.k_dim + c * 8;
    }
    const int64_t n0 = it.n_tile * cols_per_tile(M, BN);
    scales.bind(p, it.block, n0, expert, tid);
    const __nv_bfloat16* b_expert = p.b + int64_t(expert) * p.b_expert_stride;
    if constexpr (kCompactB) {
      static_assert(M == Mode::Down || (BN / 2) % kRowStep == 0, "each half starts on a chunk row");
      const int r = tid / CH, c = tid % CH;
      b_ok_bits = 0;
#pragma unroll
      for (int i = 0; i < kBI; ++i) {
        const int ri = r + i * kRowStep;
        const int64_t col = n0 + (M == Mode::Up && ri >= BN / 2 ? ri - BN / 2 : ri);
        b_ok_bits |= uint32_t(col < p.n_dim) << i;
      }
      b_src[0] = b_expert + (n0 + r) * p.k_dim + c * 8;
      b_src[1] = M == Mode::Up ? b_src[0] + p.n_dim * p.k_dim : b_src[0] + int64_t(BN / 2) * p.k_dim;
    } else {
#pragma unroll
      for (int i = 0; i < kBI; ++i) {
        const int r = (tid + i * Cfg::kThreads) / CH, c = (tid + i * Cfg::kThreads) % CH;
        int64_t col, b_row;
        if constexpr (M == Mode::Up) {
          col = n0 + (r < BN / 2 ? r : r - BN / 2);
          b_row = r < BN / 2 ? col : p.n_dim + col;
        } else {
          col = n0 + r;
          b_row = col;
        }
        b_ok[i] = col < p.n_dim;
        b_src[i] = b_expert + (b_ok[i] ? b_row : 0) * p.k_dim + c * 8;
      }
    }
  }

  // Move to the next item that has K-tiles (items of empty K-slices load nothing).
  __device__ __forceinline__ void advance() {
    do {
      ld_item = sched.next(ld_item);
      if (sched.done(ld_item)) return;
      bind(nx_it, nx_expert, nx_ids);
      fetch_routing(sched.next(ld_item));
    } while (ld_kt == ld_end);
  }

  // Issue the next K-tile of the stream into ring slot `slot` (nothing once the stream is done).
  // Each piece is inlined once (the kernel has one loop and no unrolled prologue): a version that
  // also unrolled the loads into a prologue doubled the kernel's code, past 4,000 SASS
  // instructions, and cost the one-item-per-CTA layers (T = 1) 1.5-4.5 us of launch overlap.
  __device__ __forceinline__ void load(__nv_bfloat16* smem, int slot) {
    if (ld_kt == ld_end) advance();
    if (sched.done(ld_item)) return;
    __nv_bfloat16* sa = smem + slot * Cfg::kStageElems;
    __nv_bfloat16* sb = sa + BM * BK;
    const int64_t k0 = ld_kt * BK;
#pragma unroll
    for (int i = 0; i < kAI; ++i) {
      const int idx = tid + i * Cfg::kThreads, r = idx / CH, c = idx % CH;
      const bool ok = a_ok[i] && k0 + c * 8 < p.k_dim;
      dev::cp_async16(smem_addr(sa + swz<BK>(r, c)), ok ? a_src[i] + k0 : p.a, ok ? 16u : 0u);
    }
#pragma unroll
    for (int i = 0; i < kBI; ++i) {
      const int idx = tid + i * Cfg::kThreads, r = idx / CH, c = idx % CH;
      if constexpr (kCompactB) {
        constexpr int kHalf = kBI / 2;  // chunks per half: the half's rows step kRowStep from b_src[h]
        const bool ok = ((b_ok_bits >> i) & 1u) && k0 + c * 8 < p.k_dim;
        const __nv_bfloat16* src = b_src[i / kHalf] + int64_t((i % kHalf) * kRowStep) * p.k_dim + k0;
        dev::cp_async16(smem_addr(sb + swz<BK>(r, c)), ok ? src : p.b, ok ? 16u : 0u);
      } else {
        const bool ok = b_ok[i] && k0 + c * 8 < p.k_dim;
        dev::cp_async16(smem_addr(sb + swz<BK>(r, c)), ok ? b_src[i] + k0 : p.b, ok ? 16u : 0u);
      }
    }
    scales.load(p, reinterpret_cast<unsigned char*>(smem), slot, ld_kt, tid);
    ++ld_kt;
  }

  // The stream is spent: true from the load() call after the one that issued its last loads.
  __device__ __forceinline__ bool done() const { return sched.done(ld_item); }
};

// Down, before the kernel's PDL wait (Params::boundary): the B rows of the CTA's first item, its
// first K-tiles up to kPrefetchBytes, into L2 by one bulk request a row. The weights never depend
// on the predecessor, and up waited for align before it let this kernel start, so the routing
// read here is final (bounded all the same: a wrong flag costs a wrong hint, not a fault); up
// signals near its end, so the rows arrive while its last tiles drain instead of under its
// stream. A hint: the loader's own cp.async of these rows still moves them into shared memory.
// (The scheduler is built here and again after the wait: the kernel's own must not read the
// routing before the wait where the flag is not set.)
template <Mode M, class Cfg, class Sched>
__device__ __forceinline__ void prefetch_first_b(const Params& p, int tid) {
  static_assert(M == Mode::Down, "Up's B rows are gate/up pairs, and its routing is its predecessor's output");
  constexpr int BN = Cfg::kBlockN, BK = Cfg::kBlockK;
  // A tuning constant, the one measured (docs/perf/NOTES.md, "Decode GEMM"): all of a Qwen3 down
  // item, one K-tile of the 256-row FP8 tile.
  constexpr int64_t kPrefetchBytes = 64 * 1024;
  constexpr int64_t kTiles = std::max<int64_t>(1, kPrefetchBytes / (int64_t(BN) * BK * 2));
  const Sched sched(p);
  if (!sched.cta_has_items()) return;
  const Item it = sched.at(p, sched.first());
  if (it.block >= p.max_blocks) return;
  const int32_t expert = p.block_expert[it.block];
  if (expert < 0 || expert >= p.experts) return;
  const int64_t k_tiles_total = (p.k_dim + BK - 1) / BK;
  int64_t kt0;
  const int64_t n = split_k_tiles(p, it.split, k_tiles_total, kt0);
  if (n == 0) return;  // a trailing K-slice without K-tiles
  const int64_t k_begin = kt0 * BK, k_end = min(p.k_dim, (kt0 + min(n, kTiles)) * BK);
  const uint32_t bytes = uint32_t((k_end - k_begin) * 2);
  const __nv_bfloat16* base = p.b + int64_t(expert) * p.b_expert_stride + k_begin;
  const int64_t n0 = it.n_tile * BN;
  // Rows start 16-byte aligned (the weights' 16-byte base and rows: common/validate.cpp), k_begin
  // is a whole K-tile and k_end a K-tile or the row's end: 16-byte multiples, as the request needs.
  for (int r = tid; r < BN && n0 + r < p.n_dim; r += Cfg::kThreads) dev::prefetch_l2_bulk(base + (n0 + r) * p.k_dim, bytes);
}

}  // namespace moekit::kernels::gemm::mma_sync
