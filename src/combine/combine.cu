// combine.cu — stage 5 on the host: combine() and combine_partials() validate their arguments;
// the internal launchers enqueue the kernels (a thread per 8 columns of a token).
#include <nvtx3/nvToolsExt.h>

#include "combine/combine.cuh"
#include "combine/launch.hpp"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/validate.hpp"

namespace moekit {

namespace detail {

namespace {
dim3 combine_grid(int64_t tokens, int64_t hidden) {
  const int64_t vecs = tokens * (hidden / 8);
  return dim3(unsigned((vecs + kernels::combine::kThreads - 1) / kernels::combine::kThreads));
}
}  // namespace

void launch_combine(const void* rows, const int32_t* row_of, void* y, int64_t tokens, int64_t hidden, int topk,
                    cudaStream_t stream) {
  if (tokens == 0) return;
  namespace kc = kernels::combine;
  const kc::Params p{static_cast<const __nv_bfloat16*>(rows), static_cast<__nv_bfloat16*>(y), tokens, hidden, topk,
                     row_of};
  if (row_of != nullptr)
    launch_pdl("combine_gathered_kernel", kc::combine_kernel<true>, combine_grid(tokens, hidden), dim3(kc::kThreads), 0,
               stream, p);
  else
    launch_pdl("combine_kernel", kc::combine_kernel<false>, combine_grid(tokens, hidden), dim3(kc::kThreads), 0, stream,
               p);
}

void launch_combine_partials(const float* partials, int splits, void* y, int64_t tokens, int64_t hidden, int topk,
                             cudaStream_t stream) {
  if (tokens == 0) return;
  namespace kc = kernels::combine;
  const kc::PartialParams p{partials, static_cast<__nv_bfloat16*>(y), tokens, hidden, topk, splits};
  launch_pdl("combine_partials_kernel", kc::combine_partials_kernel, combine_grid(tokens, hidden), dim3(kc::kThreads),
             0, stream, p);
}

}  // namespace detail

void combine(const Tensor& y_rows, int64_t topk, const Tensor& y, cudaStream_t stream) {
  const char* fn = "combine";
  if (y.rank != 2) detail::fail(fn, "y", "expected shape [T, H], got " + y.shape_str());
  const int64_t T = y.dim(0), H = y.dim(1);
  if (topk < 1 || topk > kMaxTopk) detail::fail(fn, "topk", "must be in [1, 16], got " + std::to_string(topk));
  if (H % 8 != 0) detail::fail(fn, "y", "hidden size must be a multiple of 8, got " + std::to_string(H));
  detail::expect_tensor(fn, "y", y, DType::bf16, {T, H});
  detail::expect_tensor(fn, "y_rows", y_rows, DType::bf16, {detail::checked_mul(fn, "y", "T·k", T, topk), H});
  nvtxRangePushA("moekit.combine");
  detail::launch_combine(y_rows.data, nullptr, y.data, T, H, int(topk), stream);
  nvtxRangePop();
}

void combine_partials(const Tensor& y_partials, int64_t topk, const Tensor& y, cudaStream_t stream) {
  const char* fn = "combine_partials";
  if (y.rank != 2) detail::fail(fn, "y", "expected shape [T, H], got " + y.shape_str());
  if (y_partials.rank != 3) detail::fail(fn, "y_partials", "expected shape [S, T*k, H], got " + y_partials.shape_str());
  const int64_t T = y.dim(0), H = y.dim(1), S = y_partials.dim(0);
  if (topk < 1 || topk > kMaxTopk) detail::fail(fn, "topk", "must be in [1, 16], got " + std::to_string(topk));
  if (S < 1 || S > kMaxDownSplits) detail::fail(fn, "y_partials", "splits must be in [1, 8], got " + std::to_string(S));
  if (H % 8 != 0) detail::fail(fn, "y", "hidden size must be a multiple of 8, got " + std::to_string(H));
  detail::expect_tensor(fn, "y", y, DType::bf16, {T, H});
  detail::expect_tensor(fn, "y_partials", y_partials, DType::f32, {S, detail::checked_mul(fn, "y", "T·k", T, topk), H});
  nvtxRangePushA("moekit.combine");
  detail::launch_combine_partials(y_partials.as<const float>(), int(S), y.data, T, H, int(topk), stream);
  nvtxRangePop();
}

}  // namespace moekit
