// planner.hpp — the planner's internal parts (pure host code, unit-tested on the CPU): the rules
// that choose the router's and align's kernels and the down GEMM's split-K, and the checks that a
// plan's choices can run its shape. plan_forward (plan.cpp) composes them with the GEMM tile
// choice (a measured table's bucket, else heuristic.cpp's rule) into one ForwardPlan.
#pragma once

#include <cstdint>
#include <string>

#include "common/sm90_limits.hpp"
#include "moekit/moe.hpp"

namespace moekit::tuning {

// Plans made without a device size the router's kernels by kSm90SmemPerBlockOptin
// (common/sm90_limits.hpp) and count their CTAs against these SMs, an H100 SXM's or an H200's;
// plan_forward uses the device's own count.
inline constexpr int kSm90SmCount = 132;

// Whether `c` can be an up config: any bf16 config; an fp8 tile must cover whole 128-column act
// groups (its epilogue quantizes them): block_n 256 (128 gate + 128 up rows), or for the mma.sync
// kernel 1/2, 1/4 or 1/8 of a group (a cluster of CTAs per group, gemm/mma_sync/fp8.cuh).
bool up_config_ok(const GemmConfig& c);

// Whether `down` can take `splits` K-slices (1 <= splits <= kMaxDownSplits checked apart): any
// mma.sync config; the wgmma kernel in bf16 up to kMaxWgmmaDownSplits (its split-K answers the few
// waves of few experts' down tiles, a few slices at most; its FP8 down has none).
inline constexpr int kMaxWgmmaDownSplits = 4;
bool down_splits_ok(const GemmConfig& down, int splits);

// The largest block_m of any compiled config (the wgmma tile; configs.cpp checks every config
// against it): shape validation sizes the worst-case layout with it.
inline constexpr int kLargestBlockM = 128;

// Stage 1: the tensor-core logits tiling for T tokens, E experts, hidden size H (used when the
// layer computes the logits of a bf16 w_gate), and the selection kernel. `logits_in_memory`:
// whether the selection reads materialised logits (given, or computed into a scratch first);
// without them only the warp kernel, which computes its token's logits itself, can run.
// FP8 (`precision`): whether the gate kernel also quantizes x (RouterPlan::quantize_x). The
// device's shared memory a block may opt into and its SM count size the tilings.
RouterPlan plan_router(int64_t tokens, int64_t experts, int64_t hidden, bool logits_in_memory,
                       int64_t smem_per_block_optin, int sm_count, Precision precision = Precision::bf16);
// Stage 2: the align kernel for this many assignments (T·k).
AlignKernel plan_align(int64_t assignments);
// K-tiles a K-slice keeps at least, wherever moekit splits a reduction (the forward's down GEMM,
// plan_down_splits and the cost model's candidates; the backward's plan_splits): a slice's
// pipeline fill and its FP32 partials' epilogue are fixed costs that fewer K-tiles do not
// amortise (Qwen3-30B-A3B FP8 T=1 on the H100, K = 3 tiles: a split-2 down measured 10% slower
// than the unsplit one, tests/cpu/data/tune-fp8-h100.json).
inline constexpr int64_t kMinSliceKTiles = 4;
// Splits of a reduction into K-slices, every split-K of moekit (the forward's decode down GEMM,
// the backward's dx, dW and d_w_gate): doubled, up to max_splits, while `tiles` output tiles
// times the splits fill fewer than twice `slots` resident CTAs and each slice keeps
// kMinSliceKTiles of the reduction's `k_tiles`.
int plan_splits(int64_t tiles, int64_t k_tiles, int64_t slots, int max_splits);
// Splits of the down GEMM's K for a decode config (1: none).
int plan_down_splits(const MoeShape& shape, const GemmConfig& down, const DeviceInfo& device);

// The checks of a tile choice for `shape` (each failure names `entry` and the argument): both
// configs compiled, of one precision and block_m, an FP8 up tile that covers whole act groups, the
// shape's multiples for that precision, split-K in range and only on an mma.sync down config.
void expect_tile_choice(const MoeShape& shape, const GemmConfig& up, const GemmConfig& down, int down_splits,
                        const char* entry);
// A plan with the given GEMM configs (checked as plan_forward_with documents) and the router's and
// align's kernels for its shape, sized with `smem_per_block_optin` and `sm_count`.
ForwardPlan plan_with(const MoeShape& shape, const GemmConfig& up, const GemmConfig& down, int down_splits,
                      int64_t smem_per_block_optin, int sm_count);

// What the planner knows of the current device, read once per device (route() plans per call).
const DeviceInfo& current_device();

// Whether the align kernel `k` can run `assignments` (the warp kernel holds at most a few rounds
// of ids in registers, align/params.hpp; the grid needs the workspace's align_scratch, carved
// only for it).
bool align_kernel_fits(AlignKernel k, int64_t assignments);
// Whether the selection kernel `k` can take `experts` (the CTA kernel has a thread per expert,
// router/params.hpp).
bool select_kernel_fits(SelectKernel k, int64_t experts);

std::string to_string(GateKernel k);
std::string to_string(SelectKernel k);
std::string to_string(AlignKernel k);

}  // namespace moekit::tuning
