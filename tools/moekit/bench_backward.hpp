// bench_backward.hpp — what `moekit bench --backward` (bench_backward.cu) shares with its two
// helpers: the oracle check of a GPU backward on sampled tokens (backward_check.cpp) and the
// cuBLAS loop of the backward's GEMMs (backward_baseline.cu).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench.hpp"
#include "layer.hpp"
#include "moekit/backward.hpp"

namespace moekit::cli {

// The bounds of the backward's GPU tests, derived in tests/gpu/backward_util.hpp (kDxTol, kDwTol)
// for the same model-scaled values the bench draws (x, dy ~ N(0, 1), w13 ~ N(0, 1/H), w2 ~
// N(0, 1/F)): u = 2^-8 is bf16's unit roundoff, and the errors are the bf16 roundings of h, act_w,
// dh and the outputs, ~0.6-0.8u in relative norm; the router's part of dx is within ~2^-16.
//   dx: relative norm error within 4u (~5x the estimate), here per sampled token.
//   d_topk_weights: a dot product ⟨D, act⟩ whose error scales with its terms, not its sum (which
//   may cancel): ‖error‖ over the sampled assignments within 4u · ‖(‖D ⊙ act‖)_a‖.
inline constexpr double kBwdUnitRoundoff = 1.0 / 256;
inline constexpr double kBwdDxTol = 4 * kBwdUnitRoundoff;
inline constexpr double kBwdDwTol = 4 * kBwdUnitRoundoff;

// What a finished moe_backward left, for the check (views of device memory).
struct BackwardOutputs {
  Tensor dx;              // [T, H] bf16
  Tensor d_topk_weights;  // [T, k] f32 (the workspace's, which the router read)
};

struct BackwardCheck {
  bool ok = false;
  int64_t tokens_checked = 0;
  int64_t experts_copied = 0;   // expert slices copied to the host for the oracle (summed over its batches)
  double dx_err_max = 0;        // worst per-token relative norm error of dx
  double d_topk_err = 0;        // ‖error‖ / ‖(‖D ⊙ act‖)_a‖ over the sampled assignments
  std::string summary;          // one line: what was compared, and the verdict
};

// dx and d_topk_weights of `check_tokens` sampled tokens (sample_tokens: always 0 and T-1) of a
// finished moe_backward (weight copy 0, RouterGrad::gate) against the oracle: ref::moe_backward on
// a sub-layer of the sampled tokens and only the experts they use, with the GPU's routing, plus
// ref::router_backward of their logits fed the GPU's own d_topk_weights (as the GPU tests do), so
// each token's dx is checked whole. Synchronises `stream`.
BackwardCheck check_backward(const GpuLayer& layer, const MoeShape& shape, const Workspace& fwd_ws, const Tensor& x,
                             const Tensor& dy, const BackwardOutputs& out, int check_tokens, uint64_t seed,
                             cudaStream_t stream);

// ---- backward_baseline.cu: the backward's GEMMs through cuBLAS -------------------------------
struct BackwardBaselineRequest {
  const GpuLayer* layer = nullptr;
  int64_t tokens = 0;
  Tensor x, dy;                                       // [T, H] bf16
  const std::vector<int32_t>* topk_ids = nullptr;     // [T, k], read on the host before timing
  const std::vector<float>* topk_weights = nullptr;   // [T, k]
  Tensor dw13, dw2;                                   // [E, 2F, H], [E, H, F] bf16: written (touched experts)
  int copies = 1;                                     // weight copies to rotate through (as moekit's rows)
  int warmup = 10, steps = 50;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
};
// Device bytes the baseline allocates for a layer of shape `s` (its gathered rows and
// intermediates): the weight rotation keeps them free.
int64_t backward_baseline_bytes(const MoeShape& s);
// The "cublas-loop" row of stage "backward": checked (first and last gathered rows, the first
// expert's dW rows) before it is timed.
BaselineResult run_backward_baseline(const BackwardBaselineRequest& req);

}  // namespace moekit::cli
