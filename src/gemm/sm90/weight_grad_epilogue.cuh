// weight_grad_epilogue.cuh — the epilogue of the weight-gradient kernel (weight_grad.cuh): a
// finished 128 x 256 tile of FP32 sums to its one destination, this split's FP32 partials, an f32
// dW (stored, or added to), or a bf16 dW through shared memory and the TMA.
#pragma once

#include <cstdint>

#include "gemm/common.cuh"  // pack_bf16x2, KGroupedParams
#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/ptx.cuh"

namespace moekit::kernels::gemm::sm90 {

// A work item of the weight gradients: expert, K-split and the tile's first row and column.
struct WeightGradItem {
  int32_t expert, split, m0, n0;
};

// The output row (of out_e's m_dim) of this thread's row half h in item w.
__device__ __forceinline__ int64_t tile_row(const WeightGradItem& w, int wg, int warp, int lane, int h) {
  return w.m0 + wg * kWgmmaM + acc_row(warp, lane, 2 * h);
}

// The finished tile to an f32 out (or this split's partials) as 8 consecutive columns a lane: each
// group of 4 n8 blocks is transposed across the lane quad (layout.hpp, quad_transpose: once for the
// even columns, once for the odd), so a row's stores are 2 x 16-byte accesses and a quad's cover 128
// contiguous bytes. Every lane takes part in the shuffles; rows past
// m_dim and columns past n_dim (a multiple of 8) store nothing.
template <class Cfg, class Store>
__device__ __forceinline__ void store_rows(const KGroupedParams& p, const float (&acc)[Cfg::kAccs],
                                           const WeightGradItem& w, int wg, int warp, int lane, Store&& store) {
  const int q = lane & 3;
  auto shfl = [](uint32_t v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t m = tile_row(w, wg, warp, lane, h);
    const bool row_ok = m < p.m_dim;
    const int64_t row = (int64_t(w.expert) * p.m_dim + m) * p.n_dim;
#pragma unroll
    for (int g = 0; g < Cfg::kBlockN / 32; ++g) {
      uint32_t even[4], odd[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int v = epi_acc(g, i, h);
        even[i] = __float_as_uint(acc[v]), odd[i] = __float_as_uint(acc[v + 1]);
      }
      quad_transpose(even, q, shfl);
      quad_transpose(odd, q, shfl);
      const int64_t n = w.n0 + epi_store_col(g, q);
      if (row_ok && n < p.n_dim) store(row + n, even, odd);  // columns n + 2i: even[i], odd[i]
    }
  }
}

// Added to an f32 out where this thread's sums are, two columns at a time, untransposed: the quad
// transpose's registers beside a loaded row spill next to the 128 sums.
template <class Cfg>
__device__ __forceinline__ void add_rows(const KGroupedParams& p, const float (&acc)[Cfg::kAccs],
                                         const WeightGradItem& w, int wg, int warp, int lane) {
  const int64_t col0 = w.n0 + 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t m = tile_row(w, wg, warp, lane, h);
    if (m >= p.m_dim) continue;
    float2* row = reinterpret_cast<float2*>(static_cast<float*>(p.out) + (int64_t(w.expert) * p.m_dim + m) * p.n_dim + col0);
#pragma unroll
    for (int j = 0; j < Cfg::kBlockN / 8; ++j)
      if (col0 + 8 * j < p.n_dim) {
        const float2 old = row[4 * j];
        row[4 * j] = make_float2(old.x + acc[4 * j + 2 * h], old.y + acc[4 * j + 2 * h + 1]);
      }
  }
}

// The finished tile to a bf16 out through the warp's two 2 KB chunks of shared memory (`stage`),
// 64 columns at a time: the warp's 16 rows of them go in by stmatrix (8 packed accumulators a lane
// per 16 x 16 block, the fragment's own layout: no shuffles), and lane 0 hands the chunk to the
// TMA (a 64 x 16 box of out_map at the warp's rows). The warp goes on while the TMA drains the
// chunk to memory, so an item's stores run under the next item's mainloop; it waits only before
// refilling a chunk whose store, issued two chunks earlier, has not yet read it. A chunk row is
// 128 bytes with its 16-byte pieces XORed with row % 8 (layout.hpp, sw128_offset): the map's
// 128-byte swizzle, and the 8 rows of a matrix (stmatrix) in different banks. The TMA writes
// nothing past m_dim or n_dim.
template <class Cfg>
__device__ __forceinline__ void store_bf16_rows(const CUtensorMap* out_map, const float (&acc)[Cfg::kAccs],
                                                const WeightGradItem& w, int wg, int warp, int lane, uint32_t stage) {
  // stmatrix: lane l addresses row l % 8 (+8 for matrices 1 and 3) of the piece pair's piece l / 16.
  const int st_row = lane % 8 + 8 * ((lane / 8) & 1), st_piece = lane / 16;
  const int32_t row0 = w.m0 + wg * kWgmmaM + 16 * warp;  // the warp's first row of dW_e
#pragma unroll
  for (int c = 0; c < Cfg::kBlockN / 64; ++c) {
    const uint32_t chunk = stage + uint32_t(c % 2) * Cfg::kEpiChunkBytes;
    if (lane == 0) ptx::bulk_wait_group_read<1>();  // the chunk's last store (two groups ago) has read it
    __syncwarp();
#pragma unroll
    for (int pr = 0; pr < 4; ++pr) {
      const int j = 8 * c + 2 * pr;  // n8 blocks j and j + 1
      ptx::stmatrix_x4(chunk + sw128_offset(uint32_t(st_row), uint32_t(2 * pr + st_piece)),
                       pack_bf16x2(acc[4 * j], acc[4 * j + 1]), pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]),
                       pack_bf16x2(acc[4 * j + 4], acc[4 * j + 5]), pack_bf16x2(acc[4 * j + 6], acc[4 * j + 7]));
    }
    ptx::fence_proxy_async_smem();  // this lane's writes, before the TMA's (async-proxy) reads of them
    __syncwarp();
    // Every chunk is one group, also a box wholly past n_dim (which writes nothing), so the wait
    // above always counts the groups of both chunks.
    if (lane == 0) {
      ptx::tma_store_4d(out_map, chunk, w.n0 + 64 * c, row0, w.expert, 0);
      ptx::bulk_commit_group();
    }
  }
}

// The tile's one destination: this split's FP32 partials, else out as f32 (added to, or stored)
// or bf16 (through `stage`, the warp's epilogue bytes).
template <class Cfg>
__device__ __forceinline__ void store_weight_grad(const KGroupedParams& p, const CUtensorMap* out_map,
                                                  const float (&acc)[Cfg::kAccs], const WeightGradItem& w, int wg,
                                                  int warp, int lane, uint32_t stage) {
  using Word4 = const uint32_t (&)[4];
  if (p.accumulate && !p.partials) return add_rows<Cfg>(p, acc, w, wg, warp, lane);
  if (!p.bf16_out()) {
    float* out = p.partials ? p.partials + int64_t(w.split) * p.experts * p.m_dim * p.n_dim : static_cast<float*>(p.out);
    store_rows<Cfg>(p, acc, w, wg, warp, lane, [&](int64_t i, Word4 e, Word4 o) {
      reinterpret_cast<uint4*>(out + i)[0] = make_uint4(e[0], o[0], e[1], o[1]);
      reinterpret_cast<uint4*>(out + i)[1] = make_uint4(e[2], o[2], e[3], o[3]);
    });
    return;
  }
  store_bf16_rows<Cfg>(out_map, acc, w, wg, warp, lane, stage);
}

}  // namespace moekit::kernels::gemm::sm90
