// x_quant.cuh — the FP8 layer's token quantization inside the router's gate (RouterPlan::
// quantize_x): x is read once, for the logits and for x_q. The cluster kernels (cluster.cuh,
// decode) keep their tile's x of a slice in shared memory (warp_slice_partial<..., true>);
// once the slice is loaded, the CTAs of the first expert tile quantize it here, a half warp per
// (token row, 128-column group), with quantize_tokens' arithmetic (quant/group.cuh): x_q and
// x_scale are bitwise quantize_tokens' (tests/gpu/gate_quantize_test.cu). Slices hold whole groups
// (gate_slices_hold_groups), so no group needs two CTAs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/fp8.cuh"
#include "quant/group.cuh"
#include "router/gate/order.cuh"
#include "router/params.hpp"

namespace moekit::kernels::router {

// Slice `slice` of the CTA's tile (tokens t0 .. t0 + kRows) from `x_tile` (rows of x_row_bytes,
// the slice's columns from 0) to p.x_q and p.x_scale. After a __syncthreads that follows the
// slice's loads; every thread of the CTA calls it (the half warps' shuffles run in lockstep).
template <int kRows>
__device__ __forceinline__ void quantize_x_slice(const GateParams& p, int slice, int64_t t0,
                                                 const unsigned char* x_tile, int64_t x_row_bytes) {
  namespace kq = kernels::quant;
  const GateSlicing sl(p.hidden);
  const int64_t begin = sl.begin(slice), end = sl.end(slice);
  if (end <= begin) return;  // a slice past H: the same for every thread
  const int64_t groups = (end - begin + kq::kGroup - 1) / kq::kGroup;  // of this slice
  const int64_t all_groups = (p.hidden + kq::kGroup - 1) / kq::kGroup;
  const int64_t jobs = kRows * groups;
  constexpr int kHalfWarps = kGateWarps * 32 / kq::kThreadsPerGroupRow;
  const int half = int(threadIdx.x) / kq::kThreadsPerGroupRow, sub = int(threadIdx.x) % kq::kThreadsPerGroupRow;
  for (int64_t base = 0; base < jobs; base += kHalfWarps) {
    const int64_t job = base + half;
    const bool has_job = job < jobs;
    const int r = has_job ? int(job / groups) : 0;
    const int64_t gi = has_job ? job % groups : 0;
    const int64_t c = gi * kq::kGroup + sub * kq::kColsPerThread;  // column in the slice
    const int64_t t = t0 + r;
    const bool row_ok = has_job && t < p.tokens;
    const bool live = row_ok && begin + c < end;
    float v[kq::kColsPerThread] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (live) kq::unpack_bf16x8(*reinterpret_cast<const uint4*>(x_tile + r * x_row_bytes + c * 2), v);
    const float amax = dev::lanes_amax<kq::kThreadsPerGroupRow>(kq::amax_of(0.0f, v));
    const dev::Fp8Scale s = dev::fp8_scale(amax);
    if (live) *reinterpret_cast<uint2*>(p.x_q + t * p.hidden + begin + c) = kq::quantize_x8(v, s.inv);
    if (row_ok && sub == 0) p.x_scale[t * all_groups + begin / kq::kGroup + gi] = s.scale;
  }
}

}  // namespace moekit::kernels::router
