// layout_fill.cuh — the fill of an aligned layout, shared by every kernel that writes one (align's
// one-CTA and grid kernels, the EP receive layout): once an expert's rows [start, end) are placed,
// its rows past its `real` assignments hold the padding sentinel and its blocks name it; blocks
// past the last used one are -1. The assignments themselves are written by each kernel's own
// scatter.
#pragma once

#include <cstdint>

namespace moekit::kernels::align {

// Rows and whole blocks of block_m rows, for row counts >= 0: shifts when block_m is a power of
// two (every compiled config, and the EP send order's block_m = 1), unsigned division otherwise.
// ncu: in the warp align's serial per-lane walk over its experts, the signed divisions were ~100
// of the ~250 instructions per expert (Qwen3 T=16: 1,025 instructions, 10,586 cycles).
struct Blocks {
  uint32_t m, shift;
  bool pow2;
  __device__ __forceinline__ explicit Blocks(int block_m)
      : m(uint32_t(block_m)), shift(0), pow2((block_m & (block_m - 1)) == 0) {
#if defined(__CUDA_ARCH__)  // the host pass parses this body too and has no __ffs
    shift = uint32_t(__ffs(block_m) - 1);
#endif
  }
  // Blocks wholly inside `rows` rows (rows / block_m).
  __device__ __forceinline__ int32_t of(int32_t rows) const {
    return int32_t(pow2 ? uint32_t(rows) >> shift : uint32_t(rows) / m);
  }
  // `rows` rounded up to whole blocks.
  __device__ __forceinline__ int32_t pad(int32_t rows) const {
    const uint32_t r = uint32_t(rows) + m - 1;
    return int32_t(pow2 ? (r >> shift) << shift : r / m * m);
  }
};

// One warp (lane 0..31), lane-strided stores: expert e's padding rows and block_expert entries.
__device__ __forceinline__ void fill_expert_rows(int32_t* sorted_ids, int32_t* block_expert, int e, int32_t start,
                                                 int32_t end, int32_t real, Blocks blocks, int32_t sentinel, int lane) {
  for (int32_t r = start + real + lane; r < end; r += 32) sorted_ids[r] = sentinel;
  for (int32_t b = blocks.of(start) + lane; b < blocks.of(end); b += 32) block_expert[b] = e;
}

// block_expert = -1 from the first unused block (used_rows / block_m) to max_blocks; this thread
// takes entries index, index + stride, ...
__device__ __forceinline__ void mark_unused_blocks(int32_t* block_expert, int32_t used_rows, Blocks blocks,
                                                   int64_t max_blocks, int64_t index, int64_t stride) {
  for (int64_t b = blocks.of(used_rows) + index; b < max_blocks; b += stride) block_expert[b] = -1;
}

}  // namespace moekit::kernels::align
