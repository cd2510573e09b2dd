// forward.cu — the whole layer: route -> align -> up -> down -> combine on the caller's stream, in
// the caller's workspace. Each entry validates everything once, before the first launch (a bad
// argument leaves no half-run layer), then composes the stages' unchecked launchers with the
// plan's kernels. No allocation, no host sync: the sequence captures in a CUDA graph.
// FP8 plans quantize x per token and 128 columns (ws.x_q, ws.x_scale): in moe_forward's router,
// whose gate kernel reads x anyway (RouterPlan::quantize_x), else in a pass before align; the
// GEMMs read e4m3 weights with their block scales (docs/design.md, "FP8").
// The opt-in load counter (expert_load) is added to inside align's kernel: no launch of its own.
// The training forward (plan.save_h) writes h from the up GEMM's epilogue: no launch of its own.
#include <nvtx3/nvToolsExt.h>

#include <vector>

#include "align/launch.hpp"
#include "combine/launch.hpp"
#include "common/validate.hpp"
#include "gemm/launch.hpp"
#include "moekit/moe.hpp"
#include "quant/launch.hpp"
#include "router/launch.hpp"
#include "tuning/workspace.hpp"

namespace moekit {

namespace {
// The expert weights (of the plan's precision) and the output, as both entries take them.
void expect_experts(const char* fn, const ForwardPlan& plan, const Tensor& x, const ExpertWeights& w,
                    const Tensor& y) {
  const MoeShape& s = plan.shape;
  detail::expect_tensor(fn, "x", x, DType::bf16, {s.tokens, s.hidden});
  detail::expect_expert_weights(fn, plan, "w13", w.w13, "w13_scale", w.w13_scale, 2 * s.inter, s.hidden,
                                w13_scale_rows(s.inter));
  detail::expect_expert_weights(fn, plan, "w2", w.w2, "w2_scale", w.w2_scale, s.hidden, s.inter, fp8_blocks(s.hidden));
  detail::expect_tensor(fn, "y", y, DType::bf16, {s.tokens, s.hidden});
}

// What both entries read or write besides their routing: the load counter may share no byte with
// any of it (nor with the entry's routing or router inputs, which each entry adds).
std::vector<detail::Span> layer_spans(const ForwardPlan& plan, const Tensor& x, const ExpertWeights& w,
                                      const Tensor& y, const void* workspace) {
  using detail::span_of;
  return {span_of("x", x), span_of("w13", w.w13), span_of("w2", w.w2), span_of("w13_scale", w.w13_scale),
          span_of("w2_scale", w.w2_scale), span_of("y", y), span_of("workspace", workspace, workspace_bytes(plan))};
}

// Stages 2-5 on a carved workspace, arguments validated (fp8: the tokens quantized first, unless
// the router did: x_quantized).
void run_experts(const ForwardPlan& plan, const void* x, const ExpertWeights& w, const int32_t* topk_ids,
                 const float* topk_weights, void* y, const Workspace& ws, int64_t* expert_load, void* h,
                 cudaStream_t stream, bool x_quantized = false) {
  const MoeShape& s = plan.shape;
  const bool fp8 = plan.precision() == Precision::fp8;
  if (fp8 && !x_quantized)
    detail::launch_quantize_tokens(x, s.tokens, s.hidden, ws.x_q.data, ws.x_scale.as<float>(), stream);
  detail::launch_align(plan.align, topk_ids, s.tokens * s.topk, int(s.experts), plan.block_m(),
                       detail::align_outputs(plan, ws), expert_load, stream);
  // The up -> down boundary (Params::boundary) where it was measured, both GEMMs on mma.sync in
  // an FP8 plan: the Qwen3 layer 1-4% faster at T = 2-64, DeepSeek-V3 and Mixtral T=1 1-4%, but
  // Qwen3 T=1 3.5% slower; bf16 gained nowhere (docs/perf/NOTES.md, "Decode GEMM").
  const bool boundary =
      fp8 && plan.up.kernel == GemmKernel::mma_sync && plan.down.kernel == GemmKernel::mma_sync;
  detail::launch_expert_up(plan, fp8 ? ws.x_q.data : x, w.w13.data, ws, stream, w.w13_scale.as<const float>(), h,
                           boundary);
  // k = 1, unsplit: y_rows [T·1, H] has y's shape, row a is token a, and combine's one-term sum
  // returns each row's bf16 bits, so the down GEMM stores y itself and combine's launch (a read and
  // a write of T·H·2 bytes) goes. ws.y_rows is then not written.
  const bool rows_are_y = s.topk == 1 && plan.down_splits == 1;
  detail::launch_expert_down(plan, w.w2.data, topk_weights, ws, stream, w.w2_scale.as<const float>(), boundary,
                             rows_are_y ? y : nullptr);
  if (plan.down_splits > 1)
    detail::launch_combine_partials(ws.y_partials.as<const float>(), plan.down_splits, y, s.tokens, s.hidden,
                                    int(s.topk), stream);
  else if (!rows_are_y)
    detail::launch_combine(ws.y_rows.data, nullptr, y, s.tokens, s.hidden, int(s.topk), stream);
}
}  // namespace

void experts_forward(const ForwardPlan& plan, const Tensor& x, const Tensor& w13, const Tensor& w2,
                     const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& y, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream, const Tensor& expert_load, const Tensor& h) {
  experts_forward(plan, x, ExpertWeights{w13, w2, {}, {}}, topk_ids, topk_weights, y, workspace, workspace_bytes,
                  stream, expert_load, h);
}

void experts_forward(const ForwardPlan& plan, const Tensor& x, const ExpertWeights& w, const Tensor& topk_ids,
                     const Tensor& topk_weights, const Tensor& y, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream, const Tensor& expert_load, const Tensor& h) {
  const char* fn = "experts_forward";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  expect_experts(fn, plan, x, w, y);
  detail::expect_tensor(fn, "topk_ids", topk_ids, DType::i32, {s.tokens, s.topk});
  detail::expect_tensor(fn, "topk_weights", topk_weights, DType::f32, {s.tokens, s.topk});
  const Workspace ws = detail::carve_named(plan, workspace, workspace_bytes, fn, "workspace", "workspace_bytes");
  std::vector<detail::Span> spans;  // what h and expert_load may not alias: built only when one is given
  if (plan.save_h || expert_load.given()) {
    spans = layer_spans(plan, x, w, y, workspace);
    spans.push_back(detail::span_of("topk_ids", topk_ids));
    spans.push_back(detail::span_of("topk_weights", topk_weights));
  }
  detail::expect_saved_h(fn, plan, h, spans);
  if (expert_load.given()) {
    spans.push_back(detail::span_of("h", h));
    detail::expect_expert_load(fn, expert_load, s.experts, spans);
  }
  nvtxRangePushA("moekit.experts_forward");
  run_experts(plan, x.data, w, topk_ids.as<const int32_t>(), topk_weights.as<const float>(), y.data, ws,
              expert_load.as<int64_t>(), h.data, stream);
  nvtxRangePop();
}

void moe_forward(const ForwardPlan& plan, const MoeInputs& in, const RouterOptions& opt, const Tensor& y,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream, const Tensor& expert_load,
                 const Tensor& h) {
  const char* fn = "moe_forward";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  const ExpertWeights w{in.w13, in.w2, in.w13_scale, in.w2_scale};
  expect_experts(fn, plan, in.x, w, y);
  // The router's inputs against the plan's E and H, as route() checks them otherwise.
  detail::expect_router_inputs(fn, "router_logits", in.x, in.w_gate, in.router_logits, in.score_bias, opt, s.tokens,
                               s.topk, s.experts, s.hidden);
  const Workspace ws = detail::carve_named(plan, workspace, workspace_bytes, fn, "workspace", "workspace_bytes");
  std::vector<detail::Span> spans;  // what h and expert_load may not alias: built only when one is given
  if (plan.save_h || expert_load.given()) {
    spans = layer_spans(plan, in.x, w, y, workspace);
    spans.push_back(detail::span_of("w_gate", in.w_gate));
    spans.push_back(detail::span_of("router_logits", in.router_logits));
    spans.push_back(detail::span_of("score_bias", in.score_bias));
  }
  detail::expect_saved_h(fn, plan, h, spans);
  if (expert_load.given()) {
    spans.push_back(detail::span_of("h", h));
    detail::expect_expert_load(fn, expert_load, s.experts, spans);
  }
  nvtxRangePushA("moekit.moe_forward");
  const detail::XQuant xq = plan.precision() == Precision::fp8
                                ? detail::XQuant{static_cast<uint8_t*>(ws.x_q.data), ws.x_scale.as<float>()}
                                : detail::XQuant{};
  const bool x_quantized =
      detail::launch_route(plan.router,
                           detail::router_params(in.x, in.w_gate, in.router_logits, in.score_bias, opt,
                                                 ws.topk_ids.as<int32_t>(), ws.topk_weights.as<float>(), s.tokens,
                                                 s.experts, s.topk),
                           in.w_gate.dtype, ws.router_logits.as<float>(), stream, xq);
  run_experts(plan, in.x.data, w, ws.topk_ids.as<const int32_t>(), ws.topk_weights.as<const float>(), y.data, ws,
              expert_load.as<int64_t>(), h.data, stream, x_quantized);
  nvtxRangePop();
}

}  // namespace moekit
