// router.cu — stage 1 launcher: validates route()'s arguments, computes the logits on many CTAs
// when a scratch is given (gate_gemm.cuh), then picks the selection kernel: a CTA per token
// (router_cta.cuh) where that measured faster, else a warp per token (router.cuh) by experts per
// lane and w_gate dtype.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "common/validate.hpp"
#include "router/gate_gemm.cuh"
#include "router/router.cuh"
#include "router/router_cta.cuh"

namespace moekit {

namespace {
template <int EPL>
void launch(const kernels::router::Params& p, DType w_dtype, cudaStream_t stream) {
  const dim3 grid(unsigned((p.tokens + kernels::router::kWarpsPerBlock - 1) / kernels::router::kWarpsPerBlock));
  const dim3 block(32 * kernels::router::kWarpsPerBlock);
  if (p.logits != nullptr)
    detail::launch_pdl("router_kernel", kernels::router::router_kernel<EPL, void>, grid, block, 0, stream, p);
  else if (w_dtype == DType::bf16)
    detail::launch_pdl("router_kernel", kernels::router::router_kernel<EPL, __nv_bfloat16>, grid, block, 0, stream, p);
  else
    detail::launch_pdl("router_kernel", kernels::router::router_kernel<EPL, float>, grid, block, 0, stream, p);
}

// Token tiles of `rows` tokens go on grid y (at most 65535 of them): a larger T is launched in
// chunks of whole tiles. launch(chunk params, token tiles) launches one chunk.
template <class Launch>
void for_each_token_chunk(const kernels::router::GateParams& p, int64_t rows, Launch&& launch) {
  const int64_t chunk = 65535 * rows;
  for (int64_t t0 = 0; t0 < p.tokens; t0 += chunk) {
    kernels::router::GateParams c = p;
    c.tokens = std::min(chunk, p.tokens - t0);
    c.x = p.x + t0 * p.hidden;
    c.logits = p.logits + t0 * p.experts;
    launch(c, unsigned((c.tokens + rows - 1) / rows));
  }
}

// Logits of a bf16 w_gate on the tensor cores (gate_gemm.cuh). The kernel and tile instance
// follow T and E only for speed: every one sums each logit in the same order.
template <int MT, int NT, bool kLooped>
void launch_gate(const kernels::router::GateParams& p, cudaStream_t stream) {
  namespace kr = kernels::router;
  using Tile = kr::GateTile<MT, NT>;
  void (*kernel)(kr::GateParams) = nullptr;
  if constexpr (kLooped) kernel = kr::gate_logits_looped_kernel<MT, NT>;
  else kernel = kr::gate_logits_kernel<MT, NT>;
  // Once per instance and device (as the GEMMs): allow its dynamic shared memory.
  static detail::PerDevice<bool> smem_ready;
  smem_ready.get([&](int) {
    MK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
    return true;
  });
  const unsigned e_tiles = unsigned((p.experts + Tile::kCols - 1) / Tile::kCols);
  for_each_token_chunk(p, Tile::kRows, [&](const kr::GateParams& c, unsigned token_tiles) {
    const dim3 grid(e_tiles * (kLooped ? 1 : kr::kGateSlices), token_tiles);
    detail::launch_pdl(kLooped ? "gate_logits_looped_kernel" : "gate_logits_kernel", kernel, grid, dim3(32 * kr::kGateWarps),
                       size_t(Tile::kSmemBytes), stream, c);
  });
}

// Prefill with E > 8: one pipelined CTA per 128 x 64 tile (gate_gemm.cuh), the same sums in the
// same order as the other instances. Stages of 4 steps, 4 deep: the fastest of 1 x 6, 2 x 6 and
// 4 x 4 under ncu (DeepSeek-V3 T=16384 gate 510 / 497 / 477 µs; Qwen3 115 / 118 / 110 µs).
constexpr int kGatePipeG = 4, kGatePipeStages = 4;
using GatePipeCfg = kernels::router::GatePipe<kGatePipeG, kGatePipeStages>;
// Shared memory of the pipelined kernel for H: the ring, then the step table (two int32 a step).
int64_t gate_pipelined_smem(int64_t hidden) {
  return GatePipeCfg::kSmemBytes + 8 * kernels::router::gate_step_table_entries(hidden);
}
// Whether this device runs the pipelined kernel for H (its step table in shared memory, int32
// columns). The first call per device also raises the kernel's shared-memory limit to the device's
// maximum, so every launch after a `true` may use gate_pipelined_smem(H).
bool gate_pipelined_fits(int64_t hidden) {
  static detail::PerDevice<int64_t> optin;
  const int64_t limit = optin.get([](int device) {
    int v = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    MK_CUDA_CHECK(cudaFuncSetAttribute(kernels::router::gate_logits_pipelined_kernel<kGatePipeG, kGatePipeStages>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, v));
    return int64_t(v);
  });
  return hidden < (int64_t(1) << 30) && gate_pipelined_smem(hidden) <= limit;
}
void launch_gate_pipelined(const kernels::router::GateParams& p, cudaStream_t stream) {
  namespace kr = kernels::router;
  auto kernel = kr::gate_logits_pipelined_kernel<kGatePipeG, kGatePipeStages>;
  const unsigned e_tiles = unsigned((p.experts + kr::kGatePipeCols - 1) / kr::kGatePipeCols);
  for_each_token_chunk(p, kr::kGatePipeRows, [&](const kr::GateParams& c, unsigned token_tiles) {
    detail::launch_pdl("gate_logits_pipelined_kernel", kernel, dim3(e_tiles, token_tiles), dim3(32 * kr::kGateWarps),
                       size_t(gate_pipelined_smem(p.hidden)), stream, c);
  });
}

// Decode (T <= 16): 16 x 8 tiles in clusters, w_gate spread over the most SMs. Up to 256 tokens:
// 32 x 32 (32 x 8 for E <= 8) tiles in clusters. Beyond: one CTA per 64 x 32 (64 x 8) tile walking
// the slices (no cluster launched per few hundred MMAs); from kGatePipeMinCtas of its 128 x 64
// tiles (E > 8), the pipelined kernel, which re-reads x and w_gate from L2 a quarter as often
// but has 8x fewer CTAs (measured on its first version, 1 step x 6 stages without the step
// table: DeepSeek-V3 T=1024, 32 CTAs, 2.5x slower than the looped kernel; T=4096, 128 CTAs, 1.4x
// faster; the threshold was not re-measured for the final 4 x 4 version).
constexpr int64_t kGatePipeMinCtas = 64;
void launch_gate(const kernels::router::GateParams& p, cudaStream_t stream) {
  namespace kr = kernels::router;
  const int64_t pipe_ctas = (p.tokens + kr::kGatePipeRows - 1) / kr::kGatePipeRows *
                            ((p.experts + kr::kGatePipeCols - 1) / kr::kGatePipeCols);
  if (p.tokens <= 16) launch_gate<1, 1, false>(p, stream);
  else if (p.tokens <= 256) {
    if (p.experts <= 8) launch_gate<2, 1, false>(p, stream);
    else launch_gate<2, 4, false>(p, stream);
  } else if (p.experts <= 8) launch_gate<4, 1, true>(p, stream);
  else if (pipe_ctas < kGatePipeMinCtas || !gate_pipelined_fits(p.hidden)) launch_gate<4, 4, true>(p, stream);
  else launch_gate_pipelined(p, stream);
}
}  // namespace

// Selection with a CTA per token (router.cuh, router_cta_kernel) for 128 < E <= 256 up to this T:
// decode and the crossover, where a token's chain of dependent instructions on one warp is the
// router's latency. Above it the warp-per-token kernel is kept (prefill's selection is throughput,
// not latency). Measured in-graph (dev/s5-call4.sh, router = gate + selection): DeepSeek-V3
// (E = 256, sigmoid, grouped) T=1 8.3 -> 7.4 us, but Qwen3 (E = 128, softmax) 4.8 -> 6.2 us: with 4
// lanes' worth of experts a warp's chain is short, and the CTA's two top-k passes (each warp's,
// then the merge) plus its barriers cost more than they save. So E <= 128 keeps router_kernel.
constexpr int64_t kRouterCtaMaxTokens = 1024;
constexpr int kRouterCtaMinExperts = 129;

void route(const Tensor& x, const Tensor& w_gate, const Tensor& logits, const Tensor& score_bias,
           const RouterOptions& opt, const Tensor& topk_ids, const Tensor& topk_weights,
           cudaStream_t stream, const Tensor& logits_scratch) {
  const char* fn = "route";
  if (topk_ids.rank != 2) detail::fail(fn, "topk_ids", "expected shape [T, k], got " + topk_ids.shape_str());
  const int64_t T = topk_ids.dim(0), k = topk_ids.dim(1);
  int64_t E = 0;
  if (logits.given()) {
    if (logits.rank != 2) detail::fail(fn, "logits", "expected shape [T, E], got " + logits.shape_str());
    E = logits.dim(1);
    detail::expect_tensor(fn, "logits", logits, DType::f32, {T, E});
  } else {
    if (!w_gate.given()) detail::fail(fn, "w_gate", "give either logits [T, E] or w_gate [E, H] with x [T, H]");
    if (w_gate.rank != 2) detail::fail(fn, "w_gate", "expected shape [E, H], got " + w_gate.shape_str());
    E = w_gate.dim(0);
    const int64_t H = w_gate.dim(1);
    if (H % 8 != 0) detail::fail(fn, "w_gate", "hidden size must be a multiple of 8, got " + std::to_string(H));
    if (w_gate.dtype != DType::bf16 && w_gate.dtype != DType::f32)
      detail::fail(fn, "w_gate", std::string("expected dtype bf16 or f32, got ") + dtype_name(w_gate.dtype));
    detail::expect_tensor(fn, "w_gate", w_gate, w_gate.dtype, {E, H});
    detail::expect_tensor(fn, "x", x, DType::bf16, {T, H});
  }
  if (E < 1 || E > kMaxExperts)
    detail::fail(fn, logits.given() ? "logits" : "w_gate", "number of experts must be in [1, 512], got " + std::to_string(E));
  if (k < 1 || k > kMaxTopk) detail::fail(fn, "topk_ids", "k must be in [1, 16], got " + std::to_string(k));
  if (k > E) detail::fail(fn, "topk_ids", "k = " + std::to_string(k) + " exceeds the number of experts " + std::to_string(E));
  detail::expect_tensor(fn, "topk_ids", topk_ids, DType::i32, {T, k});
  detail::expect_tensor(fn, "topk_weights", topk_weights, DType::f32, {T, k});
  detail::expect_optional(fn, "score_bias", score_bias, DType::f32, {E});
  if (opt.n_group < 0 || opt.n_group > 32)
    detail::fail(fn, "opt.n_group", "must be in [0, 32], got " + std::to_string(opt.n_group));
  if (opt.n_group > 0) {
    if (E % opt.n_group != 0)
      detail::fail(fn, "opt.n_group", std::to_string(E) + " experts do not split into " + std::to_string(opt.n_group) + " equal groups");
    if (opt.topk_group < 1 || opt.topk_group > opt.n_group)
      detail::fail(fn, "opt.topk_group", "must be in [1, n_group], got " + std::to_string(opt.topk_group));
    if (opt.topk_group * (E / opt.n_group) < k)
      detail::fail(fn, "opt.topk_group", "the kept groups hold fewer than k experts");
  }
  const bool use_scratch = !logits.given() && logits_scratch.given();
  if (use_scratch) detail::expect_tensor(fn, "logits_scratch", logits_scratch, DType::f32, {T, E});
  if (T == 0) return;

  kernels::router::Params p{};
  p.x = x.as<const __nv_bfloat16>();
  p.w_gate = w_gate.data;
  p.logits = logits.given() ? logits.as<const float>() : nullptr;
  p.score_bias = score_bias.given() ? score_bias.as<const float>() : nullptr;
  p.topk_ids = topk_ids.as<int32_t>();
  p.topk_weights = topk_weights.as<float>();
  p.tokens = T;
  p.hidden = logits.given() ? 0 : w_gate.dim(1);
  p.experts = int(E);
  p.topk = int(k);
  p.sigmoid = opt.scoring == Scoring::sigmoid;
  p.renormalize = opt.renormalize;
  p.n_group = int(opt.n_group);
  p.topk_group = int(opt.topk_group);
  p.routed_scaling_factor = opt.routed_scaling_factor;

  nvtxRangePushA("moekit.route");
  if (use_scratch) {  // logits over many CTAs first (bf16: tensor cores; f32: CUDA cores), then selection
    float* out = logits_scratch.as<float>();
    if (w_gate.dtype == DType::bf16) {
      launch_gate({p.x, w_gate.as<const __nv_bfloat16>(), out, T, p.hidden, p.experts}, stream);
    } else {
      // Token tiles on x (up to 2^31 - 1), expert groups on y (E/4 <= 128).
      const dim3 grid(unsigned((T + kernels::router::kLogitTokens - 1) / kernels::router::kLogitTokens),
                      unsigned((E + kernels::router::kWarpsPerBlock - 1) / kernels::router::kWarpsPerBlock));
      const dim3 block(32 * kernels::router::kWarpsPerBlock);
      detail::launch_pdl("logits_kernel", kernels::router::logits_kernel<float>, grid, block, 0, stream, p, out);
    }
    p.logits = logits_scratch.as<const float>();
  }
  if (p.logits != nullptr && E >= kRouterCtaMinExperts && E <= kernels::router::kCtaMaxExperts &&
      T <= kRouterCtaMaxTokens) {
    const unsigned threads = unsigned((E + 31) / 32 * 32);
    detail::launch_pdl("router_cta_kernel", kernels::router::router_cta_kernel, dim3(unsigned(T)), dim3(threads), 0,
                       stream, p);
  } else if (E <= 32) launch<1>(p, w_gate.dtype, stream);
  else if (E <= 64) launch<2>(p, w_gate.dtype, stream);
  else if (E <= 128) launch<4>(p, w_gate.dtype, stream);
  else if (E <= 256) launch<8>(p, w_gate.dtype, stream);
  else launch<16>(p, w_gate.dtype, stream);
  nvtxRangePop();
}

}  // namespace moekit
