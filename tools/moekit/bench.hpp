// bench.hpp — what the CLI's translation units share: the options of `moekit bench` and
// `moekit check` (parsed in main.cpp), the entry points, the oracle check of a GPU forward pass
// (check.cpp) and the cuBLAS baselines (baselines.cu). The backward's bench has its own header
// (bench_backward.hpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "exit_codes.hpp"
#include "layer.hpp"
#include "moekit/moe.hpp"
#include "moekit/version.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace moekit::cli {

inline constexpr const char* kVersion = MOEKIT_VERSION_STRING;  // CMakeLists.txt project(VERSION)


// y is compared with the double-precision oracle by relative norm error per token. bf16 operands
// and the bf16 rounding of act (between the GEMMs) and of y_rows (before combine) each add a
// relative error of up to 2^-9 per element (~0.2%, ~0.3-0.5% in norm after the sums); 1e-2
// leaves 2-3x headroom over that and still catches any wrong row, expert or weight.
inline constexpr double kYRelTolerance = 1e-2;

struct BenchArgs {
  LayerArgs layer;
  std::vector<int64_t> tokens = {1, 16, 64};
  int steps = 50;
  int warmup = 10;
  bool skew = false;
  std::string json;
  std::string csv;               // --csv: the --json rows as CSV (main.cpp, write_csv)
  uint64_t seed = 20240901;
  bool no_baselines = false;
  int check_tokens = 16;
  std::string dtype = "bf16";    // --dtype: bf16 | fp8 (bench_fp8.cu)
  int ep = 0;                    // --ep R: the expert-parallel layer over R GPUs (bench_ep.cpp)
  std::string ep_mode = "auto";  // prefill | decode | auto (decode for T <= 128 tokens per rank)
  int64_t ep_capacity = 0;       // decode rows per (source, destination); 0: never overflows
  bool backward = false;         // --backward: time moe_backward instead of the forward (bench_backward.cu)
  bool backward_mma_sync = false;  // --backward-mma-sync: its h, D, dx and dW GEMMs on the mma.sync tile, not wgmma
};

struct CheckArgs {
  LayerArgs layer;
  int64_t tokens = 16;
  bool tokens_given = false;
  bool cpu = false;
  uint64_t seed = 20240901;
  int check_tokens = 16;
};

int run_bench(const BenchArgs& args, const std::string& command);
// The start every bf16 `moekit bench` mode shares (bench.cu): the run-wide fields of its JSON
// (command, date, GPU) and its two ceilings, measured and printed under `title`.
RunInfo start_bench_run(const char* title, const LayerSpec& spec, const BenchArgs& args, const std::string& command,
                        const DeviceInfo& dev, cublasHandle_t blas, cudaStream_t stream);
// --skew: calibrates the layer's router bias to the skewed loads and prints what it reached.
void apply_skew(GpuLayer& layer, const BenchArgs& args, cudaStream_t stream);
// What one token count of a bench gave: all checks passed, the check before timing failed (nothing
// timed), or a check after timing failed (determinism, a baseline: the rows are kept).
enum class Outcome { ok, check_failed, verify_failed };
// The token loop of a bench mode: bench_tokens(T, rows) per --tokens; stops at a failed check
// before timing, then writes --json/--csv of every row measured. Returns the exit code.
template <class BenchTokens>
int bench_each_token_count(const BenchArgs& args, const RunInfo& info, BenchTokens&& bench_tokens) {
  std::vector<Row> rows;
  bool ok = true;
  for (int64_t T : args.tokens) {
    const Outcome out = bench_tokens(T, rows);
    if (out == Outcome::check_failed) {
      std::printf("check failed for T=%lld: nothing timed; stopping\n", (long long)T);
      return kExitFailed;
    }
    ok = ok && out == Outcome::ok;
  }
  write_rows(args.json, args.csv, info, rows);
  return ok ? kExitOk : kExitFailed;
}
// `moekit bench --dtype fp8`: the layer with DeepSeek-V3's FP8 experts (bench_fp8.cu).
int run_bench_fp8(const BenchArgs& args, const std::string& command);
// `moekit bench --ep R`: spawns R rank processes of this executable (argv) and, in each, times the
// EP layer. Rank 0 prints and writes --json.
int run_bench_ep(const BenchArgs& args, const std::string& command, int argc, char** argv);
// `moekit bench --backward`: the bf16 backward pass, checked and timed (bench_backward.cu).
int run_bench_backward(const BenchArgs& args, const std::string& command);
int run_check(const CheckArgs& args);

