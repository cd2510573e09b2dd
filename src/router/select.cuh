// select.cuh — stage 1's selection: one fused kernel from logits (given, or x·w_gateᵀ computed on
// the CUDA cores) to k ids and weights, and the CUDA-core logits kernel of an f32 w_gate.
//
// A warp owns a token; lane l owns experts e = i*32 + l (i < EPL), so the E scores live in
// registers. Scoring, bias, grouped top-k, top-k, renormalisation and scaling happen in
// registers and warp shuffles; only k ids and k weights are written. Every floating-point step
// follows common/canon.hpp, so the CPU oracle reproduces the result bit for bit.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/device.cuh"
#include "router/params.hpp"

namespace moekit::kernels::router {

// A candidate of the warp-wide argmax; e < 0 is "none" and loses to everything.
struct Cand {
  float v;
  int e;
};
__device__ __forceinline__ bool cand_before(Cand a, Cand b) {
  if (b.e < 0) return a.e >= 0;
  if (a.e < 0) return false;
  return canon::ranks_before(a.v, a.e, b.v, b.e);
}
__device__ __forceinline__ Cand warp_best(Cand c) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) {
    Cand o{__shfl_xor_sync(dev::kFullMask, c.v, off), __shfl_xor_sync(dev::kFullMask, c.e, off)};
    if (cand_before(o, c)) c = o;
  }
  return c;
}

// Grouped top-k for any group size, by the whole warp: lane g scans group g of `choice` (the
// token's E selection values, in shared memory) for its best two, a group's value is their sum
// with a score bias (else the best), and the topk_group best groups (lower group on a tie) are
// the returned bit mask.
__device__ __forceinline__ uint32_t groups_kept_by_scan(const float* choice, const Params& p, int group_size) {
  const int lane = dev::lane_id();
  Cand g{0.0f, -1};
  if (lane < p.n_group) {
    const float* c = choice + lane * group_size;
    Cand a{0.0f, -1}, b{0.0f, -1};
    for (int q = 0; q < group_size; ++q) {
      const Cand x{c[q], q};
      if (cand_before(x, a)) b = a, a = x;
      else if (cand_before(x, b)) b = x;
    }
    g = {(p.score_bias != nullptr && group_size >= 2) ? canon::add(a.v, b.v) : a.v, lane};
  }
  uint32_t keep = 0;
  for (int j = 0; j < p.topk_group; ++j) {
    const Cand best = warp_best(g);
    keep |= 1u << best.e;
    if (lane == best.e) g.e = -1;
  }
  return keep;
}

// canon::ranks_before as an unsigned order: a larger key ranks first. Numbers map to [2, 2^32)
// in numeric order (-0 is +0: they tie), NaN to 1 (below every number, NaNs tie), and 0 is
// "not selectable". Ties between keys go to the lower expert id, as in ranks_before.
__device__ __forceinline__ uint32_t rank_key(float v) {
  if (v != v) return 1u;
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// The score a key of 2 or more came from (a NaN for 1): exact, so sums of keyed scores are the
// oracle's sums (up to the sign of a zero, which ranks the same).
__device__ __forceinline__ float key_value(uint32_t k) {
  if (k < 2u) return __uint_as_float(0x7fc00000u);
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// One 8-element chunk of a w_gate row (bf16 or f32) as floats: 16 or 32 bytes in one or two loads.
template <class WT>
__device__ __forceinline__ void load_chunk8(const WT* src, float (&w)[8]) {
  if constexpr (sizeof(WT) == 4) {
    const float4 w0 = *reinterpret_cast<const float4*>(src);
    const float4 w1 = *reinterpret_cast<const float4*>(src + 4);
    w[0] = w0.x, w[1] = w0.y, w[2] = w0.z, w[3] = w0.w, w[4] = w1.x, w[5] = w1.y, w[6] = w1.z, w[7] = w1.w;
  } else {
    const uint4 wv = *reinterpret_cast<const uint4*>(src);
    const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) w[2 * q] = dev::bf16_lo(ws[q]), w[2 * q + 1] = dev::bf16_hi(ws[q]);
  }
}

// x[t]·w_gate[e] in canon order: lane-strided 8-element chunks, FMA, then the butterfly.
template <class WT>
__device__ __forceinline__ float logit_dot(const __nv_bfloat16* x_row, const WT* w_row, int64_t hidden) {
  const int lane = dev::lane_id();
  float acc = 0.0f;
  // Unrolled so several 16-byte loads are in flight (the FMA chain itself stays in order).
#pragma unroll 4
  for (int64_t c = lane; c < hidden / canon::kLogitChunk; c += 32) {
    const uint4 xv = *reinterpret_cast<const uint4*>(x_row + c * 8);
    const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w};
    float w[8];
    load_chunk8(w_row + c * 8, w);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      acc = canon::fma(dev::bf16_lo(xs[q]), w[2 * q], acc);
      acc = canon::fma(dev::bf16_hi(xs[q]), w[2 * q + 1], acc);
    }
  }
  return dev::warp_tree_sum(acc);
}

