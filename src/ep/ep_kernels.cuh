// ep_kernels.cuh — the device side of an expert-parallel step (moekit/ep_nccl.hpp): the slot of
// every assignment, the packing of the send buffer, the receiver's block table, and the opt-in
// load counter's per-expert counts of this rank's assignments. The send order is align's
// (block_m = 1 over the R*S slots); the combine is combine's, gathered (combine/combine_launch.hpp).
// Each kernel is the device twin of a host layout of ep.hpp.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "align/layout_fill.cuh"
#include "common/device.cuh"
#include "moekit/moe.hpp"

namespace moekit::kernels::ep {

// ---- route: the slot serving each assignment (internal::route_unchecked's rule) -------------
struct RouteParams {
  const int32_t* topk_ids;         // [A]
  const int32_t* replica_offsets;  // [E+1]
  const int32_t* replica_slots;    // [E + replicas]
  int32_t* slot;                   // [A]: -1 for an id outside [0, E) (align then flags it)
  int32_t* inv;                    // [A]: -1 where slot is -1 (the assignment is skipped; pack sets the rest)
  int64_t num_assign, token_offset;
  int topk, experts, slots_per_rank, home_rank;
  bool prefer_home;
};

constexpr int kRouteThreads = 256;

__global__ void __launch_bounds__(kRouteThreads) route_kernel(RouteParams p) {
  dev::pdl_enter();
  const int64_t a = int64_t(blockIdx.x) * kRouteThreads + threadIdx.x;
  if (a >= p.num_assign) return;
  const int32_t e = p.topk_ids[a];
  int32_t s = -1;
  if (e >= 0 && e < p.experts) {
    const int32_t begin = p.replica_offsets[e], n = p.replica_offsets[e + 1] - begin;
    const int64_t token = p.token_offset + a / p.topk;
    s = p.replica_slots[begin + int32_t(token % n)];
    if (p.prefer_home && n > 1)
      for (int32_t i = 0; i < n; ++i)
        if (p.replica_slots[begin + i] / p.slots_per_rank == p.home_rank) {
          s = p.replica_slots[begin + i];
          break;
        }
  }
  p.slot[a] = s;
  if (s < 0) p.inv[a] = -1;  // never packed: combine reads it as absent
}

// Exclusive prefix of counts[0..n) into s_start[0..n], s_start[n] = total (n <= 1024), by the
// first warp: each lane sums a contiguous chunk, then one warp scan. Caller syncs after.
__device__ __forceinline__ void warp_exclusive_scan(const int32_t* counts, int n, int32_t* s_start) {
  const int lane = dev::lane_id();
  const int per = (n + 31) / 32, begin = min(n, lane * per), end = min(n, begin + per);
  int32_t sum = 0;
  for (int i = begin; i < end; ++i) sum += counts[i];
  const int32_t incl = dev::warp_inclusive_sum(sum);
  int32_t at = incl - sum;
  for (int i = begin; i < end; ++i) s_start[i] = at, at += counts[i];
  if (lane == 31) s_start[n] = incl;
}

// ---- load: this rank's assignments per global expert, into the caller's counter --------------
// Expert e's assignments from this rank are the send-order counts of the slots that hold it
// (align's counts over the R*S slots), summed over its replicas in slot order. Thread e adds them
// to expert_load[e]: one thread per expert, a 64-bit integer RED (align.cuh, store_expert_count,
// says why an atomic with one writer per element). Launched only when the caller gives a counter.
struct LoadParams {
  const int32_t* slot_counts;      // [R*S]: align's expert_counts over the slots
  const int32_t* replica_offsets;  // [E+1]
  const int32_t* replica_slots;    // [E + replicas]
  int64_t* expert_load;            // [E]
  int experts;
};

__global__ void __launch_bounds__(kMaxExperts) load_kernel(LoadParams p) {
  dev::pdl_enter();
  const int e = int(threadIdx.x);
  if (e >= p.experts) return;
  int64_t count = 0;
  for (int32_t i = p.replica_offsets[e]; i < p.replica_offsets[e + 1]; ++i) count += p.slot_counts[p.replica_slots[i]];
  atomicAdd(reinterpret_cast<unsigned long long*>(p.expert_load) + e, static_cast<unsigned long long>(count));
}

// ---- pack: rows into the send buffer in align's order ----------------------------------------
// Prefill: send row i is the i-th assignment of the send order. Decode: the destination's
// position in its message, row dest*capacity + pos; a position >= capacity is counted in
// *overflow, and its assignment's result is absent (inv = -1).
struct PackParams {
  const __nv_bfloat16* x;      // [T, H]
  const float* topk_weights;   // [A]
  const int32_t* slot;         // [A]
  const int32_t* order;        // [A]: align's sorted_ids (block_m = 1: no padding)
  const int32_t* slot_counts;  // [R*S]: align's expert_counts
  __nv_bfloat16* send_x;       // [rows, H]
  float* send_w;               // [rows]
  int32_t* inv;                // [A]: send row of assignment a (its result returns to the same row), -1
  int32_t* sent_counts;        // [R*S] decode: rows of each slot that fit; nullptr in prefill
  int32_t* overflow;           // [1] decode: assignments beyond capacity
  int64_t hidden, capacity;    // capacity 0: prefill
  int topk, slots, slots_per_rank;
};

constexpr int kPackThreads = 256;

__global__ void __launch_bounds__(kPackThreads) pack_kernel(PackParams p) {
  dev::pdl_enter();
  __shared__ int32_t s_start[kMaxExperts + 1];
  __shared__ int32_t s_overflow;
  if (threadIdx.x < 32) warp_exclusive_scan(p.slot_counts, p.slots, s_start);
  if (threadIdx.x == 0) s_overflow = 0;
  __syncthreads();
  const bool decode = p.capacity > 0;
  if (decode && blockIdx.x == 0)
    for (int s = int(threadIdx.x); s < p.slots; s += kPackThreads) {
      const int64_t first = s_start[s] - s_start[s / p.slots_per_rank * p.slots_per_rank];  // position in its message
      const int64_t room = p.capacity - first;
      p.sent_counts[s] = int32_t(room <= 0 ? 0 : (room < p.slot_counts[s] ? room : p.slot_counts[s]));
    }
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id();
  const int64_t vecs = p.hidden / 8;
  // align wrote order[0, valid) only: assignments with an out-of-range id are not in it.
  const int64_t valid = s_start[p.slots];
  int32_t lost = 0;
  for (int64_t i = int64_t(blockIdx.x) * (kPackThreads / 32) + warp; i < valid;
       i += int64_t(gridDim.x) * (kPackThreads / 32)) {
    const int32_t a = p.order[i];
    int64_t row = i;
    if (decode) {
      const int32_t s = p.slot[a];
      const int64_t dest = s / p.slots_per_rank, pos = i - s_start[dest * p.slots_per_rank];
      row = pos < p.capacity ? dest * p.capacity + pos : -1;
    }
    if (row < 0) {
      if (lane == 0) {
        p.inv[a] = -1;
        ++lost;
      }
      continue;
    }
    const uint4* src = reinterpret_cast<const uint4*>(p.x + int64_t(a / p.topk) * p.hidden);
    uint4* dst = reinterpret_cast<uint4*>(p.send_x + row * p.hidden);
    for (int64_t v = lane; v < vecs; v += 32) dst[v] = src[v];
    if (lane == 0) {
      p.send_w[row] = p.topk_weights[a];
      p.inv[a] = int32_t(row);
    }
  }
  if (lost) atomicAdd(&s_overflow, lost);
  __syncthreads();
  if (threadIdx.x == 0 && s_overflow) atomicAdd(p.overflow, s_overflow);
}

// ---- the receiver's block table for its S local experts -------------------------------------
// counts [R][S] as received. Rows of (source s, expert l) sit at base(s, l) + i: prefill packs
// the sources back to back; decode's source s begins at s*capacity. The order is plan_receive's
// (expert l, then source, then arrival); each expert padded to block_m with `sentinel` rows, as
// align writes it (sorted_ids, block_expert, num_rows_padded, expert_counts).
struct ReceiveParams {
  const int32_t* counts;         // [R*S]
  int32_t* sorted_ids;           // [max_rows]
  int32_t* block_expert;         // [max_blocks]
  int32_t* num_rows_padded;      // [1]
  int32_t* expert_counts;        // [S]
  int64_t max_blocks, capacity;  // capacity 0: prefill (packed)
  int32_t sentinel;              // the local plan's T*k: a padding row
  int ranks, slots_per_rank, block_m;
};

constexpr int kReceiveThreads = 1024;
static_assert(kReceiveThreads >= kMaxExperts, "receive_layout_kernel: one thread per (source, expert) pair");

__global__ void __launch_bounds__(kReceiveThreads) receive_layout_kernel(ReceiveParams p) {
  dev::pdl_enter();
  const int R = p.ranks, S = p.slots_per_rank, n = R * S;
  __shared__ int32_t s_count[kMaxExperts], s_base[kMaxExperts + 1];     // per (s, l)
  __shared__ int32_t s_padded[kMaxExperts], s_estart[kMaxExperts + 1];  // per l
  __shared__ int32_t s_total[kMaxExperts];
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = dev::lane_id();
  const align::Blocks blocks(p.block_m);
  for (int i = tid; i < n; i += kReceiveThreads) s_count[i] = p.counts[i];
  __syncthreads();
  if (warp == 0) warp_exclusive_scan(s_count, n, s_base);  // packed (s, l) order: prefill's base
  if (tid < S) {
    int32_t t = 0;
    for (int s = 0; s < R; ++s) t += s_count[s * S + tid];
    s_total[tid] = t;
    s_padded[tid] = blocks.pad(t);
    p.expert_counts[tid] = t;
  }
  __syncthreads();
  if (warp == 0) warp_exclusive_scan(s_padded, S, s_estart);
  __syncthreads();
  if (p.capacity > 0) {  // decode: source chunks at fixed offsets (n <= 1024: one entry per thread)
    const int32_t based = tid < n ? int32_t((tid / S) * p.capacity) + (s_base[tid] - s_base[tid / S * S]) : 0;
    __syncthreads();
    if (tid < n) s_base[tid] = based;
  }
  if (tid == 0) *p.num_rows_padded = s_estart[S];
  __syncthreads();
  // A warp per (expert, source) segment; its rows follow the earlier sources' rows of the expert.
  for (int seg = warp; seg < n; seg += kReceiveThreads / 32) {
    const int l = seg / R, s = seg % R;
    int32_t at = s_estart[l];
    for (int q = 0; q < s; ++q) at += s_count[q * S + l];
    const int32_t base = s_base[s * S + l];
    for (int32_t i = lane; i < s_count[s * S + l]; i += 32) p.sorted_ids[at + i] = base + i;
  }
  for (int l = warp; l < S; l += kReceiveThreads / 32)
    align::fill_expert_rows(p.sorted_ids, p.block_expert, l, s_estart[l], s_estart[l + 1], s_total[l], blocks,
                            p.sentinel, lane);
  align::mark_unused_blocks(p.block_expert, s_estart[S], blocks, p.max_blocks, tid, kReceiveThreads);
}

}  // namespace moekit::kernels::ep
