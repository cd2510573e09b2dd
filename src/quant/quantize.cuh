// quantize.cuh — FP8 quantization kernels (docs/design.md, "FP8"): x [T, H] bf16 to e4m3 with one
// scale per token row and 128 columns, and bf16 weights to e4m3 with one scale per 128 x 128 block.
// The arithmetic is common/fp8.cuh's (bitwise ref::quantize_tokens / ref::quantize_weight_blocks);
// the amax is a max, so the order the lanes combine in does not change a bit: deterministic.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/canon.hpp"
#include "common/device.cuh"
#include "common/fp8.cuh"
#include "quant/group.cuh"

namespace moekit::kernels::quant {

// ---- tokens: a half warp per (row, 128-column group) ----------------------------------------
// Memory bound (2 B read, 1 B written per element): each lane moves full 16-byte vectors, and the
// 16 lanes of a group reduce its amax with 4 shuffles. A partial last group (H % 128, a multiple
// of 16) leaves lanes past H idle; they add 0 to the amax, which changes no max of |v|.
struct TokenParams {
  const __nv_bfloat16* x;  // [T, H]
  uint8_t* q;              // [T, H] e4m3
  float* scale;            // [T, groups]
  int64_t tokens, hidden, groups;  // groups = ceil(H / 128)
};

inline constexpr int kTokenThreads = 256;
inline constexpr int kTokenGroupsPerCta = kTokenThreads / kThreadsPerGroupRow;

__global__ void __launch_bounds__(kTokenThreads) quantize_tokens_kernel(TokenParams p) {
  dev::pdl_enter();
  // Flat group index = row * groups + g, also the scale's index. No lane returns early: every
  // lane takes part in the shuffles.
  const int64_t group = int64_t(blockIdx.x) * kTokenGroupsPerCta + threadIdx.x / kThreadsPerGroupRow;
  const int sub = int(threadIdx.x % kThreadsPerGroupRow);
  const bool group_live = group < p.tokens * p.groups;
  const int64_t row = group_live ? group / p.groups : 0;
  const int64_t col = (group - row * p.groups) * kGroup + sub * kColsPerThread;
  const bool live = group_live && col < p.hidden;
  const int64_t at = row * p.hidden + col;  // 64-bit: T * H exceeds 2^31 in large prefills

  float v[kColsPerThread] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (live) unpack_bf16x8(*reinterpret_cast<const uint4*>(p.x + at), v);
  const float amax = dev::lanes_amax<kThreadsPerGroupRow>(amax_of(0.0f, v));
  const dev::Fp8Scale s = dev::fp8_scale(amax);
  if (live) *reinterpret_cast<uint2*>(p.q + at) = quantize_x8(v, s.inv);
  if (group_live && sub == 0) p.scale[group] = s.scale;
}

// ---- weights: a CTA per 128 x 128 block -----------------------------------------------------
// 16 threads a row (8 columns each), 16 rows a pass, 8 passes; the block's bf16 stays in
// registers between the two passes (amax, then quantize), so it is read once. Rows and columns
// past the matrix's edge (a partial block) are skipped and add 0 to the amax.
struct WeightParams {
  const __nv_bfloat16* w;  // [P, R, C]
  uint8_t* q;              // [P, R, C] e4m3
  float* scale;            // [P, row_blocks, col_blocks]
  int64_t rows, cols, row_blocks, col_blocks;
};

inline constexpr int kWeightThreads = 256;
inline constexpr int kWeightRowsPerPass = kWeightThreads / kThreadsPerGroupRow;  // 16
inline constexpr int kWeightPasses = kGroup / kWeightRowsPerPass;                // 8

__global__ void __launch_bounds__(kWeightThreads) quantize_weights_kernel(WeightParams p) {
  dev::pdl_enter();
  const int64_t block = blockIdx.x;  // (projection, row block, column block), the scale's index
  const int64_t cb = block % p.col_blocks, prb = block / p.col_blocks;
  const int64_t rb = prb % p.row_blocks, proj = prb / p.row_blocks;
  const int64_t col = cb * kGroup + int64_t(threadIdx.x % kThreadsPerGroupRow) * kColsPerThread;
  const int64_t row0 = rb * kGroup + threadIdx.x / kThreadsPerGroupRow;
  const int64_t first = proj * p.rows * p.cols + col;  // row r's element at first + r * cols

  uint4 raw[kWeightPasses];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kWeightPasses; ++i) {
    const int64_t r = row0 + i * kWeightRowsPerPass;
    raw[i] = make_uint4(0, 0, 0, 0);  // bf16 zeros
    if (r < p.rows && col < p.cols) raw[i] = *reinterpret_cast<const uint4*>(p.w + first + r * p.cols);
    float v[kColsPerThread];
    unpack_bf16x8(raw[i], v);
    amax = amax_of(amax, v);
  }
  __shared__ float warp_amax[kWeightThreads / 32];
  amax = dev::lanes_amax<32>(amax);
  if (dev::lane_id() == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_amax[0];
#pragma unroll
  for (int i = 1; i < kWeightThreads / 32; ++i) amax = dev::max_nan(amax, warp_amax[i]);
  const dev::Fp8Scale s = dev::fp8_scale(amax);

#pragma unroll
  for (int i = 0; i < kWeightPasses; ++i) {
    const int64_t r = row0 + i * kWeightRowsPerPass;
    if (r < p.rows && col < p.cols) {
      float v[kColsPerThread];
      unpack_bf16x8(raw[i], v);
      *reinterpret_cast<uint2*>(p.q + first + r * p.cols) = quantize_x8(v, s.inv);
    }
  }
  if (threadIdx.x == 0) p.scale[block] = s.scale;
}

}  // namespace moekit::kernels::quant
