// align.cuh — stage 2: the expert-sorted, block_m-padded order of all T*k assignments, in one
// launch with no host sync: one warp (align_warp_kernel) for decode's few ids, one CTA
// (align_kernel) up to kAlignGridMinAssignments, a cooperative grid (align_grid_kernel) above.
//
// The assignments are cut into rounds of 32 (one id per lane); each active warp owns a
// contiguous segment of rounds. Pass 1: each active warp counts its segment per expert into a
// warp-private row of s_rows (match_any groups equal ids). Totals: thread e sums column e over
// the active rows and leaves there each warp's first slot relative to the expert's start.
// Scan: a block-wide exclusive scan of the padded totals gives each expert's start. Fill:
// padding rows and block_expert, a warp per expert. Pass 2: each warp walks its segment again
// and writes each assignment at its slot. Segments in warp order and ranks in lane order make
// the order inside an expert ascending: the sort is stable.
// The parts (segments, the walk, the kept ranks, the column sums, the scan): passes.cuh; the
// padding fill and block_expert: layout_fill.cuh.
// Each kernel is instantiated twice: kCountLoad adds the call's counts to the caller's load
// counter (store_expert_count), and without it the kernel is the one it was before the counter.
//
// NOTES: decode has T*k of 2..512, so the kernel is a chain of latencies, not a bandwidth
// problem: only ceil(T*k/32) warps (at most 32) take part in the passes and the column sums,
// and every phase is done by all threads in parallel (no serial walk over 32 warp rows).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "align/layout_fill.cuh"
#include "align/params.hpp"
#include "align/passes.cuh"
#include "common/device.cuh"
#include "moekit/moe.hpp"

