// passes.cuh — the parts stage 2's kernels (align.cuh) are composed of: the CTA geometry and its
// shared memory, each warp's segment of the assignments, the walk over a segment's rounds (pass 1
// counts and ranks, pass 2 stores), the kept ranks, the column sums and the scan of the padded
// totals, and the per-expert count store. align.cuh's header says how the passes fit together.
#pragma once

#include <cstdint>

#include "align/params.hpp"
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

// Pass 2 of an active warp: its segment's assignments into sorted_ids, each at first(e) + its
// slot in expert e, first(e) where this CTA's share of expert e starts: from the ranks kept in
// pass 1 (Ranked) where seg.ranked_once, else by walking the segment again (my_row: the warp's
// first slot of each expert, from the column sums).
template <class First>
__device__ __forceinline__ void scatter_segment(const Params& p, int E, const Segment& seg, const Ranked& ranked,
                                                int32_t* my_row, First&& first) {
  if (seg.ranked_once)
    ranked.scatter(p.sorted_ids, seg, [&](int e) { return first(e) + my_row[e]; });
  else
    walk_segment(p.topk_ids, E, seg, my_row, [&](int64_t a, int e, int32_t slot, int) {
      p.sorted_ids[first(e) + slot] = int32_t(a);
    });
}

}  // namespace moekit::kernels::align
