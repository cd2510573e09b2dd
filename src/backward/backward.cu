// backward.cu — moe_backward, the backward pass of one MoE layer on the GPU (bf16): one validation
// (detail::check_backward), then the stages on the caller's stream, in the caller's workspace
// (docs/design.md, "Backward"):
//   1. h = x·W13ᵀ in sorted order (SavedActivations::recompute)            ragged.cuh
//   2. D = dy·W2 with the SwiGLU-backward epilogue: dh, act_w, dw_partials  ragged.cuh
//   3. d_topk_weights = Σ_tile dw_partials                                  reduce.cuh
//   4. the router: d_logits, and with ::gate d_w_gate                      router_grad.cuh
//   5. dx_rows = dh·W13, then dx = Σ_j dx_rows (+ d_logits·w_gate with ::gate) ragged.cuh, reduce.cuh,
//                                                                           router_grad.cuh
//   6. dW2 and dW13 over each expert's sorted rows (+ split-K sums)         weight_grad.cuh or sm90/weight_grad.cuh
// Every kernel is launched with PDL (common/launch.hpp) and waits before it reads: no allocation,
// no host synchronisation, capturable in a CUDA graph. Grids cover the worst-case rows; the rows
// used are read on the device (num_rows_padded), as the forward's GEMMs read them.
#include <nvtx3/nvToolsExt.h>

#include <array>
#include <cstdint>

#include "backward/params.hpp"
#include "backward/ragged.cuh"
#include "backward/reduce.cuh"
#include "backward/router_grad.cuh"
#include "backward/validate.hpp"
#include "backward/weight_grad.cuh"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "gemm/launch.hpp"
#include "gemm/params.hpp"
#include "moekit/backward.hpp"

namespace moekit {

namespace {

namespace kb = kernels::backward;
using detail::launch_pdl;

static_assert(kb::kRaggedTileN == kDGemmTileN, "dw_partials has a row per D column tile");
static_assert(kb::kExpertsPerLane * 32 >= kMaxExperts, "the router's warp holds every expert");

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A kernel with its tile's launch geometry. Made at launch: the first one on a device raises the
// kernel's shared-memory limit (the 128-row tile's 192 KiB needs the opt-in), once per kernel and
// device as every launcher here does (common/per_device.hpp).
template <class P>
struct TiledKernel {
  void (*fn)(P);
  int bm, bn, threads;
  size_t smem;
};
template <class Cfg, auto Kernel>
auto tiled() {
  static detail::PerDevice<bool> opted_in;
  opted_in.get([](int) {
    if (Cfg::kSmemBytes > 48 * 1024)
      MK_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes)));
    return true;
  });
  return TiledKernel{Kernel, Cfg::BM, Cfg::BN, Cfg::kThreads, Cfg::kSmemBytes};
}

template <class P>
void launch_tiled(const char* name, const TiledKernel<P>& k, dim3 grid, const P& p, cudaStream_t stream) {
  launch_pdl(name, k.fn, grid, dim3(unsigned(k.threads)), k.smem, stream, p);
}

// The kernels' row block (BackwardPlan::ragged_tile_rows): 16 rows for the decode layouts
// (block_m 16 and 32), 64 for block_m 64, 128 (the 128 x 256 tile) for block_m 128; each lies
// inside one layout block, so it has one expert. n_dim: the output columns the tiles cover.
template <kb::Major B, auto K16, auto K64, auto K128>
void launch_ragged(const char* name, const BackwardPlan& plan, int64_t n_dim, int splits, const kb::RaggedParams& p,
                   cudaStream_t stream) {
  const int bm = plan.ragged_tile_rows();
  const TiledKernel<kb::RaggedParams> k = bm == 16   ? tiled<kb::RaggedTile<16, B>, K16>()
                                          : bm == 64 ? tiled<kb::RaggedTile<64, B>, K64>()
                                                     : tiled<kb::RaggedTile<128, B>, K128>();
  launch_tiled(name, k, dim3(unsigned(plan.max_rows() / k.bm), unsigned(cdiv(n_dim, k.bn)), unsigned(splits)), p,
               stream);
}

