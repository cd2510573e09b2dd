// align.cu — stage 2 on the host: align() validates its arguments; launch_align runs the
// planner's kernel (plan.align): one warp for decode's few ids, one CTA, or a cooperative grid.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "align/align.cuh"
#include "align/launch.hpp"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "common/validate.hpp"

namespace moekit {

void align(const ForwardPlan& plan, const Tensor& topk_ids, const Workspace& ws, cudaStream_t stream) {
  const char* fn = "align";
  const MoeShape& s = plan.shape;
  detail::expect_plan(plan, fn);
  detail::expect_tensor(fn, "topk_ids", topk_ids, DType::i32, {s.tokens, s.topk});
  detail::expect_tensor(fn, "ws.sorted_ids", ws.sorted_ids, DType::i32, {plan.max_rows()});
  detail::expect_tensor(fn, "ws.block_expert", ws.block_expert, DType::i32, {plan.max_blocks()});
  detail::expect_tensor(fn, "ws.num_rows_padded", ws.num_rows_padded, DType::i32, {1});
  detail::expect_tensor(fn, "ws.expert_counts", ws.expert_counts, DType::i32, {s.experts});
  detail::expect_tensor(fn, "ws.status", ws.status, DType::i32, {1});
  if (plan.align == AlignKernel::grid)
    detail::expect_tensor(fn, "ws.align_scratch", ws.align_scratch, DType::i32, {int64_t(kAlignMaxCtas), s.experts + 1});
  nvtxRangePushA("moekit.align");
  detail::launch_align(plan.align, topk_ids.as<const int32_t>(), s.tokens * s.topk, int(s.experts), plan.block_m(),
                       detail::align_outputs(plan, ws), stream);
  nvtxRangePop();
}

namespace detail {

AlignOutputs align_outputs(const ForwardPlan& plan, const Workspace& ws) {
  return {ws.sorted_ids.as<int32_t>(),   ws.block_expert.as<int32_t>(), ws.num_rows_padded.as<int32_t>(),
          ws.expert_counts.as<int32_t>(), ws.status.as<int32_t>(),      ws.align_scratch.as<int32_t>(),
          plan.max_blocks()};
}

void launch_align(AlignKernel kernel, const int32_t* topk_ids, int64_t assignments, int experts, int block_m,
                  const AlignOutputs& out, cudaStream_t stream) {
  namespace ka = kernels::align;
  ka::Params p{};
  p.topk_ids = topk_ids;
  p.sorted_ids = out.sorted_ids;
  p.block_expert = out.block_expert;
  p.num_rows_padded = out.num_rows_padded;
  p.expert_counts = out.expert_counts;
  p.status = out.status;
  p.cta_counts = kernel == AlignKernel::grid ? out.grid_scratch : nullptr;
  p.num_assign = assignments;
  p.max_blocks = out.max_blocks;
  p.experts = experts;
  p.block_m = block_m;
  // Raise the dynamic shared-memory limit once per device, for the largest E (not per call).
  static PerDevice<bool> raised;
  raised.get([](int) {
    MK_CUDA_CHECK(cudaFuncSetAttribute(ka::align_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(ka::smem_bytes(int(kMaxExperts)))));
    return true;
  });
  switch (kernel) {
    case AlignKernel::warp:
      launch_pdl("align_warp_kernel", ka::align_warp_kernel, dim3(1), dim3(32), 0, stream, p);
      return;
    case AlignKernel::cta:
      launch_pdl("align_kernel", ka::align_kernel, dim3(1), dim3(ka::kThreads), ka::smem_bytes(p.experts), stream, p);
      return;
    case AlignKernel::grid: {
      // Once per device: the shared-memory limit and how many CTAs can be resident at once (a
      // cooperative launch needs all of them), capped by the scratch's rows.
      static PerDevice<int> per_device;
      const int max_ctas = per_device.get([](int device) {
        const int smem = int(ka::grid_smem_bytes(int(kMaxExperts)));
        MK_CUDA_CHECK(cudaFuncSetAttribute(ka::align_grid_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int sms = 0, per_sm = 0;
        MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ka::align_grid_kernel, ka::kThreads,
                                                                    size_t(smem)));
        return std::max(1, std::min(kAlignMaxCtas, sms * std::max(per_sm, 1)));
      });
      // At least a few rounds per warp: no CTA is launched to count a handful of ids.
      const int64_t wanted = (p.num_assign + 4 * ka::kThreads - 1) / (4 * ka::kThreads);
      const int ctas = int(std::max<int64_t>(1, std::min<int64_t>(max_ctas, wanted)));
      launch_cooperative("align_grid_kernel", ka::align_grid_kernel, dim3(unsigned(ctas)), dim3(ka::kThreads),
                         ka::grid_smem_bytes(p.experts), stream, p);
      return;
    }
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
