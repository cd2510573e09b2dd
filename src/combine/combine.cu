// combine.cu — stage 5 launcher.
#include <nvtx3/nvToolsExt.h>

#include "combine/combine.cuh"
#include "combine/combine_launch.hpp"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/validate.hpp"

namespace moekit {

void combine(const Tensor& y_rows, int64_t topk, const Tensor& y, cudaStream_t stream) {
  const char* fn = "combine";
  if (y.rank != 2) detail::fail(fn, "y", "expected shape [T, H], got " + y.shape_str());
  const int64_t T = y.dim(0), H = y.dim(1);
  if (topk < 1 || topk > kMaxTopk) detail::fail(fn, "topk", "must be in [1, 16], got " + std::to_string(topk));
  if (H % 8 != 0) detail::fail(fn, "y", "hidden size must be a multiple of 8, got " + std::to_string(H));
  detail::expect_tensor(fn, "y", y, DType::bf16, {T, H});
  detail::expect_tensor(fn, "y_rows", y_rows, DType::bf16, {T * topk, H});
  if (T == 0) return;
  kernels::combine::Params p{y_rows.as<const __nv_bfloat16>(), y.as<__nv_bfloat16>(), T, H, int(topk)};
  const int64_t vecs = T * (H / 8);
  nvtxRangePushA("moekit.combine");
  detail::launch_pdl("combine_kernel", kernels::combine::combine_kernel<false>,
                     dim3(unsigned((vecs + kernels::combine::kThreads - 1) / kernels::combine::kThreads)),
                     dim3(kernels::combine::kThreads), 0, stream, p);
  nvtxRangePop();
}

namespace detail {
void launch_combine_gathered(const void* rows, const int32_t* row_of, void* y, int64_t tokens, int64_t hidden, int topk,
                             cudaStream_t stream) {
  if (tokens == 0) return;
  kernels::combine::Params p{static_cast<const __nv_bfloat16*>(rows), static_cast<__nv_bfloat16*>(y), tokens, hidden, topk,
                             row_of};
  const int64_t vecs = tokens * (hidden / 8);
  launch_pdl("combine_gathered_kernel", kernels::combine::combine_kernel<true>,
             dim3(unsigned((vecs + kernels::combine::kThreads - 1) / kernels::combine::kThreads)),
             dim3(kernels::combine::kThreads), 0, stream, p);
}
}  // namespace detail

void combine_partials(const Tensor& y_partials, int64_t topk, const Tensor& y, cudaStream_t stream) {
  const char* fn = "combine_partials";
  if (y.rank != 2) detail::fail(fn, "y", "expected shape [T, H], got " + y.shape_str());
  if (y_partials.rank != 3) detail::fail(fn, "y_partials", "expected shape [S, T*k, H], got " + y_partials.shape_str());
  const int64_t T = y.dim(0), H = y.dim(1), S = y_partials.dim(0);
  if (topk < 1 || topk > kMaxTopk) detail::fail(fn, "topk", "must be in [1, 16], got " + std::to_string(topk));
  if (S < 1 || S > kMaxDownSplits) detail::fail(fn, "y_partials", "splits must be in [1, 8], got " + std::to_string(S));
  if (H % 8 != 0) detail::fail(fn, "y", "hidden size must be a multiple of 8, got " + std::to_string(H));
  detail::expect_tensor(fn, "y", y, DType::bf16, {T, H});
  detail::expect_tensor(fn, "y_partials", y_partials, DType::f32, {S, T * topk, H});
  if (T == 0) return;
  kernels::combine::PartialParams p{y_partials.as<const float>(), y.as<__nv_bfloat16>(), T, H, int(topk), int(S)};
  const int64_t vecs = T * (H / 8);
  nvtxRangePushA("moekit.combine");
  detail::launch_pdl("combine_partials_kernel", kernels::combine::combine_partials_kernel,
                     dim3(unsigned((vecs + kernels::combine::kThreads - 1) / kernels::combine::kThreads)),
                     dim3(kernels::combine::kThreads), 0, stream, p);
  nvtxRangePop();
}

}  // namespace moekit