// The forward's wgmma kernel as a backward GEMM over the layout's 128-row blocks (plan.h_wgmma:
// Mode::UpH, h = x·W13_eᵀ; plan.d_wgmma: Mode::DGrad, D = dy·W2_e with the SwiGLU backward;
// plan.dx_wgmma: Mode::Dx, dx_rows = dh·W13_e), the claim counter in the backward's workspace.
// `g` holds the mode's operands.
void launch_wgmma(kernels::gemm::Mode mode, const BackwardPlan& plan, const kb::Layout& L, const BackwardWorkspace& ws,
                  kernels::gemm::Params g, cudaStream_t stream) {
  g.sorted_ids = L.sorted_ids, g.block_expert = L.block_expert, g.num_rows_padded = L.num_rows_padded;
  g.tile_counter = ws.gemm_counter.as<int32_t>();
  g.num_assign = L.num_assign;
  g.topk = L.topk;
  g.k_splits = 1;
  detail::launch_sm90_backward_gemm(mode, g, plan.max_blocks(), plan.shape.experts, stream);
}

kb::WeightOut weight_out(const Tensor& out, const Tensor& partials, int splits, bool accumulate, int64_t rows,
                         int64_t cols, int64_t experts) {
  kb::WeightOut o{};
  o.out = out.data;
  o.f32 = out.dtype == DType::f32;
  o.accumulate = accumulate;
  o.partials = splits > 1 ? partials.as<float>() : nullptr;
  o.rows = rows, o.cols = cols, o.experts = experts;
  return o;
}

// The two weight-gradient GEMMs, as both kernels take them: per expert out_e [m, n] = Σ_r
// a[r]ᵀ·b[r] over its sorted rows r, a row of a or b being the row itself or its token's row.
//   dW2_e  [H, F]  = Σ dy_tᵀ·act_w[r]   (a = dy by token, b = act_w)
//   dW13_e [2F, H] = Σ dh[r]ᵀ·x_t       (a = dh, b = x by token)
struct WeightGemm {
  const kb::bf16* a;
  int64_t m;
  bool a_by_token;  // else b is
  const kb::bf16* b;
  int64_t n;
  const Tensor& out;
  const Tensor& partials;
};
std::array<WeightGemm, 2> weight_gemms(const MoeShape& s, const BackwardWorkspace& ws, const BackwardGrads& grads,
                                       const kb::bf16* dy, const kb::bf16* x) {
  const int64_t H = s.hidden, F = s.inter;
  return {WeightGemm{dy, H, true, ws.act_w.as<const kb::bf16>(), F, grads.dw2, ws.dw2_partials},
          WeightGemm{ws.dh.as<const kb::bf16>(), 2 * F, false, x, H, grads.dw13, ws.dw13_partials}};
}

// On the mma.sync weight-gradient tile (WeightTile<ragged_tile_rows>): a CTA per (tile, expert,
// split), into the outputs or, with plan.dw_splits > 1, the FP32 partials.
void launch_mma_sync_weight_grads(const BackwardPlan& plan, const kb::Layout& layout, const BackwardInputs& in,
                                  const BackwardWorkspace& ws, const std::array<WeightGemm, 2>& gemms,
                                  cudaStream_t stream) {
  const int64_t E = plan.shape.experts;
  const int S = plan.dw_splits;
  kb::WeightGradParams p{};
  p.layout = layout;
  p.expert_row_start = ws.expert_row_start.as<const int32_t>();
  p.expert_counts = in.expert_counts.as<const int32_t>();
  p.splits = S;
  const TiledKernel<kb::WeightGradParams> wk = plan.ragged_tile_rows() == 128
                                                   ? tiled<kb::WeightTile<128>, kb::weight_grad_kernel<128>>()
                                                   : tiled<kb::WeightTile<64>, kb::weight_grad_kernel<64>>();
  for (const WeightGemm& g : gemms) {
    p.a = kb::SortedOperand{g.a, g.m, g.a_by_token};
    p.b = kb::SortedOperand{g.b, g.n, !g.a_by_token};
    p.out = weight_out(g.out, g.partials, S, plan.options.accumulate_weight_grads, g.m, g.n, E);
    const dim3 grid(unsigned(cdiv(g.m, wk.bm) * cdiv(g.n, wk.bn)), unsigned(E), unsigned(S));
    launch_tiled("weight_grad_kernel", wk, grid, p, stream);
  }
}

