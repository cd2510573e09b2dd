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
// Each kernel is instantiated twice: kCountLoad adds the call's counts to the caller's load
// counter (store_expert_count), and without it the kernel is the one it was before the counter.
//
// NOTES: decode has T*k of 2..512, so the kernel is a chain of latencies, not a bandwidth
// problem: only ceil(T*k/32) warps (at most 32) take part in the passes and the column sums,
// and every phase is done by all threads in parallel (no serial walk over 32 warp rows).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "align/params.hpp"
#include "align/layout_fill.cuh"
#include "common/device.cuh"
#include "moekit/moe.hpp"

namespace moekit::kernels::align {


constexpr int kWarps = 32;
constexpr int kThreads = 32 * kWarps;
// Rounds of 32 ids a warp loads before it processes them (in order): their loads overlap when a
// segment is longer than one round (T*k > 1024).
constexpr int kRoundsInFlight = 4;
// Pass 1's ranks of a batch, one word a thread a round (Ranked): their shared memory, in words.
constexpr int kRankWords = kRoundsInFlight * kThreads;
static_assert(kThreads >= kMaxExperts, "align: a thread per expert in the totals and the scan");

// Dynamic shared memory: s_ranks[kRankWords], s_rows[kWarps][E], s_start[E+1], s_total[E].
inline size_t smem_bytes(int experts) { return size_t(kRankWords + kWarps * experts + 2 * experts + 1) * 4; }

// Expert e's count of this call (real assignments: padding and out-of-range ids are not in it),
// stored by the one thread that holds it, which also adds it to the opt-in load counter. NOTES:
// one thread per expert, so no two threads of a call touch one counter; the add is still a
// 64-bit integer atomic, a RED the thread does not wait for (a load-add-store would put a global
// load's latency on decode's critical path), which also keeps calls on two streams that share a
// counter exact. Integer addition is exact and associative: the total is deterministic in any
// order. kCountLoad = false leaves the plain store, so that kernel's code is unchanged.
template <bool kCountLoad>
__device__ __forceinline__ void store_expert_count(const Params& p, int e, int32_t count) {
  p.expert_counts[e] = count;
  if constexpr (kCountLoad)
    atomicAdd(reinterpret_cast<unsigned long long*>(p.expert_load) + e, static_cast<unsigned long long>(count));
}

// The warp's segment of the assignments [begin, end), as rounds of 32; empty for inactive warps.
// ranked_once (the same in every warp of the CTA): every segment is at most kRoundsInFlight rounds,
// one batch of loads, so pass 1 keeps each id's slot (Ranked) and pass 2 only stores. It holds
// wherever the planner sends align: the CTA kernel's 4096 ids at most, the grid kernel's 4096 a
// CTA while its resident CTAs suffice (132 on an H100 or H200: T·k up to 540,672); past that both
// walk the segment again.
struct Segment {
  int64_t begin, end;
  int active_warps;
  bool ranked_once;
};
__device__ __forceinline__ Segment warp_segment(int64_t begin, int64_t end, int warp) {
  const int64_t n = end - begin;
  const int64_t rounds = (n + 31) / 32;
  const int64_t rounds_per_warp = (rounds + kWarps - 1) / kWarps;
  Segment s;
  s.active_warps = rounds == 0 ? 0 : int((rounds + rounds_per_warp - 1) / rounds_per_warp);
  s.begin = begin + min(n, int64_t(warp) * rounds_per_warp * 32);
  s.end = begin + min(n, s.begin - begin + rounds_per_warp * 32);
  s.ranked_once = rounds_per_warp <= kRoundsInFlight;
  return s;
}

// Pass 1's ranks of one batch of rounds, kept for pass 2 (Segment::ranked_once): round i of this
// thread as (slot << kSlotShift) | (e + 1), slot relative to the warp's first slot of expert e, 0
// for no assignment (past the end, or an id out of range), in shared memory: words[i][thread],
// each thread its own words (no barrier), which the column sums' 32 live loads leave no registers
// for (held in registers, ptxas spilled them at the 64 a thread of a 1024-thread CTA). NOTES: pass
// 2 used to walk the segment again — the same match_any per round and its shared-memory count
// updates, a serial chain per round that costs the most where a round's 32 ids name ~28 different
// experts (E >= 128); with the slots kept it is two shared-memory loads and a store per id.
constexpr int kSlotShift = 10;
static_assert(kMaxExperts + 1 < (1 << kSlotShift) && 32 * kRoundsInFlight < (1 << (32 - kSlotShift)),
              "align: an expert id + 1 and a warp's slot share one 32-bit word");
struct Ranked {
  uint32_t* words;  // [kRoundsInFlight][kThreads]
  __device__ __forceinline__ explicit Ranked(uint32_t* s_ranks) : words(s_ranks) {
#pragma unroll
    for (int i = 0; i < kRoundsInFlight; ++i) words[i * kThreads + int(threadIdx.x)] = 0;
  }
  __device__ __forceinline__ void keep(int i, int e, int32_t slot) const {
    words[i * kThreads + int(threadIdx.x)] = (uint32_t(slot) << kSlotShift) | uint32_t(e + 1);
  }
  // Pass 2 of a ranked_once segment: assignment seg.begin + 32i + lane at place(e) + its slot,
  // place(e) its expert's first slot for this warp.
  template <class Place>
  __device__ __forceinline__ void scatter(int32_t* sorted_ids, const Segment& seg, Place&& place) const {
    const int lane = dev::lane_id();
    uint32_t w[kRoundsInFlight];
#pragma unroll
    for (int i = 0; i < kRoundsInFlight; ++i) w[i] = words[i * kThreads + int(threadIdx.x)];
#pragma unroll
    for (int i = 0; i < kRoundsInFlight; ++i) {
      if (w[i] == 0) continue;
      const int e = int(w[i] & ((1u << kSlotShift) - 1u)) - 1;
      sorted_ids[place(e) + int32_t(w[i] >> kSlotShift)] = int32_t(seg.begin + i * 32 + lane);
    }
  }
};

// Walks the segment in rounds of 32, kRoundsInFlight rounds' loads at a time. For each round:
// every lane's expert e (-1: past the end or out of range), peers (lanes of the round with the
// same e), rank (peers below this lane), and row[e] before the round; then the peers' leader
// adds their count to row[e]. visit(a, e, row_before + rank, i) is called for every valid a, i
// its round's index in its batch (a compile-time constant once unrolled: Ranked::keep).
template <class Visit>
__device__ __forceinline__ bool walk_segment(const int32_t* __restrict__ topk_ids, int experts, const Segment& seg,
                                             int32_t* row, Visit visit) {
  const int lane = dev::lane_id();
  bool out_of_range = false;
  for (int64_t base = seg.begin; base < seg.end; base += 32 * kRoundsInFlight) {
    int e[kRoundsInFlight];
#pragma unroll
    for (int i = 0; i < kRoundsInFlight; ++i) {
      const int64_t a = base + i * 32 + lane;
      e[i] = -1;
      if (a < seg.end) {
        e[i] = __ldg(topk_ids + a);
        if (e[i] < 0 || e[i] >= experts) {
          out_of_range = true;
          e[i] = -1;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRoundsInFlight; ++i) {
      if (base + i * 32 >= seg.end) break;  // warp-uniform
      const unsigned peers = __match_any_sync(dev::kFullMask, e[i]);
      const int rank = __popc(peers & ((1u << lane) - 1u));
      const bool leader = lane == __ffs(peers) - 1;
      if (e[i] >= 0) visit(base + i * 32 + lane, e[i], row[e[i]] + rank, i);
      __syncwarp();
      if (e[i] >= 0 && leader) row[e[i]] += __popc(peers);
      __syncwarp();
    }
  }
  return out_of_range;
}

// Pass 1 and the column sums, by every thread of the CTA: each active warp counts its segment
// per expert into its row of s_rows (the other rows are never read), keeping its ids' slots in
// `ranked` where seg.ranked_once; then thread e (< E) sums column e into `total` and leaves in
// s_rows[w][e] warp w's first slot relative to this CTA's share of expert e (the loads are
// independent, so they go out together). The barrier that ends pass 1 also ORs the out-of-range
// flags (no shared flag to reset); the result is that OR.
__device__ __forceinline__ bool count_segments(const int32_t* __restrict__ topk_ids, int E, const Segment& seg,
                                               int32_t* s_rows, int32_t& total, const Ranked& ranked) {
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id(), tid = int(threadIdx.x);
  int32_t* my_row = s_rows + warp * E;
  bool out_of_range = false;
  if (warp < seg.active_warps) {
    for (int e = lane; e < E; e += 32) my_row[e] = 0;
    __syncwarp();
    if (seg.ranked_once)
      out_of_range = walk_segment(topk_ids, E, seg, my_row,
                                  [&](int64_t, int e, int32_t slot, int i) { ranked.keep(i, e, slot); });
    else
      out_of_range = walk_segment(topk_ids, E, seg, my_row, [](int64_t, int, int32_t, int) {});
  }
  const bool any_out_of_range = __syncthreads_or(out_of_range);
  total = 0;
  if (tid < E) {
    // Half the rows' loads at a time: all 32 in flight took the registers pass 2 needs.
    constexpr int kHalf = kWarps / 2;
#pragma unroll
    for (int w0 = 0; w0 < kWarps; w0 += kHalf) {
      int32_t c[kHalf];
#pragma unroll
      for (int j = 0; j < kHalf; ++j) c[j] = w0 + j < seg.active_warps ? s_rows[(w0 + j) * E + tid] : 0;
#pragma unroll
      for (int j = 0; j < kHalf; ++j) {
        if (w0 + j < seg.active_warps) s_rows[(w0 + j) * E + tid] = total;
        total += c[j];
      }
    }
  }
  return any_out_of_range;
}

// Scan: s_start[e] = exclusive prefix of the block_m-padded totals (thread e holds total e; 0
// past E), s_start[E] = their sum, written by thread E-1. Warp scans, then every warp scans the
// warp sums itself (one barrier inside; the caller's next barrier publishes s_start).
__device__ __forceinline__ void scan_padded_starts(int32_t total, Blocks blocks, int E, int32_t* s_warp_sum,
                                                   int32_t* s_start) {
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id(), tid = int(threadIdx.x);
  const int32_t padded = blocks.pad(total);
  const int32_t incl = dev::warp_inclusive_sum(padded);
  if (lane == 31) s_warp_sum[warp] = incl;
  __syncthreads();
  const int32_t warp_sum = s_warp_sum[lane];
  const int32_t warps_incl = dev::warp_inclusive_sum(warp_sum);
  const int32_t warp_offset = __shfl_sync(dev::kFullMask, warps_incl - warp_sum, warp);
  if (tid < E) s_start[tid] = warp_offset + incl - padded;
  if (tid == E - 1) s_start[E] = warp_offset + incl;
}

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
  if (warp < seg.active_warps) {
    if (seg.ranked_once)
      ranked.scatter(p.sorted_ids, seg, [&](int e) { return s_start[e] + my_row[e]; });
    else
      walk_segment(p.topk_ids, E, seg, my_row, [&](int64_t a, int e, int32_t slot, int) {
        p.sorted_ids[s_start[e] + slot] = int32_t(a);
      });
  }
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
  if (warp < seg.active_warps) {
    if (seg.ranked_once)
      ranked.scatter(p.sorted_ids, seg, [&](int e) { return s_start[e] + s_before[e] + my_row[e]; });
    else
      walk_segment(p.topk_ids, E, seg, my_row, [&](int64_t a, int e, int32_t slot, int) {
        p.sorted_ids[s_start[e] + s_before[e] + slot] = int32_t(a);
      });
  }
}

}  // namespace moekit::kernels::align

