// heuristic.cpp — the rules that choose a kernel where no measured table does: the GEMM tiles and
// split-K for shapes without a table entry (by the cost model, cost_model.cpp), the router's
// logits tiling and selection kernel, and the align kernel. Pure host functions of the shape and
// the device description (unit-tested on the CPU); each rule carries the measurement it came from.
#include <algorithm>
#include <cstdint>

#include "align/params.hpp"
#include "common/validate.hpp"
#include "gemm/sm90/geometry.hpp"
#include "moekit/moe.hpp"
#include "router/params.hpp"
#include "tuning/cost_model.hpp"
#include "tuning/planner.hpp"
#include "tuning/table.hpp"

namespace moekit::tuning {

namespace {
// Selection with a CTA per token (select_cta.cuh) for 128 < E <= 256 up to this T: decode and the
// crossover, where a token's chain of dependent instructions on one warp is the router's latency.
// Above it the warp-per-token kernel is kept (prefill's selection is throughput, not latency).
// Measured in-graph (router = gate + selection): DeepSeek-V3 (E = 256, sigmoid, grouped) T=1
// 8.3 -> 7.4 us, but Qwen3 (E = 128, softmax) 4.8 -> 6.2 us: with 4 lanes' worth of experts a
// warp's chain is short, and the CTA's two top-k passes (each warp's, then the merge) plus its
// barriers cost more than they save. So E <= 128 keeps the warp kernel.
constexpr int64_t kSelectCtaMaxTokens = 1024;
constexpr int64_t kSelectCtaMinExperts = 129;
// The pipelined logits kernel from this many of its 128 x 64 tiles (E > 8): it re-reads x and
// w_gate from L2 a quarter as often as the looped kernel but has 8x fewer CTAs (measured on its
// first version, 1 step x 6 stages without the step table: DeepSeek-V3 T=1024, 32 CTAs, 2.5x
// slower than the looped kernel; T=4096, 128 CTAs, 1.4x faster; the threshold was not re-measured
// for the final 4 x 4 version).
constexpr int64_t kGatePipeMinCtas = 64;
// Past decode, the cluster tilings (32-row tiles, 8 CTAs each, H's slices reduced through
// distributed shared memory) while they have at most kGateClusterMaxTiles tiles, up to
// kGateClusterMaxTokens (the largest T measured). The looped kernel has T/64 x E/32 CTAs, each
// latency-bound on 16 serial load batches (ncu, Qwen3 T = 1024 on an H100 at its base clock: 64
// CTAs for 132 SMs, 39 µs, tensor pipe 12%), so its time is flat in T while the cluster tiling's
// grows with its tiles. Router µs, looped or pipelined -> cluster, by `scripts/ab` on an H100 (two
// rounds, equal in both; tiles = T/32 x E/32, or T/32 for E <= 8):
//   Mixtral     T = 512 / 1024 / 2048 (16 / 32 / 64 tiles):   16.3 -> 5.6,  16.5 -> 6.9,  17.3 -> 10.4
//   Qwen3       T = 512 / 1024 / 2048 (64 / 128 / 256 tiles):  30.9 -> 16.4, 31.4 -> 27.5, 35.1 -> 50.0
//   DeepSeek-V3 T = 512 / 1024 / 2048 (128 / 256 / 512 tiles): 48.1 -> 41.2, 50.9 -> 70.6, 111.5 -> 139.2
// The cluster tiling wins at every point with at most 128 tiles and loses at every point above.
constexpr int64_t kGateClusterMaxTiles = 128;
constexpr int64_t kGateClusterMaxTokens = 2048;

// Whether gate kernel k quantizes an FP8 layer's x as it reads it (router/params.hpp): the
// cluster tilings (decode), whose CTAs keep their slice's x tile (whole 128-column groups: the
// order's blocks) beside the staging in shared memory. Prefill's tilings leave x to
// quantize_tokens' pass: the looped one did it too, and its 64-row x tile cost the layer 20-36 µs
// against the pass's 4-14 µs (fewer CTAs per SM for a latency-bound kernel; docs/perf/NOTES.md,
// "FP8"); the pipelined one did it from its ring stages (each one 128-column group of its 128
// rows) and cost Qwen3's FP8 layer 1-3% ("Measured and dropped").
bool gate_quantizes_x(GateKernel k, int64_t hidden, int64_t smem_per_block_optin) {
  namespace kr = kernels::router;
  if (!kr::gate_tiling_quantizes_x(k) || hidden >= (int64_t(1) << 30)) return false;
  // Dynamic shared memory, plus the kernels' static tile of partial sums (kRows x kCols floats).
  auto fits = [&](int64_t dynamic, int rows, int cols) { return dynamic + int64_t(rows) * cols * 4 <= smem_per_block_optin; };
  switch (k) {
    case GateKernel::cluster_16x8: return fits(kr::gate_quantizing_smem_bytes<1, 1>(hidden), 16, 8);
    case GateKernel::cluster_32x8: return fits(kr::gate_quantizing_smem_bytes<2, 1>(hidden), 32, 8);
    case GateKernel::cluster_32x32: return fits(kr::gate_quantizing_smem_bytes<2, 4>(hidden), 32, 32);
    default: return false;  // not a quantizing tiling (checked above)
  }
}
}  // namespace

// Decode: up to 16 tokens, 16 x 8 tiles in clusters, w_gate spread over the most SMs. Up to 256
// tokens, and beyond while they are few (kGateClusterMaxTiles): 32 x 32 (32 x 8 for E <= 8) tiles
// in clusters. Beyond: one CTA per 64 x 32 (64 x 8) tile walking the slices; from kGatePipeMinCtas
// of its 128 x 64 tiles (E > 8), the pipelined kernel, when its block table fits shared memory (on
// 128 x 32 tiles where the 128 x 64 ones would fill at most half the SMs).
RouterPlan plan_router(int64_t tokens, int64_t experts, int64_t hidden, bool logits_in_memory,
                       int64_t smem_per_block_optin, int sm_count, Precision precision) {
  namespace kr = kernels::router;
  RouterPlan r;
  const int64_t pipe_ctas =
      (tokens + kr::kGatePipeRows - 1) / kr::kGatePipeRows * ((experts + kr::kGatePipeCols - 1) / kr::kGatePipeCols);
  const bool pipe_fits = hidden < (int64_t(1) << 30) && kr::gate_pipelined_smem_bytes(hidden) <= smem_per_block_optin;
  const GateKernel cluster = experts <= 8 ? GateKernel::cluster_32x8 : GateKernel::cluster_32x32;
  using Cluster8 = kr::GateTile<2, 1>;   // cluster_32x8
  using Cluster32 = kr::GateTile<2, 4>;  // cluster_32x32
  const int64_t cols = experts <= 8 ? Cluster8::kCols : Cluster32::kCols;
  const int64_t cluster_tiles = (tokens + Cluster32::kRows - 1) / Cluster32::kRows * ((experts + cols - 1) / cols);
  if (tokens <= 16) r.gate = GateKernel::cluster_16x8;
  else if (tokens <= 256 || (tokens <= kGateClusterMaxTokens && cluster_tiles <= kGateClusterMaxTiles)) r.gate = cluster;
  else if (experts <= 8) r.gate = GateKernel::looped_64x8;
  else if (pipe_ctas < kGatePipeMinCtas || !pipe_fits) r.gate = GateKernel::looped_64x32;
  else {
    // The 128 x 32 tiles (twice the CTAs, 4 warps each, each warp's 32 x 32 and its work unchanged)
    // where the 128 x 64 tiles would fill at most half the SMs: the wide kernel holds one CTA an SM
    // (its 192 KB ring), so there it leaves half of them idle. Router µs, wide -> narrow, by
    // `scripts/ab` on an H100 (132 SMs; two rounds, the narrow tiles then taken below 132 wide ones):
    //   Qwen3       T = 4096 / 8192  (64 / 128 wide tiles): 50.0 -> 40.6, 52.9 -> 74.3
    //   DeepSeek-V3 T = 2048 / 4096  (64 / 128 wide tiles): 110.9 -> 90.9, 115.6 -> 166.0
    // With 128 wide tiles the narrow grid's 256 CTAs are two waves of a kernel with a long prologue:
    // slower; with 64 it fills the SMs once.
    r.gate = 2 * pipe_ctas <= sm_count ? GateKernel::pipelined_128x32 : GateKernel::pipelined_128x64;
  }
  const bool cta = logits_in_memory && experts >= kSelectCtaMinExperts && experts <= kr::kCtaMaxExperts &&
                   tokens <= kSelectCtaMaxTokens;
  r.select = cta ? SelectKernel::cta : SelectKernel::warp;
  r.quantize_x = precision == Precision::fp8 && gate_quantizes_x(r.gate, hidden, smem_per_block_optin);
  return r;
}

AlignKernel plan_align(int64_t assignments) {
  if (assignments <= kernels::align::kWarpMaxAssignments) return AlignKernel::warp;
  return assignments <= kAlignGridMinAssignments ? AlignKernel::cta : AlignKernel::grid;
}

bool align_kernel_fits(AlignKernel k, int64_t assignments) {
  switch (k) {
    case AlignKernel::warp: return assignments <= kernels::align::kWarpMaxAssignments;
    case AlignKernel::cta: return true;
    case AlignKernel::grid: return true;
  }
  return false;
}

bool select_kernel_fits(SelectKernel k, int64_t experts) {
  return k == SelectKernel::warp || experts <= kernels::router::kCtaMaxExperts;
}

// The backward's dx GEMM (backward_plan.cpp; the forward's split-K is the cost model's): decode
// leaves a down-shaped GEMM few output tiles (Mixtral, T=1: 2 experts x 64 column tiles for 264
// resident CTAs), so most SMs would idle. Split K until the expected tiles fill the resident CTAs
// twice over, each split keeping kMinSliceKTiles K-tiles (plan_splits).
int plan_down_splits(const MoeShape& s, const GemmConfig& c, const DeviceInfo& device) {
  if (c.block_m != 16) return 1;  // prefill tiles fill the GPU
  const int64_t assignments = s.tokens * s.topk;
  const int64_t experts_touched = std::min(s.experts, assignments);
  const int64_t rows_per_expert = (assignments + experts_touched - 1) / std::max<int64_t>(experts_touched, 1);
  const int64_t blocks = experts_touched * ((rows_per_expert + c.block_m - 1) / c.block_m);
  const int64_t tiles = blocks * ((s.hidden + c.block_n - 1) / c.block_n);
  const int64_t resident =
      int64_t(device.sm_count) * std::max<int64_t>(1, device.smem_per_block_optin / gemm_smem_bytes(c));
  return plan_splits(tiles, (s.inter + c.block_k - 1) / c.block_k, resident, kMaxDownSplits);
}

int plan_splits(int64_t tiles, int64_t k_tiles, int64_t slots, int max_splits) {
  int splits = 1;
  while (splits < max_splits && tiles * splits < 2 * slots && k_tiles / (2 * splits) >= kMinSliceKTiles) splits *= 2;
  return splits;
}

std::string to_string(GateKernel k) {
  switch (k) {
    case GateKernel::cluster_16x8: return "cluster16x8";
    case GateKernel::cluster_32x8: return "cluster32x8";
    case GateKernel::cluster_32x32: return "cluster32x32";
    case GateKernel::looped_64x8: return "looped64x8";
    case GateKernel::looped_64x32: return "looped64x32";
    case GateKernel::pipelined_128x64: return "pipelined128x64";
    case GateKernel::pipelined_128x32: return "pipelined128x32";
  }
  return "?";
}
std::string to_string(SelectKernel k) { return k == SelectKernel::cta ? "cta" : "warp"; }
std::string to_string(AlignKernel k) {
  return k == AlignKernel::warp ? "warp" : k == AlignKernel::cta ? "cta" : "grid";
}

}  // namespace moekit::tuning

