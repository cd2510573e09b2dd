// router_grad.cuh — the router's gradient (RouterGrad::logits and ::gate), from d_topk_weights:
//   router_grad_kernel — a warp per token: d_logits through softmax over all E experts or sigmoid,
//                        the renormalisation and the routed scaling factor, the selection held fixed
//                        (docs/design.md, "Backward"), in FP32; + d_logits_aux with ::gate. Writes
//                        d_router_logits (f32), or for ::gate its bf16 high and low parts
//                        (hi = bf16(d), lo = bf16(d − hi)), which feed the two gate GEMMs on the
//                        tensor cores at nearly FP32 precision (hi + lo is d within 2^-16);
//   d_w_gate_kernel    — d_w_gate [E, H] = Σ_t d_logits[t]ᵀ·x_t, K = 2T (each token's hi and lo
//                        rows), 128 x 128 tiles where E > 64 (else 64 x 64), split-K partials
//                        with gate_splits > 1;
//   dx_router_combine_kernel — dx [T, H] = Σ_j dx_rows + d_logits·w_gate: the router's part on the
//                        tensor cores (K = the parts of d_logits times the parts of w_gate; bf16: w,
//                        f32: its hi and lo parts), kept in FP32 through shared memory, and added to
//                        the experts' part summed as dx_combine_kernel sums it (reduce.cuh), bf16
//                        out: the router's part never goes through memory.
// Every sum is in a fixed order (the warp's butterfly, K order): deterministic.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backward/loaders.cuh"
#include "backward/params.hpp"
#include "backward/reduce.cuh"
#include "backward/tile.cuh"
#include "backward/weight_grad.cuh"
#include "common/device.cuh"

namespace moekit::kernels::backward {

inline constexpr int kRouterWarps = 4;         // tokens a CTA
inline constexpr int kExpertsPerLane = 16;     // E <= 512 (moekit::kMaxExperts) over 32 lanes

// kPerLane (1, 2, 4, 8 or kExpertsPerLane): experts a lane holds, 32·kPerLane >= experts_padded;
// the launch takes the smallest (a lane's slots past E add +0 to its sum: the same bits at every
// kPerLane).
template <int kPerLane>
__global__ void __launch_bounds__(kRouterWarps * 32) router_grad_kernel(const RouterGradParams p) {
  dev::pdl_enter();
  const int64_t t = int64_t(blockIdx.x) * kRouterWarps + (threadIdx.x >> 5);
  if (t >= p.tokens) return;  // the whole warp
  const int lane = dev::lane_id(), E = p.experts, k = p.topk;
  const float* l = p.logits + t * E;  // [E]
  // The unbiased scores p_e of this lane's experts e = lane + 32·i.
  float lv[kPerLane], pv[kPerLane];
  float m = -INFINITY, sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    lv[i] = e < E ? l[e] : -INFINITY;
    m = fmaxf(m, lv[i]);
  }
  if (!p.sigmoid) {
    m = dev::warp_max(m);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) sum += lane + 32 * i < E ? expf(lv[i] - m) : 0.0f;
    sum = dev::warp_tree_sum(sum);
  }
  // One expression for p_e and for a chosen expert's s_j, so the two agree bitwise.
  auto score = [&](float x) { return p.sigmoid ? __frcp_rn(1.0f + expf(-x)) : expf(x - m) / sum; };
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) pv[i] = lane + 32 * i < E ? score(lv[i]) : 0.0f;

  // Lane j < k holds slot j: its expert, dL/dw_j and s_j. ds_j = r·(dw_j − [renorm] Σ_i dw_i·s_i/S)/S.
  int32_t id = -1;
  float dw = 0.0f;
  if (lane < k) {
    id = p.topk_ids[t * k + lane];
    dw = p.d_topk[t * k + lane];
  }
  const bool chosen = lane < k && id >= 0 && id < E;
  const float s = chosen ? score(l[id]) : 0.0f;
  float S = 1.0f, mean = 0.0f;
  if (p.renormalize) {
    S = dev::warp_tree_sum(s);
    mean = dev::warp_tree_sum(chosen ? dw * s : 0.0f) / S;
  }
  const float ds = chosen ? p.scale * (dw - mean) / S : 0.0f;
  // softmax: Σ_e p_e·dp_e = Σ_j s_j·ds_j (dp is ds at the chosen experts, 0 elsewhere).
  const float dot = p.sigmoid ? 0.0f : dev::warp_tree_sum(s * ds);
  float dp[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) dp[i] = 0.0f;
  for (int j = 0; j < k; ++j) {  // slot order, as the oracle adds them
    const int32_t id_j = __shfl_sync(dev::kFullMask, id, j);
    const float ds_j = __shfl_sync(dev::kFullMask, ds, j);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i == id_j) dp[i] += ds_j;  // an unchosen slot has ds_j = 0
  }
  const int Ep = p.experts_padded;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e >= Ep) continue;
    float d = 0.0f;
    if (e < E) {
      d = p.sigmoid ? dp[i] * pv[i] * (1.0f - pv[i]) : pv[i] * (dp[i] - dot);
      if (p.aux) d += p.aux[t * E + e];
      if (p.d_logits) p.d_logits[t * E + e] = d;
    }
    if (p.d_logits_split) {
      p.d_logits_split[t * 2 * Ep + e] = __float2bfloat16_rn(d);
      p.d_logits_split[t * 2 * Ep + Ep + e] = __float2bfloat16_rn(bf16_lo_part(d));
    }
  }
}

