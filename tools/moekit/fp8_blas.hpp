// fp8_blas.hpp — the cuBLASLt references of the FP8 path, measured in the same run as moekit's
// rows (docs/design.md, "What the benchmarks report"):
//   - the FP8 tensor-core ceiling: a dense e4m3 x e4m3 -> bf16 cuBLASLt GEMM with per-tensor FP32
//     scales, at 8192^3 or at any (m, n, k), e.g. the experts' own up shape (16384, 2F, H).
// Definitions, and what cuBLASLt supports for FP8 on Hopper (with the documentation's words):
// fp8_blas.cu.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace moekit::cli
