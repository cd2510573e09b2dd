// select_cta.cuh — stage 1's selection with a CTA per token (decode and mid-size T, 128 < E <=
// 256): the same ids and weights as router_kernel (select.cuh), bit for bit, with the token's
// chain of dependent instructions split over its experts' warps. Launched by router.cu.
#pragma once

#include <cstdint>

#include "common/device.cuh"
#include "router/select.cuh"

namespace moekit::kernels::router {

// router_kernel gives a token one warp, so its steps form one chain of dependent instructions:
// ncu measured 1,847 instructions and 11,174 cycles (~5.6 us) for DeepSeek-V3's single decode
// token (E = 256, sigmoid, bias, grouped top-k, k = 8). Here thread e owns expert e (E <= 256, a
// warp per 32 experts) and the chain is cut into parallel pieces: the scores, each group's best
// two (warp reductions), each warp's own top k, then warp 0 merges the warps' candidates (the k
// best of the union of every warp's k best are the k best). The keys, the tie order (higher key,
// then lower expert id) and every sum's order are router_kernel's: the softmax denominator is
// summed by each warp in router_kernel's lane order, the renormalisation sum in selection order.
// So the ids and weights are bitwise router_kernel's, which the CPU oracle reproduces.
constexpr int kCtaWarps = kCtaMaxExperts / 32;

// Logits given (p.logits); 32·ceil(E/32) threads; grid: one CTA per token.
__global__ void __launch_bounds__(kCtaMaxExperts) router_cta_kernel(Params p) {
  dev::pdl_enter();
  __shared__ float s_exp[kCtaMaxExperts];     // softmax numerators (the denominator's terms)
  __shared__ float s_score[kCtaMaxExperts];   // final scores: the weights of chosen experts
  __shared__ float s_choice[kCtaMaxExperts];  // score + bias (groups of any size scan these)
  __shared__ float s_warp_max[kCtaWarps];
  __shared__ uint32_t s_group_key[kCtaWarps];
  __shared__ uint32_t s_cand_key[kCtaWarps * kTopkSlots];
  __shared__ int32_t s_cand_e[kCtaWarps * kTopkSlots];
  __shared__ float s_weight[kTopkSlots];
  const int e = int(threadIdx.x), warp = e >> 5, lane = dev::lane_id();
  const int warps = int(blockDim.x >> 5);
  const int64_t t = blockIdx.x;
  const int E = p.experts, k = p.topk;
  const bool valid = e < E;
  const float l = valid ? p.logits[t * E + e] : -INFINITY;

  // 1. scores and selection values, as router_kernel.
  float score;
  if (!p.sigmoid) {
    const float wmax = dev::warp_max(l);
    if (lane == 0) s_warp_max[warp] = wmax;
    __syncthreads();
    float m = s_warp_max[0];
    for (int w = 1; w < warps; ++w) m = fmaxf(m, s_warp_max[w]);
    score = canon::exp(canon::add(l, -m));
    s_exp[e] = score;
    __syncthreads();
    float part = 0.0f;  // router_kernel's lane L: experts L, L + 32, ... in order, then the butterfly
    for (int i = 0; i < warps; ++i)
      if (i * 32 + lane < E) part = canon::add(part, s_exp[i * 32 + lane]);
    score = canon::div(score, dev::warp_tree_sum(part));
  } else {
    score = canon::sigmoid(l);
  }
  const float choice = (p.score_bias != nullptr && valid) ? canon::add(score, p.score_bias[e]) : score;
  uint32_t key = valid ? rank_key(choice) : 0u;
  s_score[e] = score;

  // 2. grouped top-k: every warp derives the same kept groups.
  if (p.n_group > 0) {
    const int group_size = E / p.n_group;
    if (group_size == 32) {  // group g is warp g
      const uint32_t k1 = __reduce_max_sync(dev::kFullMask, key);
      const unsigned first = __reduce_min_sync(dev::kFullMask, key == k1 ? unsigned(lane) : 32u);
      const uint32_t k2 = __reduce_max_sync(dev::kFullMask, unsigned(lane) == first ? 0u : key);
      const float g = p.score_bias != nullptr ? canon::add(key_value(k1), key_value(k2)) : key_value(k1);
      if (lane == 0) s_group_key[warp] = rank_key(g);
    } else {
      s_choice[e] = choice;
    }
    __syncthreads();
    uint32_t keep_groups = 0;
    if (group_size == 32) {  // the best topk_group group keys, lower group first on a tie
      uint32_t gk = lane < p.n_group ? s_group_key[lane] : 0u;
      for (int j = 0; j < p.topk_group; ++j) {
        const uint32_t kmax = __reduce_max_sync(dev::kFullMask, gk);
        const unsigned gb = __reduce_min_sync(dev::kFullMask, gk == kmax ? unsigned(lane) : 32u);
        keep_groups |= 1u << gb;
        if (unsigned(lane) == gb) gk = 0u;
      }
    } else {
      keep_groups = groups_kept_by_scan(s_choice, p, group_size);
    }
    if (valid && !((keep_groups >> (e / group_size)) & 1u)) key = 0u;
  }

  // 3. each warp's k best (key, then lower id); a warp with fewer selectable experts pads with
  // key 0, which never wins the merge (at least k experts are selectable in all).
  for (int j = 0; j < k; ++j) {
    const uint32_t kmax = __reduce_max_sync(dev::kFullMask, key);
    const unsigned best = __reduce_min_sync(dev::kFullMask, key == kmax ? unsigned(e) : 0xffffffffu);
    if (lane == 0) s_cand_key[warp * k + j] = kmax, s_cand_e[warp * k + j] = int(best);
    if (unsigned(e) == best) key = 0u;
  }
  __syncthreads();
  if (warp != 0) return;

  // 4. warp 0 merges the warps·k candidates (at most 4 a lane), best first, as router_kernel.
  constexpr int kPerLane = kCtaWarps * kTopkSlots / 32;
  uint32_t ck[kPerLane];
  int ce[kPerLane];
#pragma unroll
  for (int q = 0; q < kPerLane; ++q) {
    const int c = q * 32 + lane;
    const bool in = c < warps * k;
    ck[q] = in ? s_cand_key[c] : 0u;
    ce[q] = in ? s_cand_e[c] : 0x7fffffff;
  }
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    uint32_t kb = 0u;
    int eb = 0x7fffffff;
#pragma unroll
    for (int q = 0; q < kPerLane; ++q)
      if (ck[q] > kb || (ck[q] == kb && ce[q] < eb)) kb = ck[q], eb = ce[q];
    const uint32_t kmax = __reduce_max_sync(dev::kFullMask, kb);
    const int best = int(__reduce_min_sync(dev::kFullMask, kb == kmax ? unsigned(eb) : 0xffffffffu));
#pragma unroll
    for (int q = 0; q < kPerLane; ++q)
      if (ce[q] == best) ck[q] = 0u;
    const float w = s_score[best];
    sum = canon::add(sum, w);
    if (lane == 0) {
      p.topk_ids[t * k + j] = best;
      s_weight[j] = w;
    }
  }
  __syncwarp();
  if (lane < k) {
    float w = s_weight[lane];
    if (p.renormalize) w = canon::div(w, sum);
    p.topk_weights[t * k + lane] = canon::weight_out(canon::mul(w, p.routed_scaling_factor));
  }
}

}  // namespace moekit::kernels::router