// K index k of d_w_gate's B: token k / 2's x row (its hi and lo rows of d_logits share it).
struct TokenPairRows {
  const bf16* x;
  int64_t hidden, count;  // count = 2T
  __device__ __forceinline__ const bf16* operator()(int64_t k) const { return k < count ? x + (k >> 1) * hidden : nullptr; }
};

// d_w_gate's tile (moekit::gate_grad_tile picks BM): 128 x 128 on 8 warps (64 x 32 each), or
// 64 x 64 on 4 warps. The wide tile's warps make 16 mma a k16 step for 6 ldmatrix (the narrow's
// 8 for 4), and its 96 KiB ring is dynamic.
template <int BM>
using GateTile = std::conditional_t<BM == 128, Tile<128, 128, 2, 4, Major::MN, Major::MN>,
                                    Tile<64, 64, 2, 2, Major::MN, Major::MN>>;

// grid: (ceil(E/BM) x ceil(H/BN), 1, S); dynamic shared memory GateTile<BM>::kSmemBytes.
template <int BM>
__global__ void __launch_bounds__(GateTile<BM>::kThreads, BM == 128 ? 2 : 4) d_w_gate_kernel(const GateGradParams p) {
  using Cfg = GateTile<BM>;
  constexpr int NT = Cfg::kThreads;
  dev::pdl_enter();
  bf16* smem = reinterpret_cast<bf16*>(backward_smem);
  const int tid = int(threadIdx.x);
  const int64_t n_tiles = (p.hidden + Cfg::BN - 1) / Cfg::BN;
  const int64_t m0 = int64_t(blockIdx.x) / n_tiles * Cfg::BM, n0 = int64_t(blockIdx.x) % n_tiles * Cfg::BN;
  const int split = int(blockIdx.z);
  const int64_t k_dim = 2 * p.tokens, k_tiles = (k_dim + kTileK - 1) / kTileK;
  const int64_t per_split = (k_tiles + p.splits - 1) / p.splits, kt0 = split * per_split;
  const int64_t count = kt0 < k_tiles ? (k_tiles - kt0 < per_split ? k_tiles - kt0 : per_split) : 0;
  // A row k = 2t + part is d_logits_split row t's part: [T, 2, Ep] read as [2T, Ep] (zero past E).
  const MNRows<DenseRows, Cfg::BM, NT> a(DenseRows{p.d_logits_split, p.experts_padded, k_dim}, p.d_logits_split, m0,
                                         p.experts_padded, tid);
  const MNRows<TokenPairRows, Cfg::BN, NT> b(TokenPairRows{p.x, p.hidden, k_dim}, p.x, n0, p.hidden, tid);
  Mma<Cfg> mma(tid);
  k_loop(mma, smem, a, b, kt0, count);
  store_weight_tile(p.d_w_gate, mma, 0, split, m0, n0);
}