// On the wgmma weight-gradient kernel (plan.dw_wgmma), into the outputs or, with plan.dw_splits
// > 1, the FP32 partials the split sums add.
void launch_wgmma_weight_grads(const BackwardPlan& plan, const kb::Layout& L, const BackwardInputs& in,
                               const BackwardWorkspace& ws, const std::array<WeightGemm, 2>& gemms,
                               cudaStream_t stream) {
  kernels::gemm::KGroupedParams p{};
  p.sorted_ids = L.sorted_ids;
  p.expert_row_start = ws.expert_row_start.as<const int32_t>();
  p.expert_counts = in.expert_counts.as<const int32_t>();
  p.tile_counter = ws.gemm_counter.as<int32_t>();
  p.num_assign = L.num_assign;
  p.topk = L.topk;
  p.experts = int32_t(plan.shape.experts);
  p.splits = plan.dw_splits;
  p.accumulate = plan.options.accumulate_weight_grads;
  for (const WeightGemm& g : gemms) {
    p.a = {g.a, g.m};
    p.b = {g.b, g.n};
    p.m_dim = g.m, p.n_dim = g.n;
    p.out = g.out.data;
    p.f32 = g.out.dtype == DType::f32;
    p.partials = plan.dw_splits > 1 ? g.partials.as<float>() : nullptr;
    detail::launch_sm90_weight_grad(p, g.a_by_token, stream);
  }
}

// expert_counts: with accumulate and out [E, ...], an expert with no rows is skipped (nothing added).
void launch_split_sum(const Tensor& partials, int splits, const Tensor& out, bool accumulate, cudaStream_t stream,
                      const int32_t* expert_counts = nullptr) {
  kb::SplitSumParams p{};
  p.partials = partials.as<const float>();
  p.out = out.data;
  p.n = out.numel();
  p.splits = splits;
  p.f32 = out.dtype == DType::f32;
  p.accumulate = accumulate;
  if (accumulate && expert_counts) p.expert_counts = expert_counts, p.plane = p.n / out.shape[0];
  launch_pdl("split_sum_kernel", kb::split_sum_kernel, dim3(unsigned(cdiv(p.n / 4, 256))), dim3(256), 0, stream, p);
}

}  // namespace