// logits[t, e] = x[t]·w_gate[e] for kLogitTokens tokens and one expert per warp: the w_gate
// chunk is loaded once and used for every token of the tile, and the grid spreads the w_gate
// read over many SMs (DeepSeek-V3's is 3.7 MB: one warp per token would read it on one SM).
// Each logit is still one lane-strided FMA chain + the butterfly: bitwise logit_dot's value.

template <class WT>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) logits_kernel(Params p, float* logits) {
  dev::pdl_enter();
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id();
  const int e = int(blockIdx.y) * kWarpsPerBlock + warp;
  if (e >= p.experts) return;
  const int64_t t0 = int64_t(blockIdx.x) * kLogitTokens;
  const int tokens = int(min(int64_t(kLogitTokens), p.tokens - t0));
  const WT* w_row = static_cast<const WT*>(p.w_gate) + int64_t(e) * p.hidden;
  float acc[kLogitTokens];
#pragma unroll
  for (int i = 0; i < kLogitTokens; ++i) acc[i] = 0.0f;
  // Unrolled so several 16-byte loads are in flight (each FMA chain itself stays in order).
#pragma unroll 2
  for (int64_t c = lane; c < p.hidden / canon::kLogitChunk; c += 32) {
    float w[8];
    load_chunk8(w_row + c * 8, w);
    // All the tile's x chunks are loaded before any FMA: a load behind each token's FMAs
    // serialised 8 L2 round trips per chunk (the router took 26 us at T=8 against 7 at T=1).
    uint4 xv[kLogitTokens];
#pragma unroll
    for (int i = 0; i < kLogitTokens; ++i)
      xv[i] = i < tokens ? *reinterpret_cast<const uint4*>(p.x + (t0 + i) * p.hidden + c * 8) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kLogitTokens; ++i) {
      const uint32_t xs[4] = {xv[i].x, xv[i].y, xv[i].z, xv[i].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc[i] = canon::fma(dev::bf16_lo(xs[q]), w[2 * q], acc[i]);
        acc[i] = canon::fma(dev::bf16_hi(xs[q]), w[2 * q + 1], acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kLogitTokens; ++i) {
    const float v = dev::warp_tree_sum(acc[i]);
    if (lane == 0 && i < tokens) logits[(t0 + i) * p.experts + e] = v;
  }
}

// WT: w_gate's element type when the kernel computes the logits itself; void when they are given.
template <int EPL, class WT>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) router_kernel(Params p) {
  dev::pdl_enter();
  __shared__ float s_choice[kWarpsPerBlock][32 * EPL];
  __shared__ float s_weight[kWarpsPerBlock][kTopkSlots];
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id();
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= p.tokens) return;
  const int E = p.experts;

  // 1. logits, lane-owned: l[i] is expert i*32 + lane.
  float l[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) l[i] = -INFINITY;
  if constexpr (std::is_void_v<WT>) {  // logits given (by the caller or logits_kernel)
#pragma unroll
    for (int i = 0; i < EPL; ++i)
      if (i * 32 + lane < E) l[i] = p.logits[t * E + i * 32 + lane];
  } else {
    const __nv_bfloat16* x_row = p.x + t * p.hidden;
    const WT* w = static_cast<const WT*>(p.w_gate);
#pragma unroll
    for (int i = 0; i < EPL; ++i)
      for (int j = 0; j < 32 && i * 32 + j < E; ++j) {
        const float v = logit_dot(x_row, w + int64_t(i * 32 + j) * p.hidden, p.hidden);
        if (lane == j) l[i] = v;
      }
  }

  // 2. scores (softmax over E, or sigmoid) and selection values (+ bias).
  float score[EPL];
  if (!p.sigmoid) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < EPL; ++i) m = fmaxf(m, l[i]);
    m = dev::warp_max(m);
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      score[i] = canon::exp(canon::add(l[i], -m));
      if (i * 32 + lane < E) part = canon::add(part, score[i]);
    }
    const float sum = dev::warp_tree_sum(part);
