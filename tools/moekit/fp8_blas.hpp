// fp8_blas.hpp — the cuBLASLt references of the FP8 path, measured in the same run as moekit's
// rows (docs/design.md, "What the benchmarks report"):
//   - the FP8 tensor-core ceiling: a dense e4m3 x e4m3 -> bf16 cuBLASLt GEMM with per-tensor FP32
//     scales, at 8192^3 or at any (m, n, k), e.g. the experts' own up shape (16384, 2F, H);
//   - a baseline of the FP8 expert FFN in DeepSeek-V3's format on cuBLASLt with 128-block scales.
// Definitions: fp8_blas.cu (the ceiling's in fp8_lt.cuh, compiled into it), which also says
// what cuBLASLt supports for FP8 on Hopper, in the documentation's words.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/moe.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

// A cuBLASLt handle and the one workspace every FP8 GEMM here runs with (allocated once).
class CublasLt {
 public:
  // The workspace cuBLAS recommends on Hopper (cublasSetWorkspace()): 32 MiB.
  static constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;
  cublasLtHandle_t get() const { return h_; }
  void* workspace() const { return ws_.get(); }
  size_t workspace_bytes() const { return size_t(ws_.bytes()); }

 private:
  cublasLtHandle_t h_ = nullptr;
  DeviceBuffer ws_;
};

// ---- the FP8 ceiling ------------------------------------------------------------------------
// out [m, n] bf16 = a [m, k] · b [n, k]ᵀ: a and b e4m3 row-major (random N(0, 1) values), one FP32
// scale each (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER), CUBLAS_COMPUTE_32F, the TN layout FP8
// needs on Hopper. The heuristic's first kFp8CeilingAlgos algorithms are each timed briefly and
// the fastest is timed: the median of `steps` after max(warmup, kFp8CeilingWarmup) calls.
struct Fp8Ceiling {
  bool ok = false;
  std::string error;  // why there is no number, if !ok
  int64_t m = 0, n = 0, k = 0;
  bool fast_accum = false;  // CUBLASLT_MATMUL_DESC_FAST_ACCUM (no periodic FP32 promotion)
  double ms = 0;            // median time of one GEMM
  double TFLOPs = 0;        // 2·m·n·k / ms
  std::string note;         // what was timed: scales, layout, the algorithm picked
};
// 8192^3: large enough that cuBLASLt runs its best tile schedule at full occupancy.
inline constexpr int64_t kFp8CeilingDim = 8192;
// Warm-up calls before timing: clocks ramp for ~0.5 s of dense GEMMs (as the bf16 ceiling's
// kCeilingGemmWarmup in ceilings.cuh).
inline constexpr int kFp8CeilingWarmup = 400;
inline constexpr int kFp8CeilingAlgos = 4;

// m, n and k must be multiples of 16 (FP8's 16-byte alignment). Errors (no algorithm, a failed
// call) come back as ok = false with the reason; nothing throws past it.
Fp8Ceiling measure_fp8_gemm(const CublasLt& lt, int64_t m, int64_t n, int64_t k, cudaStream_t stream, int warmup,
                            int steps, uint64_t seed, bool fast_accum = false);
// measure_fp8_gemm at kFp8CeilingDim^3.
Fp8Ceiling measure_fp8_ceiling(const CublasLt& lt, cudaStream_t stream, int warmup, int steps, uint64_t seed);

// ---- the FP8 expert FFN on cuBLASLt ---------------------------------------------------------
// For every expert e with rows (its assignments' token rows of x_q gathered outside the timed
// region, padded to a multiple of 4 rows):
//   gate_up = X_e · W13_eᵀ [m_e, 2F] bf16   cuBLASLt FP8, 128-block scales (weights 128x128,
//                                             tokens 1x128), FP32 compute
//   act = silu(gate) ⊙ up, quantized per row and 128 columns to e4m3 (moekit's arithmetic)
//   out = act_e · W2_eᵀ [m_e, H] bf16       cuBLASLt FP8, 128-block scales
// then y[t] = Σ_j topk_weights[t, j] · out[row of (t, j)] (FP32, slot order, bf16). Timed as the
// bf16 baselines are (baselines.cu): eager calls, the median of `steps` after `warmup`, weight
// copy i % copies at step i (with graph = true, also as CUDA graphs, one per copy, launched in
// rotation); checked first on tokens 0 and T-1 against double-precision host sums on the same
// quantized values.
struct Fp8BaselineRequest {
  MoeShape shape;                 // tokens = T
  Tensor x_q;                     // [T, H] e4m3
  Tensor x_scale;                 // [T, ceil(H/128)] f32
  // One entry per weight copy, rotated step by step (bitwise-identical copies): w13 [E, 2F, H]
  // e4m3, w13_scale [E, 2·ceil(F/128), ceil(H/128)] f32, w2 [E, H, F] e4m3, w2_scale
  // [E, ceil(H/128), ceil(F/128)] f32. Copy 0 is the one checked.
  std::vector<ExpertWeights> weights;
  const std::vector<int32_t>* topk_ids = nullptr;  // [T, k], read on the host before timing
  Tensor topk_weights;            // [T, k] f32
  int warmup = 10, steps = 50;
  cudaStream_t stream = nullptr;
  const CublasLt* lt = nullptr;   // null: a handle and workspace of its own for this call
  bool graph = false;             // also time the step replayed from CUDA graphs (a second row)
};
struct Fp8BaselineResult {
  std::string impl;      // "cublaslt-fp8-loop", and "cublaslt-fp8-loop-graph" with graph = true
  double ms = 0;         // median time of all experts' up + SwiGLU/quantize + down + combine
  std::string note;      // how it was done (scaling modes, launches, padding)
  double check_err = 0;  // worst relative norm error of the checked rows (up, act, y)
  std::string check_detail;  // each checked part's error
  bool ok = false;
  std::string error;     // why the row is missing, if !ok
};
// Empty for T = 0. Errors (invalid request, no cuBLASLt algorithm, a failed check) come back as
// ok = false with the reason.
std::vector<Fp8BaselineResult> run_fp8_baselines(const Fp8BaselineRequest& req);

}  // namespace moekit::cli
