// quantize.cu — FP8 quantization on the host side: quantize_tokens() and quantize_weights()
// validate their arguments; the internal launchers enqueue quantize.cuh's kernels.
#include <nvtx3/nvToolsExt.h>

#include <limits>
#include <string>

#include "common/launch.hpp"
#include "common/validate.hpp"
#include "quant/launch.hpp"
#include "quant/quantize.cuh"

static_assert(moekit::kernels::quant::kGroup == moekit::kFp8Block, "the kernels' FP8 block is the API's");

namespace moekit {

namespace detail {

void launch_quantize_tokens(const void* x_bf16, int64_t tokens, int64_t hidden, void* x_q, float* x_scale,
                            cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return;
  namespace kq = kernels::quant;
  const kq::TokenParams p{static_cast<const __nv_bfloat16*>(x_bf16), static_cast<uint8_t*>(x_q), x_scale, tokens,
                          hidden, fp8_blocks(hidden)};
  const int64_t ctas = (tokens * p.groups + kq::kTokenGroupsPerCta - 1) / kq::kTokenGroupsPerCta;
  launch_pdl("quantize_tokens_kernel", kq::quantize_tokens_kernel, dim3(unsigned(ctas)), dim3(kq::kTokenThreads), 0,
             stream, p);
}

void launch_quantize_weights(const void* w_bf16, int64_t projections, int64_t rows, int64_t cols, void* q,
                             float* scale, cudaStream_t stream) {
  namespace kq = kernels::quant;
  const kq::WeightParams p{static_cast<const __nv_bfloat16*>(w_bf16), static_cast<uint8_t*>(q), scale, rows, cols,
                           fp8_blocks(rows), fp8_blocks(cols)};
  const int64_t ctas = projections * p.row_blocks * p.col_blocks;
  if (ctas == 0) return;
  launch_pdl("quantize_weights_kernel", kq::quantize_weights_kernel, dim3(unsigned(ctas)), dim3(kq::kWeightThreads), 0,
             stream, p);
}

}  // namespace detail

void quantize_tokens(const ForwardPlan& plan, const Tensor& x, const Workspace& ws, cudaStream_t stream) {
  const char* fn = "quantize_tokens";
  detail::expect_plan(plan, fn);
  if (plan.precision() != Precision::fp8)
    detail::fail(fn, "plan", std::string("is a ") + precision_name(plan.precision()) +
                                 " plan: quantize_tokens serves fp8 plans (plan_forward(shape, device, Precision::fp8))");
  const int64_t T = plan.shape.tokens, H = plan.shape.hidden;
  detail::expect_tensor(fn, "x", x, DType::bf16, {T, H});
  detail::expect_tensor(fn, "ws.x_q", ws.x_q, DType::e4m3, {T, H});
  detail::expect_tensor(fn, "ws.x_scale", ws.x_scale, DType::f32, {T, fp8_blocks(H)});
  nvtxRangePushA("moekit.quantize_tokens");
  detail::launch_quantize_tokens(x.data, T, H, ws.x_q.data, ws.x_scale.as<float>(), stream);
  nvtxRangePop();
}

void quantize_weights(const Tensor& w, const Tensor& q, const Tensor& scale, cudaStream_t stream) {
  const char* fn = "quantize_weights";
  if (w.given() && w.rank != 3) detail::fail(fn, "w", "expected shape [P, R, C], got " + w.shape_str());
  const int64_t P = w.dim(0), R = w.dim(1), C = w.dim(2);
  detail::expect_tensor(fn, "w", w, DType::bf16, {P, R, C});
  if (P < 0 || R < 0 || C < 0) detail::fail(fn, "w", "dimensions must be >= 0, got " + w.shape_str());
  if (C % 16 != 0)
    detail::fail(fn, "w", "columns must be a multiple of 16 (16-byte rows of e4m3), got " + std::to_string(C));
  if (P * fp8_blocks(R) * fp8_blocks(C) > std::numeric_limits<int32_t>::max())
    detail::fail(fn, "w", "has more than 2^31 - 1 blocks of 128 x 128: quantize it in parts");
  detail::expect_tensor(fn, "q", q, DType::e4m3, {P, R, C});
  detail::expect_tensor(fn, "scale", scale, DType::f32, {P, fp8_blocks(R), fp8_blocks(C)});
  nvtxRangePushA("moekit.quantize_weights");
  detail::launch_quantize_weights(w.data, P, R, C, q.data, scale.as<float>(), stream);
  nvtxRangePop();
}

}  // namespace moekit
