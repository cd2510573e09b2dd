// launch.hpp — the internal launchers of stages 3 and 4 (host-only declarations). Unchecked: the
// public entries (expert_up, expert_down, moe_forward, experts_forward, EpLayer) validate their
// arguments once, and plan_forward_with guarantees that the plan's configs can run its shape;
// these only enqueue. No allocation, no synchronisation: safe to capture in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gemm/params.hpp"
#include "moekit/moe.hpp"

namespace moekit::detail {

// act = SwiGLU(x·W13ᵀ) for every sorted row of ws (x [T, H], w13 [E, 2F, H]), with plan.up.
// fp8 plans: x is ws.x_q (its scales ws.x_scale), w13 e4m3 with w13_scale; act and act_scale out.
// plan.save_h: h [max_rows, 2F] gets g | u of each sorted row too.
// boundary (Params::boundary): the next launch on the stream is this layer's launch_expert_down
// with boundary; the up GEMM then lets it launch late, when its own loads are all issued.
void launch_expert_up(const ForwardPlan& plan, const void* x, const void* w13, const Workspace& ws,
                      cudaStream_t stream, const float* w13_scale = nullptr, void* h = nullptr,
                      bool boundary = false);
// y_rows (or y_partials) = topk_weights · act·W2ᵀ for every sorted row of ws, with plan.down.
// fp8 plans: act e4m3 with ws.act_scale, w2 e4m3 with w2_scale. rows: where the bf16 rows go
// instead of ws.y_rows (a [T·k, H] buffer: y itself where k = 1, run_experts); unsplit plans only.
// boundary (Params::boundary) is a precondition the launcher cannot check: the previous launch on
// the stream is launch_expert_up of the same plan and ws (with boundary), so the routing is final
// when down starts, before its PDL wait, and reads it to prefetch its first weight rows.
void launch_expert_down(const ForwardPlan& plan, const void* w2, const float* topk_weights, const Workspace& ws,
                        cudaStream_t stream, const float* w2_scale = nullptr, bool boundary = false,
                        void* rows = nullptr);

// The two families, for `p` filled from a plan (p.n_tiles and p.k_tiles_per_split are set here).
// mma.sync (src/gemm/mma_sync): any compiled mma_sync config, split-K allowed.
void launch_mma_sync_gemm(kernels::gemm::Mode mode, const GemmConfig& config, const kernels::gemm::Params& p,
                          int64_t max_blocks, cudaStream_t stream);
// wgmma + TMA (src/gemm/sm90): plan.block_m() 128, a compiled block_n, no split-K; `plan` gives E
// (the weights' 4-D TMA view) and max_blocks (the grid bound).
void launch_sm90_expert_gemm(kernels::gemm::Mode mode, const kernels::gemm::Params& p, const ForwardPlan& plan,
                             cudaStream_t stream, int block_n);
// The backward's GEMMs on the same kernel (Mode::Dx, DGrad, UpH): 128 x 256 tiles, 4 stages, over a
// layout of block_m 128 with max_blocks blocks, B the `experts` experts' weights (Dx, DGrad:
// N-major TMA view; UpH: Up's).
void launch_sm90_backward_gemm(kernels::gemm::Mode mode, const kernels::gemm::Params& p, int64_t max_blocks,
                               int64_t experts, cudaStream_t stream);
// The backward's weight gradients on wgmma (sm90/weight_grad.cuh): `p` with every field but the
// tile counts (set here); a_by_token: A is the gathered operand (dW2: dy), else B is (dW13: x).
void launch_sm90_weight_grad(const kernels::gemm::KGroupedParams& p, bool a_by_token, cudaStream_t stream);

}  // namespace moekit::detail
