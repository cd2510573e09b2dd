// reduce.cuh — the backward's fixed-order sums over what its GEMMs wrote per assignment:
//   dw_reduce_kernel  — d_topk_weights[a] = Σ_tile dw_partials[tile][a], tiles in order;
//   dx_combine_kernel — dx[t] = Σ_j dx_rows[t·k + j] in slot order (with split-K Σ_j Σ_s, j outer,
//                       s inner); FP32, bf16 out. With RouterGrad::gate the router's dx kernel
//                       (router_grad.cuh) makes the same sums (add_slots) and adds its own part.
// An assignment whose id is outside [0, E) has no row in the layout (align skipped it): it adds
// nothing and its d_topk_weights is 0. No atomics: the same inputs give the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backward/params.hpp"
#include "backward/tile.cuh"
#include "common/device.cuh"

namespace moekit::kernels::backward {

inline constexpr int kReduceThreads = 256;

__device__ __forceinline__ bool valid_expert(int32_t id, int experts) { return id >= 0 && id < experts; }

// A thread per assignment.
__global__ void __launch_bounds__(kReduceThreads) dw_reduce_kernel(const DwReduceParams p) {
  dev::pdl_enter();
  const int64_t a = int64_t(blockIdx.x) * kReduceThreads + threadIdx.x;
  if (a >= p.num_assign) return;
  float s = 0.0f;
  if (valid_expert(p.topk_ids[a], p.experts))
    for (int tile = 0; tile < p.tiles; ++tile) s += p.dw_partials[tile * p.num_assign + a];
  p.d_topk_weights[a] = s;
}

// Columns [c, c + 8) of token t: the rows of its valid slots added to s, j outer, s inner (16-byte
// bf16 loads, 32-byte FP32 ones). The bf16 rows are loaded kSlotChunk slots at a time before they
// are added (in slot order): the loads overlap, which a kernel of few warps an SM needs
// (dx_router_combine_kernel).
inline constexpr int kSlotChunk = 4;
__device__ __forceinline__ void add_slots(const DxCombineParams& p, int64_t t, int64_t c, float (&s)[8]) {
  const int64_t num_assign = p.tokens * p.topk;
  if (p.splits > 1) {
    for (int j = 0; j < p.topk; ++j) {
      const int64_t a = t * p.topk + j;
      if (!valid_expert(p.topk_ids[a], p.experts)) continue;
      for (int sp = 0; sp < p.splits; ++sp) {
        const float* row = p.dx_partials + (sp * num_assign + a) * p.hidden + c;
        const float4 x0 = *reinterpret_cast<const float4*>(row), x1 = *reinterpret_cast<const float4*>(row + 4);
        const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int q = 0; q < 8; ++q) s[q] += x[q];
      }
    }
    return;
  }
  for (int j0 = 0; j0 < p.topk; j0 += kSlotChunk) {
    uint4 r[kSlotChunk];
    bool ok[kSlotChunk];
#pragma unroll
    for (int u = 0; u < kSlotChunk; ++u) {
      const int64_t a = t * p.topk + j0 + u;
      ok[u] = j0 + u < p.topk && valid_expert(p.topk_ids[a], p.experts);
      r[u] = ok[u] ? *reinterpret_cast<const uint4*>(p.dx_rows + a * p.hidden + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kSlotChunk; ++u) {
      if (!ok[u]) continue;  // a skipped slot adds nothing (not even a +0)
      const uint32_t w[4] = {r[u].x, r[u].y, r[u].z, r[u].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = unpack_bf16x2(w[q]);
        s[2 * q] += f.x;
        s[2 * q + 1] += f.y;
      }
    }
  }
}

__device__ __forceinline__ void store_dx(const DxCombineParams& p, int64_t t, int64_t c, const float (&s)[8]) {
  *reinterpret_cast<uint4*>(p.dx + t * p.hidden + c) =
      make_uint4(pack_bf16x2(s[0], s[1]), pack_bf16x2(s[2], s[3]), pack_bf16x2(s[4], s[5]), pack_bf16x2(s[6], s[7]));
}

// A thread per 8 columns of a token.
__global__ void __launch_bounds__(kReduceThreads) dx_combine_kernel(const DxCombineParams p) {
  dev::pdl_enter();
  const int64_t vecs = p.hidden / 8, v = int64_t(blockIdx.x) * kReduceThreads + threadIdx.x;
  if (v >= p.tokens * vecs) return;
  const int64_t t = v / vecs, c = (v % vecs) * 8;
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  add_slots(p, t, c, s);
  store_dx(p, t, c, s);
}

}  // namespace moekit::kernels::backward