// K index k of dx_router's B: expert k mod Ep's w_gate row (zero past E), over K = parts·Ep;
// with an f32 w_gate, K-range [2·Ep, 4·Ep) takes the rows' low parts (`lo`).
struct ExpertRows {
  const bf16* w;
  int64_t hidden, k_dim;
  int experts, experts_padded;
  __device__ __forceinline__ const bf16* operator()(int64_t k) const {
    const int e = int(k % experts_padded);
    return k < k_dim && e < experts ? w + e * hidden : nullptr;
  }
};
struct ExpertRowsF32 {
  const float* w;
  int64_t hidden, k_dim;
  int experts, experts_padded;
  __device__ __forceinline__ const float* operator()(int64_t k, bool& lo) const {
    const int e = int(k % experts_padded);
    lo = k >= 2 * experts_padded;
    return k < k_dim && e < experts ? w + e * hidden : nullptr;
  }
};

// grid: (ceil(T/64), ceil(H/64)). A = d_logits_split rows [T, 2·Ep] (K-major; with an f32 w_gate
// read twice: K column k >= 2·Ep is column k − 2·Ep). dx of the tile: per 8 columns of a token, the
// experts' part (add_slots: its slots in order, from zero), then the router's part, rounded once:
// the sums and their order dx_combine_kernel followed with the router's part from memory.
template <bool kF32>
__global__ void __launch_bounds__(kThreads) dx_router_combine_kernel(const GateGradParams p, const DxCombineParams c) {
  using Cfg = Tile<64, 64, 2, 2, Major::K, Major::MN>;
  dev::pdl_enter();
  __shared__ __align__(128) bf16 smem[Cfg::kSmemElems];
  const int tid = int(threadIdx.x);
  const int64_t m0 = int64_t(blockIdx.x) * 64, n0 = int64_t(blockIdx.y) * 64;
  const int64_t Ep = p.experts_padded, k_dim = (kF32 ? 4 : 2) * Ep;
  const KRows<64> a([&](int r) { return m0 + r < p.tokens ? p.d_logits_split + (m0 + r) * 2 * Ep : nullptr; },
                    p.d_logits_split, k_dim, 2 * Ep, tid);
  Mma<Cfg> mma(tid);
  const int64_t k_tiles = (k_dim + kTileK - 1) / kTileK;
  if constexpr (kF32) {
    const MNRowsF32Split<ExpertRowsF32> b(
        ExpertRowsF32{static_cast<const float*>(p.w_gate), p.hidden, k_dim, p.experts, p.experts_padded}, n0, p.hidden,
        tid);
    k_loop(mma, smem, a, b, 0, k_tiles);
  } else {
    const bf16* w = static_cast<const bf16*>(p.w_gate);
    const MNRows<ExpertRows> b(ExpertRows{w, p.hidden, k_dim, p.experts, p.experts_padded}, w, n0, p.hidden, tid);
    k_loop(mma, smem, a, b, 0, k_tiles);
  }
  // The router's 64 x 64 part into the ring's memory (k_loop ends with every copy landed and a
  // barrier: no warp reads the ring any more).
  constexpr int kStride = 64 + 4;  // floats a row: float2 stores a quad apart land in distinct banks
  static_assert(64 * kStride * 4 <= Cfg::kSmemBytes, "the router's part fits the ring");
  float* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < Cfg::MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int f = 0; f < Cfg::NI; ++f)
        *reinterpret_cast<float2*>(part + mma.row(i, h) * kStride + mma.col(f)) =
            make_float2(mma.acc[i][f][2 * h], mma.acc[i][f][2 * h + 1]);
  __syncthreads();
#pragma unroll
  for (int v = tid; v < 64 * 8; v += kThreads) {  // 8 columns of a token a step, 8 threads a row
    const int r = v / 8, c8 = (v % 8) * 8;
    const int64_t t = m0 + r, col = n0 + c8;
    if (t >= p.tokens || col >= p.hidden) continue;  // hidden is a multiple of 8
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    add_slots(c, t, col, s);
#pragma unroll
    for (int q = 0; q < 8; ++q) s[q] += part[r * kStride + c8 + q];
    store_dx(c, t, col, s);
  }
}

}  // namespace moekit::kernels::backward
