// launch.hpp — stage 1's internal launcher (host-only) and the one validation of its inputs, which
// route() and moe_forward share. The launcher is unchecked and enqueues only: graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/moe.hpp"
#include "router/params.hpp"

namespace moekit::detail {

// The router's inputs for T tokens and top-k: logits [T, E] f32, or x [T, H] bf16 with w_gate
// [E, H] bf16/f32; score_bias [E] f32 (optional); opt's grouped top-k. E and H come from the
// tensors, or are checked against `experts` and `hidden` when those are given (> 0: a plan's).
// Returns E. Throws moekit::Error naming the argument (as `entry`'s; the logits are `logits_arg`).
int64_t expect_router_inputs(const char* entry, const char* logits_arg, const Tensor& x, const Tensor& w_gate,
                             const Tensor& logits, const Tensor& score_bias, const RouterOptions& opt, int64_t tokens,
                             int64_t topk, int64_t experts = 0, int64_t hidden = 0);

// The selection's parameters from validated inputs (logits null when they are computed).
kernels::router::Params router_params(const Tensor& x, const Tensor& w_gate, const Tensor& logits,
                                      const Tensor& score_bias, const RouterOptions& opt, int32_t* topk_ids,
                                      float* topk_weights, int64_t tokens, int64_t experts, int64_t topk);

// Where an FP8 layer's router puts x quantized (ws.x_q [T, H] e4m3, ws.x_scale [T, ceil(H/128)]).
struct XQuant {
  uint8_t* q = nullptr;
  float* scale = nullptr;
};

// Whether launch_route quantizes x on the way (the plan asks, and its gate kernel runs on a bf16
// w_gate: logits computed into a scratch, a cluster tiling).
bool route_quantizes_x(const RouterPlan& plan, const kernels::router::Params& p, DType w_gate_dtype,
                       const float* logits_scratch);

// Stage 1 with plan's kernels: when p.logits is null and logits_scratch is given, the logits are
// computed into it first (bf16 w_gate: plan.gate on the tensor cores; f32: the CUDA cores), then
// selected with plan.select; without a scratch one warp per token computes and selects. With `xq`
// given and route_quantizes_x, the gate also writes x quantized, bitwise quantize_tokens'; returns
// whether it did.
bool launch_route(const RouterPlan& plan, kernels::router::Params p, DType w_gate_dtype, float* logits_scratch,
                  cudaStream_t stream, const XQuant& xq = {});

}  // namespace moekit::detail
