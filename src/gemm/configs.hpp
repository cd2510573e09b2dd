// configs.hpp — the expert-GEMM tile configurations moekit compiles, in one list.
//
// X(block_m, block_n, block_k, warps_m, warps_n, stages). The config chooser (src/tuning) picks
// among exactly these and the launcher (src/gemm/expert_gemm.cu) instantiates exactly these, so
// a table can never name a kernel that does not exist. Host-only: no device code here.
#pragma once

// NOTES: decode GEMMs run in whole waves of resident CTAs, each streaming at its pipeline's rate:
// Mixtral T=1's up GEMM is 896 16x64 tiles on 264 resident CTAs (2 per SM), 3.39 waves, and it
// runs at ~3.39/4 of the read rate; the 16x32 tile (1792 tiles, 4 per SM) has the same ratio,
// which is why tuning it gained ~1%. The 3-stage 16x64 tile fits 3 CTAs per SM (61 KB, 168
// registers), another wave count for `moekit tune` to choose per shape (Qwen3 T=1: 384 tiles on 396
// resident CTAs). The heuristic keeps the first 16-row config. block_m is the row granularity of the aligned layout, so one forward uses one block_m
// for both GEMMs. 16 rows: decode, bound by reading weights (padding is nearly free). 32 rows:
// experts with 17-32 rows read their weights once (Mixtral T=64: 0.724 -> 0.685 ms, picked by
// `moekit tune`; a 32 x 128 tile won nowhere and is not compiled).
// 64/128 rows: prefill, bound by tensor-core math (fewer B-tile re-reads per FLOP).
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
