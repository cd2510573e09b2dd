// x_quant.cuh — the FP8 layer's token quantization inside the router's gate (RouterPlan::
// quantize_x): x is read once, for the logits and for x_q. The cluster kernels (cluster.cuh,
// decode) keep their tile's x of a slice in shared memory (warp_slice_partial<..., true>);
// once the slice is loaded, the CTAs of the first expert tile quantize it here, a half warp per
// (token row, 128-column group), with quantize_tokens' arithmetic (quant/group.cuh): x_q and
// x_scale are bitwise quantize_tokens' (tests/gpu/gate_quantize_test.cu). A block of the order is
// one group (order.cuh), so no group needs two CTAs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/fp8.cuh"
#include "quant/group.cuh"
#include "router/gate/order.cuh"
#include "router/params.hpp"

namespace moekit::kernels::router {

// Slice `slice` of the CTA's tile (tokens t0 .. t0 + kRows) from `x_tile` (rows of x_row_bytes,
// the slice's blocks r + 8m at column 128m) to p.x_q and p.x_scale. After a __syncthreads that
// follows the slice's loads; every thread of the CTA calls it (the half warps' shuffles run in
// lockstep).
template <int kRows>
__device__ __forceinline__ void quantize_x_slice(const GateParams& p, int slice, int64_t t0,
                                                 const unsigned char* x_tile, int64_t x_row_bytes) {
  namespace kq = kernels::quant;
  static_assert(kq::kGroup == kGateBlock, "a block of the order is one scale group");
  const int64_t groups = gate_slice_blocks(p.hidden, slice);  // of this slice
  if (groups == 0) return;  // a slice past H: the same for every thread
  const int64_t all_groups = gate_blocks(p.hidden);
  const int64_t jobs = kRows * groups;
  constexpr int kHalfWarps = kGateWarps * 32 / kq::kThreadsPerGroupRow;
  const int half = int(threadIdx.x) / kq::kThreadsPerGroupRow, sub = int(threadIdx.x) % kq::kThreadsPerGroupRow;
  for (int64_t base = 0; base < jobs; base += kHalfWarps) {
    const int64_t job = base + half;
    const bool has_job = job < jobs;
    const int r = has_job ? int(job / groups) : 0;
    const int64_t m = has_job ? job % groups : 0;                     // the slice's block m
    const int64_t group = slice + int64_t(kGateSlices) * m;           // block (= group) of H
    const int64_t c = sub * kq::kColsPerThread;                       // column in the group
    const int64_t col = group * kq::kGroup + c;                       // column of H
    const int64_t t = t0 + r;
    const bool row_ok = has_job && t < p.tokens;
    const bool live = row_ok && col < p.hidden;
    float v[kq::kColsPerThread] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (live) kq::unpack_bf16x8(*reinterpret_cast<const uint4*>(x_tile + r * x_row_bytes + (m * kq::kGroup + c) * 2), v);
    const float amax = dev::lanes_amax<kq::kThreadsPerGroupRow>(kq::amax_of(0.0f, v));
    const dev::Fp8Scale s = dev::fp8_scale(amax);
    if (live) *reinterpret_cast<uint2*>(p.x_q + t * p.hidden + col) = kq::quantize_x8(v, s.inv);
    if (row_ok && sub == 0) p.x_scale[t * all_groups + group] = s.scale;
  }
}

}  // namespace moekit::kernels::router
