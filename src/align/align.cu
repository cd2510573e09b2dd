// align.cu — stage 2 on the host: align() validates its arguments; launch_align runs the
// planner's kernel (plan.align): one warp for decode's few ids, one CTA, or a cooperative grid,
// each in the instance with the opt-in load counter when the caller gives one (expert_load).
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "align/align.cuh"
#include "align/launch.hpp"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "common/validate.hpp"

namespace moekit {

void align(const ForwardPlan& plan, const Tensor& topk_ids, const Workspace& ws, cudaStream_t stream,
           const Tensor& expert_load) {
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
  using detail::span_of;
  detail::expect_expert_load(fn, expert_load, s.experts,
                             {span_of("topk_ids", topk_ids), span_of("ws.sorted_ids", ws.sorted_ids),
                              span_of("ws.block_expert", ws.block_expert),
                              span_of("ws.num_rows_padded", ws.num_rows_padded),
                              span_of("ws.expert_counts", ws.expert_counts), span_of("ws.status", ws.status),
                              span_of("ws.align_scratch", ws.align_scratch)});
  nvtxRangePushA("moekit.align");
  detail::launch_align(plan.align, topk_ids.as<const int32_t>(), s.tokens * s.topk, int(s.experts), plan.block_m(),
                       detail::align_outputs(plan, ws), expert_load.as<int64_t>(), stream);
  nvtxRangePop();
}

namespace detail {

AlignOutputs align_outputs(const ForwardPlan& plan, const Workspace& ws) {
  return {ws.sorted_ids.as<int32_t>(),   ws.block_expert.as<int32_t>(), ws.num_rows_padded.as<int32_t>(),
          ws.expert_counts.as<int32_t>(), ws.status.as<int32_t>(),      ws.align_scratch.as<int32_t>(),
          plan.max_blocks()};
}

namespace {
namespace ka = kernels::align;

// One instance's one-time setup on the current device: the dynamic shared-memory limits, for the
// largest E (not per call), and how many grid CTAs can be resident at once (a cooperative launch
// needs all of them), capped by the scratch's rows. Returns that CTA count.
template <bool kCountLoad>
int set_up_instance(int device) {
  MK_CUDA_CHECK(cudaFuncSetAttribute(ka::align_kernel<kCountLoad>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(ka::smem_bytes(int(kMaxExperts)))));
  const int smem = int(ka::grid_smem_bytes(int(kMaxExperts)));
  MK_CUDA_CHECK(
      cudaFuncSetAttribute(ka::align_grid_kernel<kCountLoad>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int sms = 0, per_sm = 0;
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ka::align_grid_kernel<kCountLoad>,
                                                              ka::kThreads, size_t(smem)));
  return std::max(1, std::min(kAlignMaxCtas, sms * std::max(per_sm, 1)));
}

// The grid kernel's resident CTAs of each instance (index: kCountLoad). Both instances are set up
// together, on the first align on a device, so that a CUDA graph captured after eager calls
// without the counter may add one (capture needs the setup done beforehand).
struct GridCtas {
  int of[2];
};
GridCtas set_up(int device) { return {{set_up_instance<false>(device), set_up_instance<true>(device)}}; }

template <bool kCountLoad>
void launch_instance(AlignKernel kernel, const ka::Params& p, int grid_max_ctas, cudaStream_t stream) {
  switch (kernel) {
    case AlignKernel::warp:
      launch_pdl("align_warp_kernel", ka::align_warp_kernel<kCountLoad>, dim3(1), dim3(32), 0, stream, p);
      return;
    case AlignKernel::cta:
      launch_pdl("align_kernel", ka::align_kernel<kCountLoad>, dim3(1), dim3(ka::kThreads), ka::smem_bytes(p.experts),
                 stream, p);
      return;
    case AlignKernel::grid: {
      // At least a few rounds per warp: no CTA is launched to count a handful of ids.
      const int64_t wanted = (p.num_assign + 4 * ka::kThreads - 1) / (4 * ka::kThreads);
      const int ctas = int(std::max<int64_t>(1, std::min<int64_t>(grid_max_ctas, wanted)));
      launch_cooperative("align_grid_kernel", ka::align_grid_kernel<kCountLoad>, dim3(unsigned(ctas)),
                         dim3(ka::kThreads), ka::grid_smem_bytes(p.experts), stream, p);
      return;
    }
  }
}

}  // namespace

void launch_align(AlignKernel kernel, const int32_t* topk_ids, int64_t assignments, int experts, int block_m,
                  const AlignOutputs& out, int64_t* expert_load, cudaStream_t stream) {
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
  p.expert_load = expert_load;
  static PerDevice<GridCtas> per_device;
  const GridCtas grid = per_device.get(set_up);
  if (expert_load) launch_instance<true>(kernel, p, grid.of[1], stream);
  else launch_instance<false>(kernel, p, grid.of[0], stream);
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