// `n` distinct tokens of [0, T), always 0 and T-1 (the ends catch offset and bound bugs), the
// rest drawn from the seed; every token when T <= n. Ascending. The tokens every oracle check
// of `moekit bench` compares (check.cpp).
std::vector<int64_t> sample_tokens(int64_t T, int n, uint64_t seed);

// ---- check.cpp: a GPU forward pass against the CPU oracle ----------------------------------
struct ForwardCheck {
  bool ok = false;
  std::vector<int32_t> topk_ids;      // [T, k] from the GPU router, every token (for baselines)
  std::vector<int32_t> expert_counts;  // [E] from the workspace
  int32_t rows_padded = 0;             // the workspace's num_rows_padded: rows the GEMMs compute
  int64_t tokens_checked = 0;
  int64_t route_mismatches = 0;  // sampled tokens whose ids or weights differ in any bit
  double y_err_max = 0;          // worst per-token relative norm error of y
  int64_t experts_copied = 0;    // expert slices copied to the host for the oracle
  std::string summary;           // one line: what was compared, and the verdict
};

// Compares a finished moe_forward (layer copy 0, x -> y, workspace ws) with the oracle on
// `check_tokens` sampled tokens (always 0 and T-1): routing bitwise, y within kYRelTolerance,
// expert_counts exactly, and the workspace status bits. Synchronises `stream`.
ForwardCheck check_forward(const GpuLayer& layer, const ForwardPlan& plan, const Workspace& ws, const Tensor& x,
                           const Tensor& y, int check_tokens, uint64_t seed, cudaStream_t stream);

// The run a check reads: y poisoned with NaN (0xffff) so an unwritten row cannot pass, then
// moe_forward on weight copy 0 of `layer`.
void poisoned_forward(const GpuLayer& layer, const ForwardPlan& plan, const Tensor& x, const Tensor& y, void* ws,
                      size_t ws_bytes, cudaStream_t stream);
// poisoned_forward, then check_forward: the check `moekit bench` runs before it times anything.
ForwardCheck checked_forward(const GpuLayer& layer, const ForwardPlan& plan, const Tensor& x, const Tensor& y,
                             void* ws, size_t ws_bytes, int check_tokens, uint64_t seed, cudaStream_t stream);

// check_forward in two halves, for checking many plans of one (layer, T, x) — `moekit tune`:
// the constructor reads the routing of a finished forward and computes the oracle's side once
// (the routing check of the sampled tokens, and their double-precision y: the costly part, with
// GBs of expert weights copied to the host); check() then compares one finished forward of any
// plan with it, exactly as check_forward does, and also requires the routing to be bitwise the
// one the oracle was computed from. check_forward(...) == ForwardOracle(...).check(ws, y).
class ForwardOracle {
 public:
  ForwardOracle(const GpuLayer& layer, const MoeShape& shape, const Workspace& ws, const Tensor& x, int check_tokens,
                uint64_t seed, cudaStream_t stream);
  ForwardCheck check(const Workspace& ws, const Tensor& y, cudaStream_t stream) const;
  std::vector<int32_t> touched_experts() const;  // experts with >= 1 assignment, ascending

 private:
  MoeShape shape_;
  std::vector<int32_t> topk_ids_;  // [T, k] of the run the oracle read
  std::vector<float> topk_w_;      // [T, k]
  bool ids_in_range_ = true;
  std::vector<int64_t> tokens_;    // sampled tokens, ascending
  int64_t route_mismatches_ = 0;
  int64_t logits_beyond_bound_ = 0;  // tensor-core logits outside ref::kTensorCoreLogitTol
  std::string first_mismatch_;
  int64_t experts_copied_ = 0;
  std::vector<double> y_ref_;      // [tokens, H]: the oracle's y of the sampled tokens
};

// ---- baselines.cu: the same expert FFN through cuBLAS ----------------------------------------
struct BaselineRequest {
  const GpuLayer* layer = nullptr;
  int64_t tokens = 0;
  Tensor x;                                 // [T, H] bf16
  const std::vector<int32_t>* topk_ids = nullptr;  // [T, k], read on the host before timing
  int copies = 1;                           // weight copies to rotate through (as moekit's rows)
  int warmup = 10, steps = 50;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
};
struct BaselineResult {
  std::string impl;   // "cublas-loop" | "cublas-grouped"
  double ms = 0;      // median time of all experts' up GEMM + SwiGLU + down GEMM
  std::string note;   // how it was done
  double check_err = 0;  // relative error of one checked row against the oracle
  bool ok = false;
  std::string error;  // why the row is missing, if !ok
};
std::vector<BaselineResult> run_baselines(const BaselineRequest& req);

}  // namespace moekit::cli
