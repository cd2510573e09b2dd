// backward_plan.cpp — plan_backward, the one planner's entry for the backward pass: from the
// forward's plan (its aligned layout's block_m and its GEMM configs, which the backward's GEMMs
// over the same rows per expert reuse until they are tuned) and the options, every choice of the
// backward — its GEMM configs, the split-K of dx, dW and d_w_gate — and so its workspace size;
// and the checks that a plan's choices can run (expect_backward_plan). Pure host code, unit-tested on the CPU (tests/cpu/backward_plan_test.cpp).
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/validate.hpp"
#include "moekit/backward.hpp"
#include "tuning/backward_planner.hpp"
#include "tuning/planner.hpp"

namespace moekit::tuning {

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int plan_weight_grad_splits(const MoeShape& s, const DeviceInfo& device) {
  const int64_t assignments = s.tokens * s.topk;
  if (assignments == 0) return 1;
  const int64_t touched = std::min(s.experts, assignments);
  const int64_t rows_per_expert = ceil_div(assignments, touched);
  // dW13 [2F, H] and dW2 [H, F] of each touched expert.
  const int64_t tiles_per_expert = ceil_div(2 * s.inter, kWeightGradTileM) * ceil_div(s.hidden, kWeightGradTileN) +
                                   ceil_div(s.hidden, kWeightGradTileM) * ceil_div(s.inter, kWeightGradTileN);
  return plan_splits(touched * tiles_per_expert, ceil_div(rows_per_expert, kWeightGradTileK), device.sm_count,
                     kMaxWeightGradSplits);
}

int plan_backward_tile_rows(const MoeShape& s, int block_m) {
  if (block_m < 64) return 16;
  const int64_t assignments = s.tokens * s.topk;
  const int64_t touched = std::max<int64_t>(1, std::min(s.experts, assignments));
  return block_m >= 128 && assignments / touched >= kWideTileRowsPerExpert ? 128 : 64;
}

int plan_gate_grad_splits(const MoeShape& s, const DeviceInfo& device) {
  const int64_t bm = gate_grad_tile(s.experts);
  const int64_t tiles = ceil_div(s.experts, bm) * ceil_div(s.hidden, bm);
  return plan_splits(tiles, ceil_div(s.tokens, kWeightGradTileK), device.sm_count, kMaxGateGradSplits);
}

}  // namespace moekit::tuning

