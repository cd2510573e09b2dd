// configs.hpp — the expert-GEMM tile configurations moekit compiles, in one list.
//
// X(block_m, block_n, block_k, warps_m, warps_n, stages). The config chooser (src/tuning) picks
// among exactly these and the launcher (src/gemm/expert_gemm.cu) instantiates exactly these, so
// a table can never name a kernel that does not exist. Host-only: no device code here.
#pragma once

// block_m is the row granularity of the aligned layout, so one forward uses one block_m for both
// GEMMs. 16 rows: decode, bound by reading weights (padding is nearly free); the three 16-row
// tiles differ in CTAs per SM (2, 4 and 3: configs/sm90-occupancy.txt, checked on every build),
// which `moekit tune` weighs per shape, and the planner's cost model by their bytes in flight
// (it keeps the earlier one within 3%: the order is a preference). 32 rows: experts with 17-32
// rows read their weights once (Mixtral T=64: 0.724 -> 0.685 ms; a 32 x 128
// tile won nowhere and is not compiled). 64/128 rows: prefill, bound by tensor-core math (fewer
// B-tile re-reads per FLOP). How the decode tiles' waves and tails cost: docs/perf/NOTES.md,
// "Decode GEMM".
#define MOEKIT_GEMM_CONFIGS(X) \
  X(16, 64, 128, 1, 4, 4)      \
  X(16, 32, 128, 1, 2, 4)      \
  X(16, 64, 128, 1, 4, 3)      \
  X(32, 64, 128, 1, 4, 4)      \
  X(32, 64, 128, 1, 4, 3)      \
  X(64, 128, 64, 2, 4, 4)      \
  X(128, 128, 64, 2, 4, 3)

// The wgmma + TMA kernel (src/gemm/sm90_expert_gemm.*): X(block_n, stages); block_m 128,
// block_k 64, 12 warps (two consumer warpgroups, one producer). Measured on the H200 at Mixtral
// T=16384: 601 TFLOP/s against 279 for the mma.sync 128-row config (docs/perf/NOTES.md).
#define MOEKIT_WGMMA_CONFIGS(X) \
  X(256, 4)                     \
  X(128, 6)

// FP8 (e4m3, block scales): block_k counts e4m3 elements, one or two 128-deep scale blocks, each
// promoted on its own. The up GEMM's epilogue quantizes whole 128-column groups of act: a tile of
// block_n 256 (128 gate + 128 up rows) holds one (tuning::up_config_ok). Down tiles of any block_n.
// mma.sync (decode): X(block_m, block_n, block_k, warps_m, warps_n, stages), as above; block_k
// 256 moves the bf16 tiles' 256 bytes a row per stage. An up tile narrower than 256 runs as a
// cluster of CTAs per act group (gemm/mma_sync/fp8.cuh). The first is the cost model's on a
// near-tie, for both GEMMs: `moekit tune` on the H200 chose it for both at DeepSeek-V3 T=1-64 and
// Mixtral T=1-32, and for up at Qwen3 T=2-64 (configs/nvidia-h200.json); Qwen3 T=1 took the 4-CTA
// cluster up.
#define MOEKIT_GEMM_FP8_CONFIGS(X) \
  X(16, 256, 256, 1, 8, 3)         \
  X(16, 64, 256, 1, 4, 4)          \
  X(16, 64, 256, 1, 4, 3)          \
  X(16, 32, 256, 1, 2, 4)          \
  X(16, 256, 128, 1, 4, 4)
// wgmma (prefill): X(block_n, stages), block_m 128, block_k 128.
#define MOEKIT_WGMMA_FP8_CONFIGS(X) \
  X(256, 4)
