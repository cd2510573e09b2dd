// align.cuh — stage 2: the expert-sorted, block_m-padded order of all T*k assignments, in one
// CTA and one launch, with no host sync.
//
// Warp w owns a contiguous segment of the assignments. Pass 1: each warp counts its segment
// per expert (a warp-private row of s_counts, match_any groups equal ids). Scan: per-expert
// totals, padded starts, and each warp's first slot per expert (warps in order). Pass 2: each
// warp walks its segment again and writes each assignment at its slot. Segments in warp order
// and ranks in lane order make the order inside an expert ascending: the sort is stable.
#pragma once

#include <cstdint>

#include "common/device.cuh"
#include "moekit/moe.hpp"

namespace moekit::kernels::align {

struct Params {
  const int32_t* topk_ids;  // [T*k]
  int32_t* sorted_ids;      // [max_rows]
  int32_t* block_expert;    // [max_blocks]
  int32_t* num_rows_padded; // [1]
  int32_t* expert_counts;   // [E]
  int32_t* status;          // [1]
  int64_t num_assign;       // T*k
  int64_t max_blocks;
  int experts, block_m;
};

constexpr int kWarps = 32;
constexpr int kThreads = 32 * kWarps;

// Dynamic shared memory: s_counts[kWarps][E] then s_start[E+1].
inline size_t smem_bytes(int experts) { return size_t(kWarps * experts + experts + 1) * 4; }

__global__ void __launch_bounds__(kThreads) align_kernel(Params p) {
  dev::pdl_enter();
  extern __shared__ int32_t smem[];
  int32_t* s_counts = smem;                         // [kWarps][E]
  int32_t* s_start = smem + kWarps * p.experts;     // [E + 1]
  __shared__ int32_t s_status;
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id();
  const int E = p.experts;
  const int64_t n = p.num_assign;
  const int64_t seg = (n + kWarps - 1) / kWarps;
  const int64_t seg_begin = min(n, warp * seg), seg_end = min(n, seg_begin + seg);
  int32_t* my_counts = s_counts + warp * E;

  if (threadIdx.x == 0) s_status = 0;
  for (int e = lane; e < E; e += 32) my_counts[e] = 0;
  __syncwarp();

  // Pass 1: per-warp histogram.
  for (int64_t base = seg_begin; base < seg_end; base += 32) {
    const int64_t a = base + lane;
    int e = -1;
    if (a < seg_end) {
      e = p.topk_ids[a];
      if (e < 0 || e >= E) {
        atomicOr(&s_status, kStatusExpertIdOutOfRange);
        e = -1;
      }
    }
    const unsigned peers = __match_any_sync(dev::kFullMask, e);
    if (e >= 0 && lane == __ffs(peers) - 1) my_counts[e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();

  // Scan: totals, padded starts (warp 0, lane-blocked), per-warp first slots.
  if (warp == 0) {
    const int per_lane = (E + 31) / 32;
    int32_t lane_sum = 0;
    for (int i = 0; i < per_lane; ++i) {
      const int e = lane * per_lane + i;
      if (e >= E) break;
      int32_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += s_counts[w * E + e];
      p.expert_counts[e] = total;
      s_start[e] = (total + p.block_m - 1) / p.block_m * p.block_m;  // padded, for now
      lane_sum += s_start[e];
    }
    int32_t incl = lane_sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int32_t v = __shfl_up_sync(dev::kFullMask, incl, off);
      if (lane >= off) incl += v;
    }
    int32_t run = incl - lane_sum;
    for (int i = 0; i < per_lane; ++i) {
      const int e = lane * per_lane + i;
      if (e >= E) break;
      const int32_t padded = s_start[e];
      s_start[e] = run;
      run += padded;
    }
    if (lane == 31) {
      s_start[E] = incl;
      *p.num_rows_padded = incl;
    }
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < E; e += kThreads) {
    const int32_t start = s_start[e], end = s_start[e + 1];
    int32_t slot = start;
    for (int w = 0; w < kWarps; ++w) {
      const int32_t c = s_counts[w * E + e];
      s_counts[w * E + e] = slot;
      slot += c;
    }
    for (int32_t r = slot; r < end; ++r) p.sorted_ids[r] = int32_t(n);  // padding rows
    for (int32_t r = start; r < end; r += p.block_m) p.block_expert[r / p.block_m] = e;
  }
  for (int64_t b = s_start[E] / p.block_m + threadIdx.x; b < p.max_blocks; b += kThreads)
    p.block_expert[b] = -1;
  __syncthreads();

  // Pass 2: stable scatter of each warp's segment.
  for (int64_t base = seg_begin; base < seg_end; base += 32) {
    const int64_t a = base + lane;
    int e = -1;
    if (a < seg_end) {
      e = p.topk_ids[a];
      if (e < 0 || e >= E) e = -1;
    }
    const unsigned peers = __match_any_sync(dev::kFullMask, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0) p.sorted_ids[my_counts[e] + rank] = int32_t(a);
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) my_counts[e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  if (threadIdx.x == 0) *p.status = s_status;
}

}  // namespace moekit::kernels::align