namespace moekit::detail {

namespace {

void expect_compiled(const char* entry, const char* which, const GemmConfig& c, int block_m) {
  const auto& compiled = compiled_gemm_configs(Precision::bf16);
  if (std::find(compiled.begin(), compiled.end(), c) == compiled.end())
    fail(entry, "plan", std::string("its ") + which + " config " + c.str() +
                            " is not a compiled bf16 one: make plans with plan_backward");
  if (c.block_m != block_m)
    fail(entry, "plan", std::string("its ") + which + " config " + c.str() + " does not have the layout's block_m " +
                            std::to_string(block_m) + ": make plans with plan_backward");
}

void expect_splits(const char* entry, const char* which, int splits, int max_splits) {
  if (splits < 1 || splits > max_splits)
    fail(entry, "plan", std::string(which) + " " + std::to_string(splits) + " is outside [1, " +
                            std::to_string(max_splits) + "]: make plans with plan_backward");
}

}  // namespace

void expect_backward_options(const BackwardOptions& o, const char* entry) {
  if (o.saved != SavedActivations::recompute && o.saved != SavedActivations::h)
    fail(entry, "options.saved", "must be SavedActivations::recompute or ::h, got " + std::to_string(int(o.saved)));
  if (o.router != RouterGrad::none && o.router != RouterGrad::logits && o.router != RouterGrad::gate)
    fail(entry, "options.router", "must be RouterGrad::none, ::logits or ::gate, got " + std::to_string(int(o.router)));
  if (o.weight_grad_dtype != DType::bf16 && o.weight_grad_dtype != DType::f32)
    fail(entry, "options.weight_grad_dtype",
         std::string("must be bf16 or f32, got ") + dtype_name(o.weight_grad_dtype));
  if (o.accumulate_weight_grads && !o.weight_grads)
    fail(entry, "options.accumulate_weight_grads", "accumulates weight gradients, but options.weight_grads is false");
  if (o.accumulate_weight_grads && o.weight_grad_dtype != DType::f32)
    fail(entry, "options.accumulate_weight_grads",
         "accumulates into f32 weight gradients only (a bf16 sum would round at every step): set weight_grad_dtype = f32");
}

void expect_backward_plan(const BackwardPlan& p, const char* entry) {
  expect_shape(p.shape, entry);
  expect_backward_options(p.options, entry);
  const auto& compiled = compiled_gemm_configs(Precision::bf16);
  if (std::none_of(compiled.begin(), compiled.end(), [&](const GemmConfig& c) { return c.block_m == p.block_m; }))
    fail(entry, "plan", "block_m " + std::to_string(p.block_m) +
                            " is no compiled tile's: the layout comes from a forward plan; make plans with plan_backward");
  expect_compiled(entry, "up", p.up, p.block_m);
  expect_compiled(entry, "d", p.d, p.block_m);
  expect_compiled(entry, "dx", p.dx, p.block_m);
  expect_splits(entry, "dx_splits", p.dx_splits, kMaxDownSplits);
  if (p.dx_splits > 1 && p.dx.kernel != GemmKernel::mma_sync)
    fail(entry, "plan", "dx_splits > 1 needs an mma_sync dx config (the wgmma GEMMs write whole rows): make plans with plan_backward");
  expect_splits(entry, "dw_splits", p.dw_splits, kMaxWeightGradSplits);
  if (p.h_wgmma && (p.block_m != 128 || p.options.saved != SavedActivations::recompute))
    fail(entry, "plan", "h_wgmma needs block_m 128 and SavedActivations::recompute (got block_m " +
                            std::to_string(p.block_m) + "): make plans with plan_backward");
  if (p.d_wgmma && p.block_m != 128)
    fail(entry, "plan", "d_wgmma needs block_m 128 (got " + std::to_string(p.block_m) + "): make plans with plan_backward");
  if (p.dx_wgmma && (p.block_m != 128 || p.dx_splits != 1 || !p.options.input_grad))
    fail(entry, "plan", "dx_wgmma needs block_m 128, dx_splits 1 and options.input_grad (got block_m " +
                            std::to_string(p.block_m) + ", dx_splits " + std::to_string(p.dx_splits) +
                            "): make plans with plan_backward");
  if (p.dw_wgmma && !p.options.weight_grads)
    fail(entry, "plan", "dw_wgmma needs options.weight_grads: make plans with plan_backward");
  if (p.dw_wgmma && tuning::wgmma_weight_grad_items(p.shape, p.dw_splits) > int64_t(INT32_MAX))
    fail(entry, "plan", "dw_wgmma: the weight gradients' " +
                            std::to_string(tuning::wgmma_weight_grad_items(p.shape, p.dw_splits)) +
                            " tiles exceed the wgmma kernel's 32-bit work items: make plans with plan_backward");
  if ((p.tile_rows != 16 && p.tile_rows != 64 && p.tile_rows != 128) || p.block_m % p.tile_rows != 0)
    fail(entry, "plan", "tile_rows " + std::to_string(p.tile_rows) + " must be 16, 64 or 128 and divide block_m " +
                            std::to_string(p.block_m) + ": make plans with plan_backward");
  expect_splits(entry, "gate_splits", p.gate_splits, kMaxGateGradSplits);
}

}  // namespace moekit::detail

