// forward.cu — the whole layer: route -> align -> up -> down -> combine on the caller's stream,
// in the caller's workspace. No allocation, no host sync: the sequence captures in a CUDA graph.
#include <nvtx3/nvToolsExt.h>

#include "common/validate.hpp"
#include "moekit/moe.hpp"

namespace moekit {

namespace {
// Stages 2-5 on a carved workspace; the callers have checked their arguments (each stage still
// checks its own, cheaply, on the host).
void run_experts(const ForwardPlan& plan, const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_ids,
                 const Tensor& topk_weights, const Tensor& y, const Workspace& ws, cudaStream_t stream) {
  align(plan, topk_ids, ws, stream);
  expert_up(plan, x, w13, ws, stream);
  expert_down(plan, w2, topk_weights, ws, stream);
  if (plan.down_splits > 1)
    combine_partials(ws.y_partials, plan.shape.topk, y, stream);
  else
    combine(ws.y_rows, plan.shape.topk, y, stream);
}
}  // namespace

void experts_forward(const ForwardPlan& plan, const Tensor& x, const Tensor& w13, const Tensor& w2,
                     const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& y,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "experts_forward";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  detail::expect_tensor(fn, "x", x, DType::bf16, {s.tokens, s.hidden});
  detail::expect_tensor(fn, "w13", w13, DType::bf16, {s.experts, 2 * s.inter, s.hidden});
  detail::expect_tensor(fn, "w2", w2, DType::bf16, {s.experts, s.hidden, s.inter});
  detail::expect_tensor(fn, "topk_ids", topk_ids, DType::i32, {s.tokens, s.topk});
  detail::expect_tensor(fn, "topk_weights", topk_weights, DType::f32, {s.tokens, s.topk});
  detail::expect_tensor(fn, "y", y, DType::bf16, {s.tokens, s.hidden});
  const Workspace ws = detail::carve_named(plan, workspace, workspace_bytes, fn, "workspace", "workspace_bytes");
  nvtxRangePushA("moekit.experts_forward");
  run_experts(plan, x, w13, w2, topk_ids, topk_weights, y, ws, stream);
  nvtxRangePop();
}

void moe_forward(const ForwardPlan& plan, const MoeInputs& in, const RouterOptions& opt,
                 const Tensor& y, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "moe_forward";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  // Everything is checked before the first launch: a bad argument leaves no half-run layer.
  detail::expect_tensor(fn, "x", in.x, DType::bf16, {s.tokens, s.hidden});
  detail::expect_tensor(fn, "w13", in.w13, DType::bf16, {s.experts, 2 * s.inter, s.hidden});
  detail::expect_tensor(fn, "w2", in.w2, DType::bf16, {s.experts, s.hidden, s.inter});
  detail::expect_tensor(fn, "y", y, DType::bf16, {s.tokens, s.hidden});
  if (in.router_logits.given())
    detail::expect_tensor(fn, "router_logits", in.router_logits, DType::f32, {s.tokens, s.experts});
  else if (in.w_gate.given())
    detail::expect_tensor(fn, "w_gate", in.w_gate, in.w_gate.dtype == DType::f32 ? DType::f32 : DType::bf16, {s.experts, s.hidden});
  else
    detail::fail(fn, "w_gate", "give router_logits [T, E] or w_gate [E, H]");
  const Workspace ws = detail::carve_named(plan, workspace, workspace_bytes, fn, "workspace", "workspace_bytes");
  nvtxRangePushA("moekit.moe_forward");
  route(in.x, in.w_gate, in.router_logits, in.score_bias, opt, ws.topk_ids, ws.topk_weights, stream,
        ws.router_logits);
  run_experts(plan, in.x, in.w13, in.w2, ws.topk_ids, ws.topk_weights, y, ws, stream);
  nvtxRangePop();
}

}  // namespace moekit
