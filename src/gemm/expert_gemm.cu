// expert_gemm.cu — stages 3-4 launchers: validate, then run the compiled config the plan names.
// The grid is persistent (SMs x resident CTAs, at most the worst-case number of tiles); the
// kernel reads the true number of blocks from the device.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "common/validate.hpp"
#include "gemm/configs.hpp"
#include "gemm/expert_gemm.cuh"
#include "gemm/sm90_expert_gemm.hpp"

namespace moekit {

namespace {

template <kernels::gemm::Mode M, int BM, int BN, int BK, int WM, int WN, int ST>
void launch_instance(kernels::gemm::Params p, int64_t max_blocks, cudaStream_t stream) {
  using Cfg = kernels::gemm::Tile<BM, BN, BK, WM, WN, ST>;
  auto kernel = kernels::gemm::expert_gemm_kernel<M, BM, BN, BK, WM, WN, ST>;
  // Once per instance and device: raise the shared-memory limit and size the persistent grid
  // from the device (SM count x resident CTAs). Not per call: keeps the hot path free of queries.
  static detail::PerDevice<int64_t> resident;
  const int64_t resident_ctas = resident.get([&](int device) {
    MK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes)));
    int sms = 0, per_sm = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads, Cfg::kSmemBytes));
    return int64_t(sms) * std::max(per_sm, 1);
  });
  const int64_t cols = Cfg::template cols_per_tile<M>();
  p.n_tiles = (p.n_dim + cols - 1) / cols;
  const int64_t k_tiles = (p.k_dim + BK - 1) / BK;
  p.k_tiles_per_split = (k_tiles + p.k_splits - 1) / p.k_splits;
  const int64_t grid = std::max<int64_t>(1, std::min(resident_ctas, max_blocks * p.n_tiles * p.k_splits));
  detail::launch_pdl("expert_gemm_kernel", kernel, dim3(unsigned(grid)), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, p);
}

template <kernels::gemm::Mode M>
void dispatch(const ForwardPlan& plan, const GemmConfig& c, const kernels::gemm::Params& p, int64_t max_blocks,
              cudaStream_t stream) {
  if (c.kernel == GemmKernel::wgmma) {
    detail::launch_sm90_expert_gemm(M, p, plan, stream, c.block_n);
    return;
  }
#define MK_DISPATCH(bm, bn, bk, wm, wn, st)                                                   \
  if (c == GemmConfig{bm, bn, bk, wm, wn, st, GemmKernel::mma_sync}) {                                              \
    launch_instance<M, bm, bn, bk, wm, wn, st>(p, max_blocks, stream);                        \
    return;                                                                                   \
  }
  MOEKIT_GEMM_CONFIGS(MK_DISPATCH)
#undef MK_DISPATCH
  detail::fail("expert_gemm", "plan", "config " + c.str() + " is not compiled");
}

kernels::gemm::Params routing_params(const ForwardPlan& plan, const Workspace& ws) {
  kernels::gemm::Params p{};
  p.sorted_ids = ws.sorted_ids.as<const int32_t>();
  p.block_expert = ws.block_expert.as<const int32_t>();
  p.num_rows_padded = ws.num_rows_padded.as<const int32_t>();
  p.tile_counter = ws.gemm_counter.as<int32_t>();
  p.num_assign = plan.shape.tokens * plan.shape.topk;
  p.topk = int(plan.shape.topk);
  p.k_splits = 1;
  return p;
}

}  // namespace

void expert_up(const ForwardPlan& plan, const Tensor& x, const Tensor& w13, const Workspace& ws,
               cudaStream_t stream) {
  const char* fn = "expert_up";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  detail::expect_tensor(fn, "x", x, DType::bf16, {s.tokens, s.hidden});
  detail::expect_tensor(fn, "w13", w13, DType::bf16, {s.experts, 2 * s.inter, s.hidden});
  detail::expect_workspace(plan, ws, fn);
  if (s.tokens == 0) return;
  kernels::gemm::Params p = routing_params(plan, ws);
  p.a = x.as<const __nv_bfloat16>();
  p.b = w13.as<const __nv_bfloat16>();
  p.out = ws.act.as<__nv_bfloat16>();
  p.k_dim = s.hidden;
  p.n_dim = s.inter;
  p.b_expert_stride = 2 * s.inter * s.hidden;
  nvtxRangePushA("moekit.expert_up");
  dispatch<kernels::gemm::Mode::Up>(plan, plan.up, p, plan.max_blocks, stream);
  nvtxRangePop();
}

void expert_down(const ForwardPlan& plan, const Tensor& w2, const Tensor& topk_weights,
                 const Workspace& ws, cudaStream_t stream) {
  const char* fn = "expert_down";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  detail::expect_tensor(fn, "w2", w2, DType::bf16, {s.experts, s.hidden, s.inter});
  detail::expect_tensor(fn, "topk_weights", topk_weights, DType::f32, {s.tokens, s.topk});
  detail::expect_workspace(plan, ws, fn);
  if (s.tokens == 0) return;
  kernels::gemm::Params p = routing_params(plan, ws);
  p.a = ws.act.as<const __nv_bfloat16>();
  p.b = w2.as<const __nv_bfloat16>();
  p.out = ws.y_rows.as<__nv_bfloat16>();
  p.topk_weights = topk_weights.as<const float>();
  if (plan.down_splits > 1) {
    p.k_splits = plan.down_splits;
    p.partials = ws.y_partials.as<float>();
  }
  p.k_dim = s.inter;
  p.n_dim = s.hidden;
  p.b_expert_stride = s.hidden * s.inter;
  nvtxRangePushA("moekit.expert_down");
  dispatch<kernels::gemm::Mode::Down>(plan, plan.down, p, plan.max_blocks, stream);
  nvtxRangePop();
}

}  // namespace moekit
