// loaders.cuh — how the backward's GEMMs fill a ring slot (tile.cuh): each thread's 16-byte chunks
// of one K-tile of an operand, from global memory into the swizzled layout the fragments read.
//   KRows  — a K-major tile: each tile row has one source row (fixed for the work item: a gathered
//            token row of x or dy, a sorted row of dh, a weight row), read along K.
//   MNRows — an MN-major tile: each of the 64 K rows comes from its own source row (a weight row,
//            or the K-th sorted row of an expert), read along M or N from the tile's first column.
//   MNRowsF32Split — MNRows over f32 rows, each stored as its bf16 high or low part (the router's
//            f32 w_gate): plain loads and shared stores, converted on the way.
// A chunk with no source, past K or past the last column is zero-filled (cp.async source size 0):
// padding rows and tails add exact zeros. Dimensions are multiples of 8, so a chunk is wholly in
// or out.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backward/tile.cuh"
#include "common/async_copy.cuh"

namespace moekit::kernels::backward {

// A K-major tile of R rows, loaded by Threads threads. row(r) gives tile row r's source at k = 0
// (null: zero). Columns past k_dim are zero; with k_wrap < k_dim, column k >= k_wrap reads the row
// at k - k_wrap (the router's d_logits rows read twice, once per part of an f32 w_gate).
template <int R, int Threads = kThreads>
struct KRows {
  static constexpr int kIters = R * kChunks / Threads;
  static_assert(R * kChunks % Threads == 0, "the tile's chunks split evenly over the threads");
  const bf16* src[kIters];
  const bf16* any;  // a valid address for zero-filled chunks (nothing is read from it)
  int64_t k_dim, k_wrap;
  int tid;

  template <class RowFn>
  __device__ __forceinline__ KRows(RowFn row, const bf16* any_, int64_t k_dim_, int64_t k_wrap_, int tid_)
      : any(any_), k_dim(k_dim_), k_wrap(k_wrap_), tid(tid_) {
#pragma unroll
    for (int i = 0; i < kIters; ++i) src[i] = row((tid + i * Threads) / kChunks);
  }

  __device__ __forceinline__ void load(bf16* tile, int64_t kt) const {
    const int c = tid % kChunks;  // the same chunk column for all of this thread's rows
    const int64_t k = kt * kTileK + c * 8;
    const int64_t col = k >= k_wrap ? k - k_wrap : k;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int r = (tid + i * Threads) / kChunks;
      const bool ok = src[i] != nullptr && k < k_dim;
      dev::cp_async16(dev::smem_addr(tile + swz(r, c)), ok ? src[i] + col : any, ok ? 16u : 0u);
    }
  }
};

// An MN-major tile W wide (W / 64 panels), loaded by Threads threads: 64 K rows, row(k) the source
// of K index k (null: zero), read from column mn0. A thread keeps one chunk column (Threads is a
// multiple of the W / 8 chunks a row), so its bound check is one compare.
template <class RowFn, int W = 64, int Threads = kThreads>
struct MNRows {
  static constexpr int kRowChunks = W / kChunks, kRowsPerPass = Threads / kRowChunks;
  static constexpr int kIters = kTileK / kRowsPerPass;
  static_assert(Threads % kRowChunks == 0 && kTileK % kRowsPerPass == 0, "the tile's chunks split evenly");
  RowFn row;
  const bf16* any;
  int64_t mn0, mn_dim;
  int tid;

  __device__ __forceinline__ MNRows(RowFn row_, const bf16* any_, int64_t mn0_, int64_t mn_dim_, int tid_)
      : row(row_), any(any_), mn0(mn0_), mn_dim(mn_dim_), tid(tid_) {}

  __device__ __forceinline__ void load(bf16* tile, int64_t kt) const {
    const int c = tid % kRowChunks;
    const int64_t mn = mn0 + c * 8;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int r = tid / kRowChunks + i * kRowsPerPass;
      const bf16* s = mn < mn_dim ? row(kt * kTileK + r) : nullptr;
      dev::cp_async16(dev::smem_addr(tile + mn_swz(r, c)), s ? s + mn : any, s ? 16u : 0u);
    }
  }
};

// The high and low bf16 parts of an f32: hi = bf16(v), lo = bf16(v − hi) (v − hi is exact), so
// hi + lo is v within 2^-16 relative and products of the parts with a bf16 are exact in FP32.
__device__ __forceinline__ float bf16_hi_part(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float bf16_lo_part(float v) { return v - bf16_hi_part(v); }

// MNRows over f32 source rows: row(k) gives K index k's row (null: zero) and whether the tile takes
// its low part (else its high part). Loads wait at issue; the ring's barrier publishes the stores.
template <class RowFn>
struct MNRowsF32Split {
  static constexpr int kIters = kTileK * kChunks / kThreads;
  RowFn row;
  int64_t mn0, mn_dim;
  int tid;

  __device__ __forceinline__ MNRowsF32Split(RowFn row_, int64_t mn0_, int64_t mn_dim_, int tid_)
      : row(row_), mn0(mn0_), mn_dim(mn_dim_), tid(tid_) {}

  __device__ __forceinline__ void load(bf16* tile, int64_t kt) const {
    const int c = tid % kChunks;
    const int64_t mn = mn0 + c * 8;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int r = (tid + i * kThreads) / kChunks;
      bool lo = false;
      const float* s = mn < mn_dim ? row(kt * kTileK + r, lo) : nullptr;
      uint4 out = make_uint4(0, 0, 0, 0);
      if (s) {
        const float4 v0 = *reinterpret_cast<const float4*>(s + mn);
        const float4 v1 = *reinterpret_cast<const float4*>(s + mn + 4);
        const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        float p[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) p[j] = lo ? bf16_lo_part(v[j]) : v[j];
        out = make_uint4(pack_bf16x2(p[0], p[1]), pack_bf16x2(p[2], p[3]), pack_bf16x2(p[4], p[5]),
                         pack_bf16x2(p[6], p[7]));
      }
      *reinterpret_cast<uint4*>(tile + swz(r, c)) = out;
    }
  }
};

// Row functions. Dense rows: k -> base + k·stride for k < count.
struct DenseRows {
  const bf16* base;
  int64_t stride, count;
  __device__ __forceinline__ const bf16* operator()(int64_t k) const { return k < count ? base + k * stride : nullptr; }
};

// K index k of an expert's K range: its sorted row first + k (below end), as a SortedOperand says
// (the row itself, or its assignment's token row; padding rows are zero).
struct SortedRows {
  SortedOperand op;
  const int32_t* sorted_ids;
  int64_t first, end, num_assign;
  int topk;
  __device__ __forceinline__ const bf16* operator()(int64_t k) const {
    const int64_t r = first + k;
    if (r >= end) return nullptr;
    if (!op.by_token) return op.base + r * op.stride;
    const int64_t id = sorted_ids[r];
    return id < num_assign ? op.base + (id / topk) * op.stride : nullptr;
  }
};

}  // namespace moekit::kernels::backward