namespace moekit::kernels::align {

// ---- Decode: one warp ---------------------------------------------------------------------------
// Up to kWarpMaxAssignments (8 rounds of 32; decode's T*k) the CTA kernel's cost is its chain of
// block-wide barriers and its 1024-thread launch, not its work: ncu measured 5.0 us for 2
// assignments (E = 8) and 7.7 us for 8 (E = 256). One warp does the same passes with __syncwarp
// only: the ids of every round are loaded together, each keeps its slot (running count before the
// round + rank among its peers) in registers, the padded totals are scanned with each lane owning
// a contiguous run of ceil(E/32) experts, and the fills and the scatter follow. Same order (rounds
// ascending, lanes ascending): bitwise the CTA kernel's output. 16 rounds (512 ids) were tried
// and lost to the CTA kernel in-graph (Qwen3 T=64 6.3 -> 9.8 us, DeepSeek-V3 7.8 -> 10.5): the
// rounds are one serial chain of match_any and shared-memory updates.

template <bool kCountLoad>
__global__ void __launch_bounds__(32) align_warp_kernel(Params p) {
  dev::pdl_enter();
  __shared__ int32_t s_count[kMaxExperts];      // running counts, then the totals
  __shared__ int32_t s_start[kMaxExperts + 1];  // padded starts
  const int lane = dev::lane_id(), E = p.experts;
  const int n = int(p.num_assign);
  for (int e = lane; e < E; e += 32) s_count[e] = 0;
  int e_of[kWarpRounds], slot[kWarpRounds];
  bool out_of_range = false;
#pragma unroll
  for (int i = 0; i < kWarpRounds; ++i) {
    const int a = i * 32 + lane;
    e_of[i] = a < n ? __ldg(p.topk_ids + a) : -1;
    if (a < n && (e_of[i] < 0 || e_of[i] >= E)) {
      out_of_range = true;
      e_of[i] = -1;
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kWarpRounds; ++i) {
    if (i * 32 >= n) break;  // warp-uniform
    const unsigned peers = __match_any_sync(dev::kFullMask, e_of[i]);
    const bool leader = lane == __ffs(peers) - 1;
    slot[i] = e_of[i] >= 0 ? s_count[e_of[i]] + __popc(peers & ((1u << lane) - 1u)) : 0;
    __syncwarp();
    if (e_of[i] >= 0 && leader) s_count[e_of[i]] += __popc(peers);
    __syncwarp();
  }
  // Scan: lane L owns experts [L*per, L*per + per).
  const Blocks blocks(p.block_m);
  const int per = (E + 31) / 32, first = min(E, lane * per), last = min(E, first + per);
  int32_t mine = 0;
  for (int e = first; e < last; ++e) mine += blocks.pad(s_count[e]);
  const int32_t incl = dev::warp_inclusive_sum(mine);
  int32_t at = incl - mine;
  for (int e = first; e < last; ++e) {  // few blocks per lane (at most n in all): scattered is fine
    const int32_t end = at + blocks.pad(s_count[e]);
    s_start[e] = at;
    for (int32_t b = blocks.of(at); b < blocks.of(end); ++b) p.block_expert[b] = e;
    at = end;
  }
  const int32_t used = __shfl_sync(dev::kFullMask, incl, 31);
  if (lane == 31) *p.num_rows_padded = used;
  const bool any_out_of_range = __any_sync(dev::kFullMask, out_of_range);
  if (lane == 0) *p.status = any_out_of_range ? kStatusExpertIdOutOfRange : 0;
  // Coalesced, lane-strided: the counts, block_expert = -1 past the used blocks, and every used
  // row first set to padding (n) and then overwritten by pass 2 (a per-expert padding loop was
  // up to 15 scattered stores per expert per lane: ~1 us at 128 assignments).
  for (int e = lane; e < E; e += 32) store_expert_count<kCountLoad>(p, e, s_count[e]);
  mark_unused_blocks(p.block_expert, used, blocks, p.max_blocks, lane, 32);
  if ((reinterpret_cast<uintptr_t>(p.sorted_ids) & 15) == 0 && (used & 3) == 0) {  // 4 rows a store
    const int4 pad = make_int4(n, n, n, n);
    for (int32_t r = 4 * lane; r < used; r += 128) *reinterpret_cast<int4*>(p.sorted_ids + r) = pad;
  } else {
    for (int32_t r = lane; r < used; r += 32) p.sorted_ids[r] = n;
  }
  __syncwarp();  // orders the padding stores before pass 2's, lane to lane
#pragma unroll
  for (int i = 0; i < kWarpRounds; ++i)
    if (e_of[i] >= 0) p.sorted_ids[s_start[e_of[i]] + slot[i]] = i * 32 + lane;
}

template <bool kCountLoad>
__global__ void __launch_bounds__(kThreads) align_kernel(Params p) {
  dev::pdl_enter();
  extern __shared__ int32_t smem[];
  const int E = p.experts;
  uint32_t* s_ranks = reinterpret_cast<uint32_t*>(smem);  // [kRoundsInFlight][kThreads]
  int32_t* s_rows = smem + kRankWords;                    // [kWarps][E]
  int32_t* s_start = s_rows + kWarps * E;                 // [E + 1]
  int32_t* s_total = s_start + E + 1;                     // [E]
  __shared__ int32_t s_warp_sum[kWarps];
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id();
  const int tid = int(threadIdx.x);
  const int64_t n = p.num_assign;
  const Segment seg = warp_segment(0, n, warp);
  int32_t* my_row = s_rows + warp * E;

  int32_t total = 0;
  const Ranked ranked(s_ranks);
  const bool any_out_of_range = count_segments(p.topk_ids, E, seg, s_rows, total, ranked);
  if (tid == 0) *p.status = any_out_of_range ? kStatusExpertIdOutOfRange : 0;
  if (tid < E) {
    store_expert_count<kCountLoad>(p, tid, total);
    s_total[tid] = total;
  }

  const Blocks blocks(p.block_m);
  scan_padded_starts(total, blocks, E, s_warp_sum, s_start);
  if (tid == E - 1) *p.num_rows_padded = s_start[E];  // this thread wrote it
  __syncthreads();

  // Fill: padding rows (fewer than block_m per expert) and block_expert, a warp per expert;
  // then block_expert = -1 past the last used block.
  for (int e = warp; e < E; e += kWarps)
    fill_expert_rows(p.sorted_ids, p.block_expert, e, s_start[e], s_start[e + 1], s_total[e], blocks, int32_t(n),
                     lane);
  mark_unused_blocks(p.block_expert, s_start[E], blocks, p.max_blocks, tid, kThreads);

  // Pass 2: stable scatter of each warp's segment (its ranks kept, or walked again).
  if (warp < seg.active_warps) scatter_segment(p, E, seg, ranked, my_row, [&](int e) { return s_start[e]; });
}

// ---- Prefill: many CTAs, one cooperative launch -----------------------------------------------
// Above kAlignGridMinAssignments the one-CTA kernel is a long serial walk (Qwen3 T=16384: 131072
// assignments, 280 us). Here CTA c of G (all resident: a cooperative launch) owns the c-th
// contiguous chunk of rounds and does pass 1 over it as above; it publishes its per-expert counts
// (and its out-of-range flag) in cta_counts[c], and after one grid-wide barrier every CTA reads
// all G rows: the totals, the same scan (so every CTA knows every start), and the counts of the
// CTAs before it, which offset its warps' first slots. Fill is spread over the CTAs by expert;
// pass 2 scatters each chunk. CTAs in order, then warps, then lanes: still stable.

// Dynamic shared memory: s_ranks[kRankWords], s_rows[kWarps][E], s_start[E+1], s_total[E], s_before[E].
inline size_t grid_smem_bytes(int experts) { return size_t(kRankWords + kWarps * experts + 3 * experts + 1) * 4; }

template <bool kCountLoad>
__global__ void __launch_bounds__(kThreads) align_grid_kernel(Params p) {
  dev::pdl_enter();
  extern __shared__ int32_t smem[];
  const int E = p.experts;
  uint32_t* s_ranks = reinterpret_cast<uint32_t*>(smem);  // [kRoundsInFlight][kThreads]
  int32_t* s_rows = smem + kRankWords;                    // [kWarps][E]
  int32_t* s_start = s_rows + kWarps * E;                 // [E + 1]
  int32_t* s_total = s_start + E + 1;                     // [E]
  int32_t* s_before = s_total + E;                        // [E]
  __shared__ int32_t s_warp_sum[kWarps];
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id();
  const int tid = int(threadIdx.x);
  const int G = int(gridDim.x), c = int(blockIdx.x);
  const int64_t n = p.num_assign;
  const int64_t rounds = (n + 31) / 32, rounds_per_cta = (rounds + G - 1) / G;
  const int64_t c_begin = min(n, int64_t(c) * rounds_per_cta * 32), c_end = min(n, c_begin + rounds_per_cta * 32);
  const Segment seg = warp_segment(c_begin, c_end, warp);
  int32_t* my_row = s_rows + warp * E;

  // Pass 1 over this CTA's chunk; its counts (and its out-of-range flag) are published.
  int32_t total = 0;
  const Ranked ranked(s_ranks);
  const bool any_out_of_range = count_segments(p.topk_ids, E, seg, s_rows, total, ranked);
  int32_t* my_counts = p.cta_counts + int64_t(c) * (E + 1);
  if (tid < E) my_counts[tid] = total;
  if (tid == 0) my_counts[E] = any_out_of_range ? 1 : 0;
  __threadfence();
  cooperative_groups::this_grid().sync();

  // Every expert's total and the counts of the CTAs before this one (L2 reads: other SMs wrote).
  total = 0;
  if (tid < E) {
    int32_t before = 0;
    for (int g0 = 0; g0 < G; g0 += 16) {  // 16 loads in flight, then the sums
      int32_t v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = g0 + i < G ? __ldcg(p.cta_counts + int64_t(g0 + i) * (E + 1) + tid) : 0;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        if (g0 + i < c) before += v[i];
        total += v[i];
      }
    }
    s_total[tid] = total;
    s_before[tid] = before;
    if (c == 0) store_expert_count<kCountLoad>(p, tid, total);
  }
  if (c == 0 && tid == 0) {
    int32_t flags = 0;
    for (int g = 0; g < G; ++g) flags |= __ldcg(p.cta_counts + int64_t(g) * (E + 1) + E);
    *p.status = flags ? kStatusExpertIdOutOfRange : 0;
  }

  // The scan of the padded totals (as the one-CTA kernel), in every CTA.
  const Blocks blocks(p.block_m);
  scan_padded_starts(total, blocks, E, s_warp_sum, s_start);
  if (c == 0 && tid == E - 1) *p.num_rows_padded = s_start[E];  // this thread wrote it
  __syncthreads();

  // Fill, expert e by CTA e % G (a warp per expert), and block_expert = -1 past the end.
  for (int e = c + warp * G; e < E; e += kWarps * G)
    fill_expert_rows(p.sorted_ids, p.block_expert, e, s_start[e], s_start[e + 1], s_total[e], blocks, int32_t(n),
                     lane);
  mark_unused_blocks(p.block_expert, s_start[E], blocks, p.max_blocks, int64_t(c) * kThreads + tid,
                     int64_t(G) * kThreads);

  // Pass 2: this chunk's assignments at start + (CTAs before) + (warps before) + rank.
  if (warp < seg.active_warps)
    scatter_segment(p, E, seg, ranked, my_row, [&](int e) { return s_start[e] + s_before[e]; });
}

}  // namespace moekit::kernels::align