namespace moekit {

// The GEMM tiles and split-K where no measured table covers the shape: the candidate `moekit tune`
// would time whose estimate by the cost model (cost_model.hpp: the routing's expected blocks per
// expert, waves, bytes in flight) is cheapest. It replaced a rule of thresholds (16-row tiles up to
// 12 rows per expert, then the wgmma kernel; the first compiled config of each): on the H200's
// table it chooses the measured winner's kernel and block_m at every point but two, where the
// loser measured 1.4% (Mixtral T=64) and 3.4% (DeepSeek-V3 T=256) slower, and it takes Qwen3
// T=256 to the 32-row tiles the rule missed by 12.7% (docs/design.md, "The planner's cost model").
ForwardPlan plan_forward_heuristic(const MoeShape& shape, const DeviceInfo& device, Precision precision) {
  detail::expect_shape(shape, "plan_forward");
  detail::expect_shape_precision(shape, precision, "plan_forward");
  detail::expect_hopper(device, "plan_forward");
  const tuning::TileChoice c = tuning::cheapest_tiles(shape, device, precision);
  ForwardPlan plan = tuning::plan_with(shape, c.up, c.down, c.down_splits, device.smem_per_block_optin, device.sm_count);
  plan.source = "heuristic";
  return plan;
}

}  // namespace moekit