#pragma unroll
    for (int i = 0; i < EPL; ++i) score[i] = canon::div(score[i], sum);
  } else {
#pragma unroll
    for (int i = 0; i < EPL; ++i) score[i] = canon::sigmoid(l[i]);
  }
  float choice[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    const int e = i * 32 + lane;
    choice[i] = (p.score_bias != nullptr && e < E) ? canon::add(score[i], p.score_bias[e]) : score[i];
  }

  // 3. grouped top-k: keep the topk_group best groups (top-2 sum with a bias, else the max).
  // Selection runs on rank keys (rank_key): a larger key ranks first, exactly as ranks_before.
  uint32_t key[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) key[i] = i * 32 + lane < E ? rank_key(choice[i]) : 0u;
  if (p.n_group > 0) {
    const int group_size = E / p.n_group;
    uint32_t keep_groups = 0;
    if (group_size == 32) {
      // Group g is register g of every lane: its best two are warp reductions.
      uint32_t gkey[EPL];
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        gkey[i] = 0u;
        if (i < p.n_group) {
          const uint32_t k1 = __reduce_max_sync(dev::kFullMask, key[i]);
          const unsigned first = __reduce_min_sync(dev::kFullMask, key[i] == k1 ? unsigned(lane) : 32u);
          const uint32_t k2 = __reduce_max_sync(dev::kFullMask, unsigned(lane) == first ? 0u : key[i]);
          const float g = p.score_bias != nullptr ? canon::add(key_value(k1), key_value(k2)) : key_value(k1);
          gkey[i] = rank_key(g);
        }
      }
      for (int j = 0; j < p.topk_group; ++j) {  // uniform over the warp: no shuffles
        uint32_t kb = 0u;
        int gb = 0;
#pragma unroll
        for (int i = 0; i < EPL; ++i)
          if (gkey[i] > kb) kb = gkey[i], gb = i;
        keep_groups |= 1u << gb;
#pragma unroll
        for (int i = 0; i < EPL; ++i)
          if (i == gb) gkey[i] = 0u;
      }
    } else {
      // Any other group size: lane g scans group g from shared memory.
#pragma unroll
      for (int i = 0; i < EPL; ++i)
        if (i * 32 + lane < E) s_choice[warp][i * 32 + lane] = choice[i];
      __syncwarp();
      keep_groups = groups_kept_by_scan(s_choice[warp], p, group_size);
    }
#pragma unroll
    for (int i = 0; i < EPL; ++i)
      if (i * 32 + lane < E && !((keep_groups >> ((i * 32 + lane) / group_size)) & 1u)) key[i] = 0u;
  }

  // 4. top-k over the allowed experts, best first: the lane's best key (lowest i on a tie), the
  // warp's best key, and of the lanes holding it the lowest expert id.
  float sum = 0.0f;
  for (int j = 0; j < p.topk; ++j) {
    uint32_t kb = 0u;
    int ib = 0;
#pragma unroll
    for (int i = 0; i < EPL; ++i)
      if (key[i] > kb) kb = key[i], ib = i;
    const uint32_t kmax = __reduce_max_sync(dev::kFullMask, kb);
    const int best = int(__reduce_min_sync(dev::kFullMask, kb == kmax ? unsigned(ib * 32 + lane) : 0xffffffffu));
    float w = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i)
      if (i * 32 + lane == best) key[i] = 0u, w = score[i];
    w = __shfl_sync(dev::kFullMask, w, best & 31);
    sum = canon::add(sum, w);
    if (lane == 0) {
      p.topk_ids[t * p.topk + j] = best;
      s_weight[warp][j] = w;
    }
  }
  __syncwarp();
  if (lane < p.topk) {
    float w = s_weight[warp][lane];
    if (p.renormalize) w = canon::div(w, sum);
    p.topk_weights[t * p.topk + lane] = canon::weight_out(canon::mul(w, p.routed_scaling_factor));
  }
}

}  // namespace moekit::kernels::router
