// forward.cu — the whole layer: route -> align -> up -> down -> combine on the caller's stream, in
// the caller's workspace. Each entry validates everything once, before the first launch (a bad
// argument leaves no half-run layer), then composes the stages' unchecked launchers with the
// plan's kernels. No allocation, no host sync: the sequence captures in a CUDA graph.
#include <nvtx3/nvToolsExt.h>

#include "align/launch.hpp"
#include "combine/launch.hpp"
#include "common/validate.hpp"
#include "gemm/launch.hpp"
#include "moekit/moe.hpp"
#include "router/launch.hpp"
#include "tuning/workspace.hpp"

namespace moekit {

namespace {
// The expert weights and the output, as both entries take them.
void expect_experts(const char* fn, const MoeShape& s, const Tensor& x, const Tensor& w13, const Tensor& w2,
                    const Tensor& y) {
  detail::expect_tensor(fn, "x", x, DType::bf16, {s.tokens, s.hidden});
  detail::expect_tensor(fn, "w13", w13, DType::bf16, {s.experts, 2 * s.inter, s.hidden});
  detail::expect_tensor(fn, "w2", w2, DType::bf16, {s.experts, s.hidden, s.inter});
  detail::expect_tensor(fn, "y", y, DType::bf16, {s.tokens, s.hidden});
}

// Stages 2-5 on a carved workspace, arguments validated.
void run_experts(const ForwardPlan& plan, const void* x, const void* w13, const void* w2, const int32_t* topk_ids,
                 const float* topk_weights, void* y, const Workspace& ws, cudaStream_t stream) {
  const MoeShape& s = plan.shape;
  detail::launch_align(plan.align, topk_ids, s.tokens * s.topk, int(s.experts), plan.block_m(),
                       detail::align_outputs(plan, ws), stream);
  detail::launch_expert_up(plan, x, w13, ws, stream);
  detail::launch_expert_down(plan, w2, topk_weights, ws, stream);
  if (plan.down_splits > 1)
    detail::launch_combine_partials(ws.y_partials.as<const float>(), plan.down_splits, y, s.tokens, s.hidden,
                                    int(s.topk), stream);
  else
    detail::launch_combine(ws.y_rows.data, nullptr, y, s.tokens, s.hidden, int(s.topk), stream);
}
}  // namespace

void experts_forward(const ForwardPlan& plan, const Tensor& x, const Tensor& w13, const Tensor& w2,
                     const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& y, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "experts_forward";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  expect_experts(fn, s, x, w13, w2, y);
  detail::expect_tensor(fn, "topk_ids", topk_ids, DType::i32, {s.tokens, s.topk});
  detail::expect_tensor(fn, "topk_weights", topk_weights, DType::f32, {s.tokens, s.topk});
  const Workspace ws = detail::carve_named(plan, workspace, workspace_bytes, fn, "workspace", "workspace_bytes");
  nvtxRangePushA("moekit.experts_forward");
  run_experts(plan, x.data, w13.data, w2.data, topk_ids.as<const int32_t>(), topk_weights.as<const float>(), y.data,
              ws, stream);
  nvtxRangePop();
}

void moe_forward(const ForwardPlan& plan, const MoeInputs& in, const RouterOptions& opt, const Tensor& y,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "moe_forward";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  expect_experts(fn, s, in.x, in.w13, in.w2, y);
  // The router's inputs against the plan's E and H, as route() checks them otherwise.
  detail::expect_router_inputs(fn, "router_logits", in.x, in.w_gate, in.router_logits, in.score_bias, opt, s.tokens,
                               s.topk, s.experts, s.hidden);
  const Workspace ws = detail::carve_named(plan, workspace, workspace_bytes, fn, "workspace", "workspace_bytes");
  nvtxRangePushA("moekit.moe_forward");
  detail::launch_route(plan.router,
                       detail::router_params(in.x, in.w_gate, in.router_logits, in.score_bias, opt,
                                             ws.topk_ids.as<int32_t>(), ws.topk_weights.as<float>(), s.tokens,
                                             s.experts, s.topk),
                       in.w_gate.dtype, ws.router_logits.as<float>(), stream);
  run_experts(plan, in.x.data, in.w13.data, in.w2.data, ws.topk_ids.as<const int32_t>(),
              ws.topk_weights.as<const float>(), y.data, ws, stream);
  nvtxRangePop();
}

}  // namespace moekit