namespace moekit {

const char* saved_activations_name(SavedActivations s) { return s == SavedActivations::h ? "h" : "recompute"; }
const char* router_grad_name(RouterGrad r) {
  return r == RouterGrad::gate ? "gate" : r == RouterGrad::logits ? "logits" : "none";
}

std::string BackwardPlan::str() const {
  const BackwardOptions& o = options;
  std::string grads;
  if (o.input_grad) grads += "dx";
  if (o.weight_grads)
    grads += std::string(grads.empty() ? "" : ",") + "dw(" + dtype_name(o.weight_grad_dtype) +
             (o.accumulate_weight_grads ? ",accumulate" : "") + ")";
  return "backward T=" + std::to_string(shape.tokens) + " H=" + std::to_string(shape.hidden) +
         " F=" + std::to_string(shape.inter) + " E=" + std::to_string(shape.experts) + " k=" +
         std::to_string(shape.topk) + " block_m=" + std::to_string(block_m) + " saved=" +
         saved_activations_name(o.saved) + " router=" + router_grad_name(o.router) +
         " grads=" + (grads.empty() ? "none" : grads) + " tiles=mma_sync-m" + std::to_string(ragged_tile_rows()) +
         "n" + std::to_string(ragged_tile_cols()) + " from:" +
         (o.saved == SavedActivations::recompute ? " up=" + up.str() : "") + " d=" + d.str() +
         (o.input_grad ? " dx=" + dx.str() : "") + (dx_splits > 1 ? " dx_splits=" + std::to_string(dx_splits) : "") +
         (h_wgmma ? " h_gemm=wgmma-m128n256" : "") + (d_wgmma ? " d_gemm=wgmma-m128n256" : "") +
         (dx_wgmma ? " dx_gemm=wgmma-m128n256" : "") + (dw_wgmma ? " dw_gemm=wgmma-m128n256" : "") +
         (dw_splits > 1 ? " dw_splits=" + std::to_string(dw_splits) : "") +
         (gate_splits > 1 ? " gate_splits=" + std::to_string(gate_splits) : "") + " source=" + source;
}

int64_t tuning::wgmma_weight_grad_items(const MoeShape& s, int splits) {
  auto tiles = [](int64_t m, int64_t n) {
    return (m + kWgmmaWeightGradTileM - 1) / kWgmmaWeightGradTileM * ((n + kWgmmaWeightGradTileN - 1) / kWgmmaWeightGradTileN);
  };
  // < 2^63: E <= 512, splits <= 8 and each tile count < 2^21 · 2^13 (the shape's limits)
  return s.experts * splits * std::max(tiles(2 * s.inter, s.hidden), tiles(s.hidden, s.inter));
}

void use_wgmma_gemms(BackwardPlan& p, bool h, bool d, bool dx, bool dw) {
  const bool wgmma = p.block_m == 128;
  p.h_wgmma = wgmma && h && p.options.saved == SavedActivations::recompute;
  p.d_wgmma = wgmma && d;
  p.dx_wgmma = wgmma && dx && p.dx_splits == 1 && p.options.input_grad;
  // dW reads its K range from expert_row_start and expert_counts (rows past the count copy zeros),
  // not from the layout's blocks: any block_m.
  p.dw_wgmma = dw && p.options.weight_grads && tuning::wgmma_weight_grad_items(p.shape, p.dw_splits) <= int64_t(INT32_MAX);
}

BackwardPlan plan_backward(const ForwardPlan& forward, const DeviceInfo& device, const BackwardOptions& options) {
  constexpr const char* kEntry = "plan_backward";
  detail::expect_hopper(device, kEntry);
  detail::expect_plan(forward, kEntry);  // errors name it as the forward entries do: 'shape.*', 'plan'
  if (forward.precision() != Precision::bf16)
    detail::fail(kEntry, "plan", std::string("the backward is bf16 only; a forward of precision ") +
                                     precision_name(forward.precision()) + " has none yet: plan the forward with Precision::bf16");
  detail::expect_backward_options(options, kEntry);

  BackwardPlan p;
  p.shape = forward.shape;
  p.block_m = forward.block_m();
  p.options = options;
  p.up = forward.up;
  p.d = forward.up;
  p.dx = forward.down;
  // The dx GEMM is the down GEMM's shape with K = 2F: the forward's split-K rule at that K.
  MoeShape dx_shape = forward.shape;
  dx_shape.inter = 2 * forward.shape.inter;
  p.dx_splits = options.input_grad ? tuning::plan_down_splits(dx_shape, forward.down, device) : 1;
  p.dw_splits = options.weight_grads ? tuning::plan_weight_grad_splits(forward.shape, device) : 1;
  p.gate_splits = options.router == RouterGrad::gate ? tuning::plan_gate_grad_splits(forward.shape, device) : 1;
  p.tile_rows = tuning::plan_backward_tile_rows(forward.shape, p.block_m);
  // h, D and dx on the wgmma kernels wherever the layout allows it (block_m 128), dW at every
  // block_m: faster than the mma.sync tile at every measured T (docs/perf/NOTES.md, "Backward").
  use_wgmma_gemms(p);
  p.source = "forward:" + forward.source;
  return p;
}

}  // namespace moekit
