// router.cu — stage 1 on the host: the one validation of the router's inputs (route() and
// moe_forward), and the launcher of the planner's kernels (RouterPlan): the logits on many CTAs
// when a scratch is given (gate/: bf16 w_gate on the tensor cores; select.cuh's logits_kernel for
// f32), then the selection, a CTA per token (select_cta.cuh) or a warp per token (select.cuh) by
// experts per lane and w_gate dtype.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "common/validate.hpp"
#include "router/gate/cluster.cuh"
#include "router/gate/pipelined.cuh"
#include "router/launch.hpp"
#include "router/select.cuh"
#include "router/select_cta.cuh"
#include "tuning/planner.hpp"

namespace moekit {

namespace detail {

namespace {
namespace kr = kernels::router;

template <int EPL>
void launch_select(const kr::Params& p, DType w_dtype, cudaStream_t stream) {
  const dim3 grid(unsigned((p.tokens + kr::kWarpsPerBlock - 1) / kr::kWarpsPerBlock));
  const dim3 block(32 * kr::kWarpsPerBlock);
  if (p.logits != nullptr)
    launch_pdl("router_kernel", kr::router_kernel<EPL, void>, grid, block, 0, stream, p);
  else if (w_dtype == DType::bf16)
    launch_pdl("router_kernel", kr::router_kernel<EPL, __nv_bfloat16>, grid, block, 0, stream, p);
  else
    launch_pdl("router_kernel", kr::router_kernel<EPL, float>, grid, block, 0, stream, p);
}

// Token tiles of `rows` tokens go on grid y (at most 65535 of them): a larger T is launched in
// chunks of whole tiles. launch(chunk params, token tiles) launches one chunk.
template <class Launch>
void for_each_token_chunk(const kr::GateParams& p, int64_t rows, Launch&& launch) {
  const int64_t chunk = 65535 * rows;
  for (int64_t t0 = 0; t0 < p.tokens; t0 += chunk) {
    kr::GateParams c = p;
    c.tokens = std::min(chunk, p.tokens - t0);
    c.x = p.x + t0 * p.hidden;
    c.logits = p.logits + t0 * p.experts;
    if (p.x_q != nullptr) {
      c.x_q = p.x_q + t0 * p.hidden;
      c.x_scale = p.x_scale + t0 * ((p.hidden + kFp8Block - 1) / kFp8Block);
    }
    launch(c, unsigned((c.tokens + rows - 1) / rows));
  }
}

// A cluster or looped instance of gate/cluster.cuh: every one sums each logit in the same order.
// kQuantX (p.x_q given; cluster kernels only): the instance that also quantizes x, with its x tile
// after the staging.
template <int MT, int NT, bool kLooped, bool kQuantX>
void launch_gate(const kr::GateParams& p, cudaStream_t stream) {
  using Tile = kr::GateTile<MT, NT>;
  void (*kernel)(kr::GateParams) = nullptr;
  static_assert(!(kLooped && kQuantX), "only the cluster kernels quantize x");
  if constexpr (kLooped) kernel = kr::gate_logits_looped_kernel<MT, NT>;
  else kernel = kr::gate_logits_kernel<MT, NT, kQuantX>;
  // Once per instance and device (as the GEMMs): allow its dynamic shared memory (kQuantX: all the
  // device allows beside the kernel's static partial tile, as the x tile grows with H; the planner
  // checked that it fits).
  static PerDevice<bool> smem_ready;
  smem_ready.get([&](int device) {
    int dynamic = Tile::kSmemBytes;
    if (kQuantX) {
      int optin = 0;
      cudaFuncAttributes attr{};
      MK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      MK_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
      dynamic = optin - int(attr.sharedSizeBytes);
    }
    MK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    return true;
  });
  const size_t smem = kQuantX ? size_t(kr::gate_quantizing_smem_bytes<MT, NT>(p.hidden)) : size_t(Tile::kSmemBytes);
  const unsigned e_tiles = unsigned((p.experts + Tile::kCols - 1) / Tile::kCols);
  for_each_token_chunk(p, Tile::kRows, [&](const kr::GateParams& c, unsigned token_tiles) {
    const dim3 grid(e_tiles * (kLooped ? 1 : kr::kGateSlices), token_tiles);
    launch_pdl(kLooped ? "gate_logits_looped_kernel" : "gate_logits_kernel", kernel, grid, dim3(32 * kr::kGateWarps),
               smem, stream, c);
  });
}

template <int MT, int NT, bool kLooped>
void launch_gate(const kr::GateParams& p, cudaStream_t stream) {
  if constexpr (!kLooped)
    if (p.x_q != nullptr) return launch_gate<MT, NT, false, true>(p, stream);
  launch_gate<MT, NT, kLooped, false>(p, stream);
}

// The pipelined kernel (gate/pipelined.cuh) on tiles of COLS experts; the planner picks it only
// when its shared memory for H fits the device.
template <int COLS>
void launch_gate_pipelined(const kr::GateParams& p, cudaStream_t stream) {
  using Pipe = kr::GatePipe<kr::kGatePipeGroup, kr::kGatePipeStages, COLS>;
  auto kernel = kr::gate_logits_pipelined_kernel<kr::kGatePipeGroup, kr::kGatePipeStages, COLS>;
  // Once per device: its limit raised to the device's maximum (the block table grows with H).
  static PerDevice<bool> smem_ready;
  smem_ready.get([&](int device) {
    int optin = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    MK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    return true;
  });
  const unsigned e_tiles = unsigned((p.experts + COLS - 1) / COLS);
  for_each_token_chunk(p, kr::kGatePipeRows, [&](const kr::GateParams& c, unsigned token_tiles) {
    launch_pdl("gate_logits_pipelined_kernel", kernel, dim3(e_tiles, token_tiles), dim3(Pipe::kThreads),
               size_t(kr::gate_pipelined_smem_bytes(p.hidden, COLS)), stream, c);
  });
}

void launch_gate(GateKernel k, const kr::GateParams& p, cudaStream_t stream) {
  switch (k) {
    case GateKernel::cluster_16x8: return launch_gate<1, 1, false>(p, stream);
    case GateKernel::cluster_32x8: return launch_gate<2, 1, false>(p, stream);
    case GateKernel::cluster_32x32: return launch_gate<2, 4, false>(p, stream);
    case GateKernel::looped_64x8: return launch_gate<4, 1, true>(p, stream);
    case GateKernel::looped_64x32: return launch_gate<4, 4, true>(p, stream);
    case GateKernel::pipelined_128x64: return launch_gate_pipelined<kr::kGatePipeCols>(p, stream);
    case GateKernel::pipelined_128x32: return launch_gate_pipelined<kr::kGatePipeNarrowCols>(p, stream);
  }
}
}  // namespace

int64_t expect_router_inputs(const char* fn, const char* logits_arg, const Tensor& x, const Tensor& w_gate,
                             const Tensor& logits, const Tensor& score_bias, const RouterOptions& opt, int64_t T, int64_t k,
                             int64_t experts, int64_t hidden) {
  int64_t E = 0;
  if (logits.given()) {
    if (logits.rank != 2) fail(fn, logits_arg, "expected shape [T, E], got " + logits.shape_str());
    E = experts > 0 ? experts : logits.dim(1);
    expect_tensor(fn, logits_arg, logits, DType::f32, {T, E});
  } else {
    if (!w_gate.given())
      fail(fn, "w_gate", std::string("give either ") + logits_arg + " [T, E] or w_gate [E, H] with x [T, H]");
    if (w_gate.rank != 2) fail(fn, "w_gate", "expected shape [E, H], got " + w_gate.shape_str());
    E = experts > 0 ? experts : w_gate.dim(0);
    const int64_t H = hidden > 0 ? hidden : w_gate.dim(1);
    if (H % 8 != 0) fail(fn, "w_gate", "hidden size must be a multiple of 8, got " + std::to_string(H));
    if (w_gate.dtype != DType::bf16 && w_gate.dtype != DType::f32)
      fail(fn, "w_gate", std::string("expected dtype bf16 or f32, got ") + dtype_name(w_gate.dtype));
    expect_tensor(fn, "w_gate", w_gate, w_gate.dtype, {E, H});
    expect_tensor(fn, "x", x, DType::bf16, {T, H});
  }
  if (E < 1 || E > kMaxExperts)
    fail(fn, logits.given() ? logits_arg : "w_gate", "number of experts must be in [1, 512], got " + std::to_string(E));
  if (k < 1 || k > kMaxTopk) fail(fn, "topk_ids", "k must be in [1, 16], got " + std::to_string(k));
  if (k > E) fail(fn, "topk_ids", "k = " + std::to_string(k) + " exceeds the number of experts " + std::to_string(E));
  expect_optional(fn, "score_bias", score_bias, DType::f32, {E});
  if (opt.n_group < 0 || opt.n_group > 32)
    fail(fn, "opt.n_group", "must be in [0, 32], got " + std::to_string(opt.n_group));
  if (opt.n_group > 0) {
    if (E % opt.n_group != 0)
      fail(fn, "opt.n_group", std::to_string(E) + " experts do not split into " + std::to_string(opt.n_group) + " equal groups");
    if (opt.topk_group < 1 || opt.topk_group > opt.n_group)
      fail(fn, "opt.topk_group", "must be in [1, n_group], got " + std::to_string(opt.topk_group));
    if (opt.topk_group * (E / opt.n_group) < k)
      fail(fn, "opt.topk_group", "the kept groups hold fewer than k experts");
  }
  return E;
}

kr::Params router_params(const Tensor& x, const Tensor& w_gate, const Tensor& logits, const Tensor& score_bias,
                         const RouterOptions& opt, int32_t* topk_ids, float* topk_weights, int64_t T, int64_t E,
                         int64_t k) {
  kr::Params p{};
  p.x = x.as<const __nv_bfloat16>();
  p.w_gate = w_gate.data;
  p.logits = logits.given() ? logits.as<const float>() : nullptr;
  p.score_bias = score_bias.given() ? score_bias.as<const float>() : nullptr;
  p.topk_ids = topk_ids;
  p.topk_weights = topk_weights;
  p.tokens = T;
  p.hidden = logits.given() ? 0 : w_gate.dim(1);
  p.experts = int(E);
  p.topk = int(k);
  p.sigmoid = opt.scoring == Scoring::sigmoid;
  p.renormalize = opt.renormalize;
  p.n_group = int(opt.n_group);
  p.topk_group = int(opt.topk_group);
  p.routed_scaling_factor = opt.routed_scaling_factor;
  return p;
}

bool route_quantizes_x(const RouterPlan& plan, const kr::Params& p, DType w_dtype, const float* logits_scratch) {
  return plan.quantize_x && kr::gate_tiling_quantizes_x(plan.gate) && p.logits == nullptr && logits_scratch != nullptr &&
         w_dtype == DType::bf16;
}

bool launch_route(const RouterPlan& plan, kr::Params p, DType w_dtype, float* logits_scratch, cudaStream_t stream,
                  const XQuant& xq) {
  if (p.tokens == 0) return false;
  const bool quantize = xq.q != nullptr && route_quantizes_x(plan, p, w_dtype, logits_scratch);
  if (p.logits == nullptr && logits_scratch != nullptr) {  // logits over many CTAs first, then selection
    if (w_dtype == DType::bf16) {
      launch_gate(plan.gate,
                  {p.x, static_cast<const __nv_bfloat16*>(p.w_gate), logits_scratch, p.tokens, p.hidden, p.experts,
                   quantize ? xq.q : nullptr, quantize ? xq.scale : nullptr},
                  stream);
    } else {
      // Token tiles on x (up to 2^31 - 1), expert groups on y (E/4 <= 128).
      const dim3 grid(unsigned((p.tokens + kr::kLogitTokens - 1) / kr::kLogitTokens),
                      unsigned((p.experts + kr::kWarpsPerBlock - 1) / kr::kWarpsPerBlock));
      launch_pdl("logits_kernel", kr::logits_kernel<float>, grid, dim3(32 * kr::kWarpsPerBlock), 0, stream, p,
                 logits_scratch);
    }
    p.logits = logits_scratch;
  }
  if (p.logits != nullptr && plan.select == SelectKernel::cta) {
    const unsigned threads = unsigned((p.experts + 31) / 32 * 32);
    launch_pdl("router_cta_kernel", kr::router_cta_kernel, dim3(unsigned(p.tokens)), dim3(threads), 0, stream, p);
  } else if (p.experts <= 32) launch_select<1>(p, w_dtype, stream);
  else if (p.experts <= 64) launch_select<2>(p, w_dtype, stream);
  else if (p.experts <= 128) launch_select<4>(p, w_dtype, stream);
  else if (p.experts <= 256) launch_select<8>(p, w_dtype, stream);
  else launch_select<16>(p, w_dtype, stream);
  return quantize;
}

}  // namespace detail

void route(const Tensor& x, const Tensor& w_gate, const Tensor& logits, const Tensor& score_bias,
           const RouterOptions& opt, const Tensor& topk_ids, const Tensor& topk_weights, cudaStream_t stream,
           const Tensor& logits_scratch) {
  const char* fn = "route";
  if (topk_ids.rank != 2) detail::fail(fn, "topk_ids", "expected shape [T, k], got " + topk_ids.shape_str());
  const int64_t T = topk_ids.dim(0), k = topk_ids.dim(1);
  const int64_t E = detail::expect_router_inputs(fn, "logits", x, w_gate, logits, score_bias, opt, T, k);
  detail::expect_tensor(fn, "topk_ids", topk_ids, DType::i32, {T, k});
  detail::expect_tensor(fn, "topk_weights", topk_weights, DType::f32, {T, k});
  const bool use_scratch = !logits.given() && logits_scratch.given();
  if (use_scratch) detail::expect_tensor(fn, "logits_scratch", logits_scratch, DType::f32, {T, E});
  if (T == 0) return;
  const kernels::router::Params p = detail::router_params(x, w_gate, logits, score_bias, opt, topk_ids.as<int32_t>(),
                                                          topk_weights.as<float>(), T, E, k);
  // route() has no plan: the planner's rule, for this call's shape and the current device.
  const DeviceInfo& device = tuning::current_device();
  const RouterPlan plan = tuning::plan_router(T, E, p.hidden, logits.given() || use_scratch,
                                              device.smem_per_block_optin, device.sm_count);
  nvtxRangePushA("moekit.route");
  detail::launch_route(plan, p, w_gate.dtype, use_scratch ? logits_scratch.as<float>() : nullptr, stream);
  nvtxRangePop();
}

}  // namespace moekit
