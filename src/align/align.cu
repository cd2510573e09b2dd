// align.cu — stage 2 launcher: validates align()'s arguments; one launch: one warp up to
// kWarpMaxAssignments (decode), one CTA up to kAlignGridMinAssignments, a cooperative grid above.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "align/align.cuh"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "common/validate.hpp"

namespace moekit {

void align(const ForwardPlan& plan, const Tensor& topk_ids, const Workspace& ws,
           cudaStream_t stream) {
  const char* fn = "align";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  detail::expect_tensor(fn, "topk_ids", topk_ids, DType::i32, {s.tokens, s.topk});
  detail::expect_tensor(fn, "ws.sorted_ids", ws.sorted_ids, DType::i32, {plan.max_rows});
  detail::expect_tensor(fn, "ws.block_expert", ws.block_expert, DType::i32, {plan.max_blocks});
  detail::expect_tensor(fn, "ws.num_rows_padded", ws.num_rows_padded, DType::i32, {1});
  detail::expect_tensor(fn, "ws.expert_counts", ws.expert_counts, DType::i32, {s.experts});
  detail::expect_tensor(fn, "ws.status", ws.status, DType::i32, {1});
  const bool grid = s.tokens * s.topk > kAlignGridMinAssignments;
  if (grid) detail::expect_tensor(fn, "ws.align_scratch", ws.align_scratch, DType::i32, {int64_t(kAlignMaxCtas), s.experts + 1});

  kernels::align::Params p{};
  p.topk_ids = topk_ids.as<const int32_t>();
  p.sorted_ids = ws.sorted_ids.as<int32_t>();
  p.block_expert = ws.block_expert.as<int32_t>();
  p.num_rows_padded = ws.num_rows_padded.as<int32_t>();
  p.expert_counts = ws.expert_counts.as<int32_t>();
  p.status = ws.status.as<int32_t>();
  p.num_assign = s.tokens * s.topk;
  p.max_blocks = plan.max_blocks;
  p.experts = int(s.experts);
  p.block_m = plan.block_m;

  if (grid) p.cta_counts = ws.align_scratch.as<int32_t>();
  nvtxRangePushA("moekit.align");
  detail::launch_align(p, stream);
  nvtxRangePop();
}

namespace detail {

// T = 0 still launches: the GEMMs read num_rows_padded = 0 and block_expert = -1 from it.
// Three kernels by size: one warp (decode, up to kWarpMaxAssignments), one CTA, a cooperative grid.
void launch_align(kernels::align::Params p, cudaStream_t stream) {
  const bool grid = p.num_assign > kAlignGridMinAssignments;
  // Raise the dynamic shared-memory limit once per device, for the largest E (not per call).
  static detail::PerDevice<bool> raised;
  raised.get([](int) {
    MK_CUDA_CHECK(cudaFuncSetAttribute(kernels::align::align_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kernels::align::smem_bytes(int(kMaxExperts)))));
    return true;
  });
  if (p.num_assign <= kernels::align::kWarpMaxAssignments) {
    detail::launch_pdl("align_warp_kernel", kernels::align::align_warp_kernel, dim3(1), dim3(32), 0, stream, p);
  } else if (!grid) {
    const size_t smem = kernels::align::smem_bytes(p.experts);
    detail::launch_pdl("align_kernel", kernels::align::align_kernel, dim3(1), dim3(kernels::align::kThreads), smem, stream, p);
  } else {
    // Once per device: the shared-memory limit and how many CTAs can be resident at once (a
    // cooperative launch needs all of them), capped by the scratch's rows.
    static detail::PerDevice<int> per_device;
    const int max_ctas = per_device.get([](int device) {
      const int smem = int(kernels::align::grid_smem_bytes(int(kMaxExperts)));
      MK_CUDA_CHECK(cudaFuncSetAttribute(kernels::align::align_grid_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      int sms = 0, per_sm = 0;
      MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernels::align::align_grid_kernel,
                                                                  kernels::align::kThreads, size_t(smem)));
      return std::max(1, std::min(kAlignMaxCtas, sms * std::max(per_sm, 1)));
    });
    // At least a few rounds per warp: no CTA is launched to count a handful of ids.
    const int64_t wanted = (p.num_assign + 4 * kernels::align::kThreads - 1) / (4 * kernels::align::kThreads);
    const int ctas = int(std::min<int64_t>(max_ctas, wanted));
    detail::launch_cooperative("align_grid_kernel", kernels::align::align_grid_kernel, dim3(unsigned(ctas)),
                               dim3(kernels::align::kThreads), kernels::align::grid_smem_bytes(p.experts), stream, p);
  }
}

}  // namespace detail

void check_status(const Workspace& ws, cudaStream_t stream) {
  detail::expect_tensor("check_status", "ws.status", ws.status, DType::i32, {1});
  int32_t status = 0;
  MK_CUDA_CHECK(cudaMemcpyAsync(&status, ws.status.data, 4, cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (status & kStatusExpertIdOutOfRange)
    detail::fail("align", "topk_ids", "an expert id is outside [0, E); those assignments were skipped");
}

}  // namespace moekit
