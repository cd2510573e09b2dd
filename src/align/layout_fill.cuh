// layout_fill.cuh — the fill of an aligned layout, shared by every kernel that writes one (align's
// one-CTA and grid kernels, the EP receive layout): once an expert's rows [start, end) are placed,
// its rows past its `real` assignments hold the padding sentinel and its blocks name it; blocks
// past the last used one are -1. The assignments themselves are written by each kernel's own
// scatter.
#pragma once

#include <cstdint>

namespace moekit::kernels::align {

// One warp (lane 0..31), lane-strided stores: expert e's padding rows and block_expert entries.
__device__ __forceinline__ void fill_expert_rows(int32_t* sorted_ids, int32_t* block_expert, int e, int32_t start,
                                                 int32_t end, int32_t real, int block_m, int32_t sentinel, int lane) {
  for (int32_t r = start + real + lane; r < end; r += 32) sorted_ids[r] = sentinel;
  for (int32_t b = start / block_m + lane; b < end / block_m; b += 32) block_expert[b] = e;
}

// block_expert = -1 from the first unused block (used_rows / block_m) to max_blocks; this thread
// takes entries index, index + stride, ...
__device__ __forceinline__ void mark_unused_blocks(int32_t* block_expert, int32_t used_rows, int block_m,
                                                   int64_t max_blocks, int64_t index, int64_t stride) {
  for (int64_t b = used_rows / block_m + index; b < max_blocks; b += stride) block_expert[b] = -1;
}

}  // namespace moekit::kernels::align