void moe_backward(const BackwardPlan& plan, const BackwardInputs& in, const RouterOptions& opt,
                  const BackwardGrads& grads, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const BackwardWorkspace ws = detail::check_backward(plan, in, opt, grads, workspace, workspace_bytes, "moe_backward");
  const MoeShape& s = plan.shape;
  const BackwardOptions& o = plan.options;
  const int64_t T = s.tokens, H = s.hidden, F = s.inter, E = s.experts, TK = s.tokens * s.topk;
  const bool gate = o.router == RouterGrad::gate;
  nvtxRangePushA("moekit.moe_backward");
  if (T == 0) {  // no rows: the weights' gradients are zeros (nothing to add when accumulating)
    if (o.weight_grads && !o.accumulate_weight_grads) {
      MK_CUDA_CHECK(cudaMemsetAsync(grads.dw13.data, 0, size_t(grads.dw13.bytes()), stream));
      MK_CUDA_CHECK(cudaMemsetAsync(grads.dw2.data, 0, size_t(grads.dw2.bytes()), stream));
    }
    if (gate) MK_CUDA_CHECK(cudaMemsetAsync(grads.d_w_gate.data, 0, size_t(grads.d_w_gate.bytes()), stream));
    nvtxRangePop();
    return;
  }
  const auto* x = in.x.as<const kb::bf16>();
  const auto* dy = in.dy.as<const kb::bf16>();
  const auto* w13 = in.w13.as<const kb::bf16>();
  const kb::Layout layout{in.sorted_ids.as<const int32_t>(), in.block_expert.as<const int32_t>(),
                          in.num_rows_padded.as<const int32_t>(), TK, int(s.topk), plan.block_m};

  // 1. h, g | u of every sorted row.
  const bool recompute = o.saved == SavedActivations::recompute;
  if (recompute) {
    kb::RaggedParams p{};
    p.layout = layout;
    p.a = x, p.a_stride = H;
    p.b = w13, p.b_expert_stride = 2 * F * H;
    p.k_dim = H, p.n_dim = 2 * F, p.inter = F;
    p.h_out = ws.h.as<kb::bf16>();
    if (plan.h_wgmma) {
      kernels::gemm::Params g{};
      g.a = x, g.b = w13, g.out = p.h_out;
      g.k_dim = H, g.n_dim = F, g.b_expert_stride = 2 * F * H;
      launch_wgmma(kernels::gemm::Mode::UpH, plan, layout, ws, g, stream);
    } else {
      launch_ragged<kb::Major::K, kb::recompute_h_kernel<16>, kb::recompute_h_kernel<64>, kb::recompute_h_kernel<128>>(
          "recompute_h_kernel", plan, 2 * F, 1, p, stream);
    }
  }

  // 2. D = dy·W2_e and its epilogue.
  {
    kb::RaggedParams p{};
    p.layout = layout;
    p.a = dy, p.a_stride = H;
    p.b = in.w2.as<const kb::bf16>(), p.b_expert_stride = H * F;
    p.k_dim = H, p.n_dim = F, p.inter = F;
    p.h = recompute ? ws.h.as<const kb::bf16>() : in.h.as<const kb::bf16>();
    p.topk_weights = in.topk_weights.as<const float>();
    p.dh = ws.dh.as<kb::bf16>();        // null when neither dx nor dW is computed
    p.act_w = ws.act_w.as<kb::bf16>();  // null without dW
    p.dw_partials = ws.dw_partials.as<float>();
    if (plan.d_wgmma) {
      kernels::gemm::Params g{};
      g.a = dy, g.b = p.b;
      g.k_dim = H, g.n_dim = F, g.b_expert_stride = H * F;
      g.topk_weights = p.topk_weights;
      g.h = p.h, g.dh = p.dh, g.act_w = p.act_w, g.dw_partials = p.dw_partials;
      launch_wgmma(kernels::gemm::Mode::DGrad, plan, layout, ws, g, stream);
    } else {
      launch_ragged<kb::Major::MN, kb::d_gemm_kernel<16>, kb::d_gemm_kernel<64>, kb::d_gemm_kernel<128>>(
          "d_gemm_kernel", plan, F, 1, p, stream);
    }
  }

  // 3. d_topk_weights: the caller's buffer when given, else the workspace's (the router reads it).
  float* d_topk = grads.d_topk_weights.given() ? grads.d_topk_weights.as<float>() : ws.d_topk_weights.as<float>();
  {
    const kb::DwReduceParams p{ws.dw_partials.as<const float>(), in.topk_ids.as<const int32_t>(), d_topk, TK,
                               int(plan.d_col_tiles()), int(E)};
    launch_pdl("dw_reduce_kernel", kb::dw_reduce_kernel, dim3(unsigned(cdiv(TK, kb::kReduceThreads))),
               dim3(kb::kReduceThreads), 0, stream, p);
  }

  // 4. The router.
  if (o.router != RouterGrad::none) {
    kb::RouterGradParams p{};
    p.logits = in.router_logits.as<const float>();
    p.topk_ids = in.topk_ids.as<const int32_t>();
    p.d_topk = d_topk;
    p.aux = gate ? in.d_logits_aux.as<const float>() : nullptr;
    p.d_logits = gate ? nullptr : grads.d_router_logits.as<float>();
    p.d_logits_split = gate ? ws.d_logits.as<kb::bf16>() : nullptr;
    p.tokens = T;
    p.experts = int(E), p.experts_padded = int(plan.experts_padded()), p.topk = int(s.topk);
    p.sigmoid = opt.scoring == Scoring::sigmoid;
    p.renormalize = opt.renormalize;
    p.scale = opt.routed_scaling_factor;
    const int64_t per_lane = cdiv(p.experts_padded, 32);
    const auto kernel = per_lane <= 1   ? kb::router_grad_kernel<1>
                        : per_lane <= 2 ? kb::router_grad_kernel<2>
                        : per_lane <= 4 ? kb::router_grad_kernel<4>
                        : per_lane <= 8 ? kb::router_grad_kernel<8>
                                        : kb::router_grad_kernel<kb::kExpertsPerLane>;
    launch_pdl("router_grad_kernel", kernel, dim3(unsigned(cdiv(T, kb::kRouterWarps))), dim3(kb::kRouterWarps * 32), 0,
               stream, p);
  }
  kb::GateGradParams gp{};  // with ::gate also the router's part of dx (5.)
  if (gate) {
    gp.d_logits_split = ws.d_logits.as<const kb::bf16>();
    gp.x = x;
    gp.w_gate = in.w_gate.data;
    gp.w_gate_f32 = in.w_gate.dtype == DType::f32;
    gp.tokens = T, gp.hidden = H;
    gp.experts = int(E), gp.experts_padded = int(plan.experts_padded());
    gp.splits = plan.gate_splits;
    gp.d_w_gate = weight_out(grads.d_w_gate, ws.gate_partials, plan.gate_splits, false, E, H, 1);
    const auto k = gate_grad_tile(E) == 128 ? tiled<kb::GateTile<128>, kb::d_w_gate_kernel<128>>()
                                            : tiled<kb::GateTile<64>, kb::d_w_gate_kernel<64>>();
    launch_tiled("d_w_gate_kernel", k, dim3(unsigned(cdiv(E, k.bm) * cdiv(H, k.bn)), 1, unsigned(plan.gate_splits)),
                 gp, stream);
    if (plan.gate_splits > 1) launch_split_sum(ws.gate_partials, plan.gate_splits, grads.d_w_gate, false, stream);
  }

  // 5. dx.
  if (o.input_grad) {
    kb::RaggedParams p{};
    p.layout = layout;
    p.a = ws.dh.as<const kb::bf16>(), p.a_stride = 2 * F;
    p.b = w13, p.b_expert_stride = 2 * F * H;
    p.k_dim = 2 * F, p.n_dim = H, p.inter = F;
    p.splits = plan.dx_splits;
    p.k_tiles_per_split = cdiv(cdiv(2 * F, kb::kTileK), plan.dx_splits);
    p.dx_rows = ws.dx_rows.as<kb::bf16>();
    p.dx_partials = ws.dx_partials.as<float>();
    if (plan.dx_wgmma) {
      kernels::gemm::Params g{};
      g.a = ws.dh.as<const kb::bf16>(), g.b = w13, g.out = ws.dx_rows.as<kb::bf16>();
      g.k_dim = 2 * F, g.n_dim = H, g.b_expert_stride = 2 * F * H;
      launch_wgmma(kernels::gemm::Mode::Dx, plan, layout, ws, g, stream);
    } else {
      launch_ragged<kb::Major::MN, kb::dx_gemm_kernel<16>, kb::dx_gemm_kernel<64>, kb::dx_gemm_kernel<128>>(
          "dx_gemm_kernel", plan, H, plan.dx_splits, p, stream);
    }
    kb::DxCombineParams c{};
    c.dx_rows = ws.dx_rows.as<const kb::bf16>();
    c.dx_partials = ws.dx_partials.as<const float>();
    c.topk_ids = in.topk_ids.as<const int32_t>();
    c.dx = grads.dx.as<kb::bf16>();
    c.tokens = T, c.hidden = H;
    c.topk = int(s.topk), c.splits = plan.dx_splits, c.experts = int(E);
    if (gate)  // the router's part summed in the same kernel: it never goes through memory
      launch_pdl("dx_router_combine_kernel",
                 gp.w_gate_f32 ? kb::dx_router_combine_kernel<true> : kb::dx_router_combine_kernel<false>,
                 dim3(unsigned(cdiv(T, 64)), unsigned(cdiv(H, 64))), dim3(kb::kThreads), 0, stream, gp, c);
    else
      launch_pdl("dx_combine_kernel", kb::dx_combine_kernel, dim3(unsigned(cdiv(T * (H / 8), kb::kReduceThreads))),
                 dim3(kb::kReduceThreads), 0, stream, c);
  }

  // 6. dW2 and dW13.
  if (o.weight_grads) {
    const kb::RowStartParams r{in.expert_counts.as<const int32_t>(), ws.expert_row_start.as<int32_t>(), int(E),
                               plan.block_m};
    launch_pdl("expert_row_start_kernel", kb::expert_row_start_kernel, dim3(1), dim3(32), 0, stream, r);
    const int S = plan.dw_splits;
    const bool acc = o.accumulate_weight_grads;
    const std::array<WeightGemm, 2> gemms = weight_gemms(plan.shape, ws, grads, dy, x);
    if (plan.dw_wgmma)
      launch_wgmma_weight_grads(plan, layout, in, ws, gemms, stream);
    else
      launch_mma_sync_weight_grads(plan, layout, in, ws, gemms, stream);
    if (S > 1)
      for (const WeightGemm& g : gemms)
        launch_split_sum(g.partials, S, g.out, acc, stream, in.expert_counts.as<const int32_t>());
  }
  nvtxRangePop();
}

}  // namespace moekit
