// expert_gemm.cu — stages 3 and 4 on the host: the public entries expert_up / expert_down
// (validate, then launch) and the internal launchers the layer composes, which fill the GEMM
// parameters from the plan and the workspace and hand them to the family of the plan's config:
// mma_sync/launch.cu (decode tiles) or sm90/launch.cu (128-row wgmma tiles).
#include <nvtx3/nvToolsExt.h>

#include <vector>

#include "common/validate.hpp"
#include "gemm/launch.hpp"

namespace moekit {

namespace detail {
namespace {

using kernels::gemm::Mode;
using kernels::gemm::Params;

Params routing_params(const ForwardPlan& plan, const Workspace& ws) {
  Params p{};
  p.sorted_ids = ws.sorted_ids.as<const int32_t>();
  p.block_expert = ws.block_expert.as<const int32_t>();
  p.num_rows_padded = ws.num_rows_padded.as<const int32_t>();
  p.tile_counter = ws.gemm_counter.as<int32_t>();
  p.num_assign = plan.shape.tokens * plan.shape.topk;
  p.topk = int(plan.shape.topk);
  p.k_splits = 1;
  p.max_blocks = plan.max_blocks();
  p.experts = plan.shape.experts;
  return p;
}

// FP8 rows as the loaders address them: 2-byte units (gemm/params.hpp).
void in_units(Params& p) {
  p.k_dim /= 2;
  p.b_expert_stride /= 2;
}

void launch(Mode mode, const ForwardPlan& plan, const GemmConfig& c, const Params& p, cudaStream_t stream) {
  if (c.kernel == GemmKernel::wgmma)
    launch_sm90_expert_gemm(mode, p, plan, stream, c.block_n);
  else
    launch_mma_sync_gemm(mode, c, p, plan.max_blocks(), stream);
}

}  // namespace

void launch_expert_up(const ForwardPlan& plan, const void* x, const void* w13, const Workspace& ws,
                      cudaStream_t stream, const float* w13_scale, void* h, bool boundary) {
  const MoeShape& s = plan.shape;
  if (s.tokens == 0) return;
  Params p = routing_params(plan, ws);
  p.a = static_cast<const __nv_bfloat16*>(x);
  p.b = static_cast<const __nv_bfloat16*>(w13);
  p.out = ws.act.as<__nv_bfloat16>();
  p.k_dim = s.hidden;
  p.n_dim = s.inter;
  p.b_expert_stride = 2 * s.inter * s.hidden;
  if (plan.precision() == Precision::fp8) {
    in_units(p);
    p.a_scale = ws.x_scale.as<const float>();
    p.b_scale = w13_scale;
    p.out_scale = ws.act_scale.as<float>();
    p.b_up_block0 = fp8_blocks(s.inter);
    p.b_scale_expert_stride = w13_scale_rows(s.inter) * fp8_blocks(s.hidden);
  }
  if (plan.save_h) p.h_out = static_cast<__nv_bfloat16*>(h);  // bf16 plans only (expect_plan)
  p.boundary = boundary;
  nvtxRangePushA("moekit.expert_up");
  launch(plan.save_h ? Mode::UpSaveH : Mode::Up, plan, plan.up, p, stream);
  nvtxRangePop();
}

void launch_expert_down(const ForwardPlan& plan, const void* w2, const float* topk_weights, const Workspace& ws,
                        cudaStream_t stream, const float* w2_scale, bool boundary, void* rows) {
  const MoeShape& s = plan.shape;
  if (s.tokens == 0) return;
  Params p = routing_params(plan, ws);
  p.a = ws.act.as<const __nv_bfloat16>();
  p.b = static_cast<const __nv_bfloat16*>(w2);
  p.out = rows ? static_cast<__nv_bfloat16*>(rows) : ws.y_rows.as<__nv_bfloat16>();
  p.topk_weights = topk_weights;
  p.boundary = boundary;
  if (plan.down_splits > 1) {
    p.k_splits = plan.down_splits;
    p.partials = ws.y_partials.as<float>();
  }
  p.k_dim = s.inter;
  p.n_dim = s.hidden;
  p.b_expert_stride = s.hidden * s.inter;
  if (plan.precision() == Precision::fp8) {
    in_units(p);
    p.a_scale = ws.act_scale.as<const float>();
    p.b_scale = w2_scale;
    p.b_scale_expert_stride = fp8_blocks(s.hidden) * fp8_blocks(s.inter);
  }
  nvtxRangePushA("moekit.expert_down");
  launch(Mode::Down, plan, plan.down, p, stream);
  nvtxRangePop();
}

}  // namespace detail

void expert_up(const ForwardPlan& plan, const Tensor& x, const Tensor& w13, const Workspace& ws,
               cudaStream_t stream, const Tensor& w13_scale, const Tensor& h) {
  const char* fn = "expert_up";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  const bool fp8 = plan.precision() == Precision::fp8;
  detail::expect_tensor(fn, "x", x, fp8 ? DType::e4m3 : DType::bf16, {s.tokens, s.hidden});
  detail::expect_expert_weights(fn, plan, "w13", w13, "w13_scale", w13_scale, 2 * s.inter, s.hidden,
                                 w13_scale_rows(s.inter));
  detail::expect_workspace(plan, ws, fn);
  if (fp8 && x.data != ws.x_q.data)
    detail::fail(fn, "x", "an fp8 plan's up GEMM reads ws.x_q (with ws.x_scale, from quantize_tokens): pass ws.x_q");
  using detail::span_of;
  std::vector<detail::Span> spans;  // what h may not alias: built only when the plan saves h
  if (plan.save_h)
    spans = {span_of("x", x), span_of("w13", w13), span_of("ws.act", ws.act), span_of("ws.sorted_ids", ws.sorted_ids),
             span_of("ws.block_expert", ws.block_expert), span_of("ws.num_rows_padded", ws.num_rows_padded)};
  detail::expect_saved_h(fn, plan, h, spans);
  detail::launch_expert_up(plan, x.data, w13.data, ws, stream, w13_scale.as<const float>(), h.data);
}

void expert_down(const ForwardPlan& plan, const Tensor& w2, const Tensor& topk_weights, const Workspace& ws,
                 cudaStream_t stream, const Tensor& w2_scale) {
  const char* fn = "expert_down";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  detail::expect_expert_weights(fn, plan, "w2", w2, "w2_scale", w2_scale, s.hidden, s.inter, fp8_blocks(s.hidden));
  detail::expect_tensor(fn, "topk_weights", topk_weights, DType::f32, {s.tokens, s.topk});
  detail::expect_workspace(plan, ws, fn);
  detail::launch_expert_down(plan, w2.data, topk_weights.as<const float>(), ws, stream, w2_scale.as<const float>());
}

}  // namespace moekit
