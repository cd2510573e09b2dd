// cost_model.hpp — the planner's model of the expert GEMMs, for shapes no measured table covers:
// each candidate tile choice (tune_candidates, what `moekit tune` times) gets an estimated time
// from the shape, the routing's expected blocks per expert, the tiles' waves and the bytes they
// keep in flight, and plan_forward_heuristic takes the cheapest. Pure host code, unit-tested on
// the CPU (tests/cpu/cost_model_test.cpp). The terms and where each constant comes from:
// docs/design.md, "The planner's cost model".
#pragma once

#include <cstdint>
#include <span>

#include "moekit/moe.hpp"
#include "moekit/tuning.hpp"

namespace moekit::tuning {

// One line of configs/sm90-occupancy.txt: the CTAs per SM of a compiled mma.sync config as the
// up or the down GEMM (scripts/check-sass computes them from the build and checks the file).
struct OccupancyEntry {
  bool fp8, up;
  int block_m, block_n, block_k, warps_m, warps_n, stages, ctas;
};
// The file as compiled in (cmake/tuning_tables.cmake, moekit_occupancy_table).
std::span<const OccupancyEntry> compiled_occupancy_table();

// CTAs of `c` an SM holds as the up (or down) GEMM: the checked table for mma.sync configs (one
// missing there: its shared memory alone decides), 1 for the persistent wgmma kernel.
int ctas_per_sm(const GemmConfig& c, bool up, const DeviceInfo& device);

// Uniform random top-k routing: each expert's count of T tokens is Binomial(T, k/E). The expected
// experts with at least one row, and the expected block_m-row blocks of the aligned layout,
// Σ_e E[ceil(count_e / block_m)] (an expert just over a block's worth pays a second block).
struct BlockEstimate {
  double touched = 0;
  double blocks = 0;
};
BlockEstimate expected_blocks(int64_t tokens, int64_t experts, int64_t topk, int block_m);

// The sm_90 machine as the model sees it: first estimates from the H200's measurements
// (docs/design.md, "The planner's cost model"), to be refitted from `moekit tune --exhaustive
// --candidates` timings.
struct MachineModel {
  double read_TBps = 4.9;         // HBM streaming read the decode GEMMs reach (DeepSeek-V3 T=128: 22 GB in 4.38 ms)
  double l2_TBps = 9.0;           // re-reads of a tile another block of the expert just read
  double latency_us = 2.0;        // a CTA's bytes in flight / this = the bandwidth it can pull
  double wgmma_TFLOPs = 600;      // bf16 wgmma kernel at large T (Mixtral T=4096: 3.06 TFLOP of padded rows in 5.39 ms)
  double wgmma_fp8_TFLOPs = 1000; // FP8 wgmma kernel at large T (60-78% of the 1,300 FP8 ceiling)
  double mma_sync_TFLOPs = 220;   // mma.sync kernels, bf16 and FP8 alike (FP8 runs on f16 HMMA;
                                  // the 128-row bf16 tile reached 279 at Mixtral T=16384, the
                                  // 32-row tiles' Mixtral T=64 fits 220)
  // How the memory and math times combine: (t_mem^p + t_math^p)^(1/p), the larger alone where the
  // other is small, ~1.26x it where both are equal (Mixtral T=256 on wgmma: 0.58 ms of each took
  // 0.74 ms).
  double overlap_p = 3.0;
  // A candidate within this of the cheapest estimate and earlier in tune_candidates' order (the
  // compiled lists put the configs `moekit tune` chose most often first) is taken instead: the
  // model does not resolve a few percent between tiles of one kernel.
  double tie_slack = 1.03;
  double wgmma_item_us = 1.5;     // a wgmma work item's epilogue and pipeline refill, tensor pipe idle
  double mma_sync_item_us = 0.2;  // an mma.sync item's epilogue (its loads stream across items)
  double launch_us = 2.0;         // a kernel in a graph, start to end, beside its work
};

// Estimated time in µs of the up and down GEMMs of `choice` for `shape` (plus, with split-K, the
// partial sums' extra traffic through the combine).
double estimate_experts_us(const MoeShape& shape, const TileChoice& choice, const DeviceInfo& device,
                           Precision precision, const MachineModel& m = {});

// The first candidate, in tune_candidates' order, whose estimate is within tie_slack of the
// smallest; a down split whose slices keep fewer than kMinSliceKTiles K-tiles is not a candidate.
// Throws moekit::Error naming `device` when no compiled config fits its shared memory.
TileChoice cheapest_tiles(const MoeShape& shape, const DeviceInfo& device, Precision precision,
                          const MachineModel& m = {});

}  // namespace moekit::tuning
