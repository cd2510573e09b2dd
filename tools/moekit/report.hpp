// report.hpp — one benchmark row, the readable table `moekit bench` prints, and the JSON file
// (--json, and --csv with the same fields; written by main.cpp, the translation unit that includes
// nlohmann/json).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gpu_clocks.hpp"  // ClockStats
#include "metrics.hpp"

namespace moekit::cli {

struct RunInfo {
  std::string command;  // full argv, joined
  std::string date;     // ISO 8601 UTC
  std::string gpu;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  double read_ceiling_TBps = 0;
  int64_t read_ceiling_bytes = 0;
  double dense_ceiling_TFLOPs = 0;
  int64_t dense_ceiling_dim = 0;
  // --dtype fp8: the FP8 tensor-core ceiling (cuBLASLt e4m3 GEMM, per-tensor scales), the roof of
  // fp8 rows' FLOPs; 0 in bf16 runs.
  double fp8_ceiling_TFLOPs = 0;
  std::string fp8_ceiling_note;
};

struct Row {
  std::string preset;
  MoeShape shape;  // tokens = T
  std::string stage;   // router|align|up|down|combine|experts|layer|layer-graph
  std::string impl;    // moekit|cublas-loop|cublas-grouped
  double ms = 0;       // median of --steps
  StageCost cost;
  std::optional<double> read_time_ms;  // streaming read of cost.weight_bytes; none without weights
  double tokens_per_expert_max_over_mean = 0;
  int64_t touched_experts = 0;
  std::vector<int32_t> tokens_per_expert;  // [E]: assignments per expert (align's expert_counts)
  std::string config;  // plan.str()
  std::string note;
  int weight_copies = 1;  // copies rotated through (L2 defeat)
  bool skew = false;
  std::string dtype = "bf16";         // of the expert weights: bf16 | fp8
  std::optional<double> calc_diff;    // fp8: y against the unquantized bf16 layer (oracle, sampled tokens)
  std::optional<double> fidelity_err; // fp8: y against the oracle on the same quantized values (rel. norm)
  std::optional<ClockStats> clocks;    // SM clock and power during the timed steps (gpu_clocks.hpp)

  double TBps() const { return ms > 0 ? double(cost.bytes()) / (ms * 1e-3) / 1e12 : 0; }
  // The stage's time over a streaming read of the same weight bytes in the same run ("x the
  // read time", docs/design.md); none for stages without weights.
  std::optional<double> x_read_time() const {
    if (!read_time_ms || !(*read_time_ms > 0)) return std::nullopt;
    return ms / *read_time_ms;
  }
  double TFLOPs() const { return ms > 0 ? cost.flops / (ms * 1e-3) / 1e12 : 0; }
};

void write_json(const std::string& path, const RunInfo& info, const std::vector<Row>& rows);
// The same rows as CSV (--csv): one header line of the JSON rows' keys, one line per row.
void write_csv(const std::string& path, const RunInfo& info, const std::vector<Row>& rows);
// Both files a bench asked for (an empty path: not asked), each with a line saying so.
void write_rows(const std::string& json_path, const std::string& csv_path, const RunInfo& info,
                const std::vector<Row>& rows);

inline void print_table_header() {
  std::printf("%-14s %6s %-12s %-15s %9s %7s %8s %6s %6s %8s %9s %7s\n", "preset", "T", "stage", "impl", "ms", "TB/s",
              "TFLOP/s", "%read", "%dense", "tpe_max", "read_ms", "x_read");
}

// %read: the stage's bytes at the run's read ceiling; x_read: its time over a streaming read of
// the same weight bytes (read_ms), measured in the same run.
inline void print_row(const Row& r, const RunInfo& info) {
  char read_ms[32] = "-", x_read[32] = "-";
  if (r.read_time_ms) std::snprintf(read_ms, sizeof read_ms, "%.4f", *r.read_time_ms);
  if (const auto x = r.x_read_time()) std::snprintf(x_read, sizeof x_read, "%.3f", *x);
  std::printf("%-14s %6lld %-12s %-15s %9.4f %7.3f %8.1f %5.1f%% %5.1f%% %8.2f %9s %7s", r.preset.c_str(),
              (long long)r.shape.tokens, r.stage.c_str(), r.impl.c_str(), r.ms, r.TBps(), r.TFLOPs(),
              100.0 * r.TBps() / info.read_ceiling_TBps, 100.0 * r.TFLOPs() / info.dense_ceiling_TFLOPs,
              r.tokens_per_expert_max_over_mean, read_ms, x_read);
  // the clock its timed steps ran at, where NVML sampled it (gpu_clocks.hpp)
  if (r.clocks)
    std::printf("  %.0f MHz %.0f W %s", r.clocks->sm_clock_mhz, r.clocks->power_w,
                clock_limit_names(r.clocks->limit_reasons).c_str());
  std::printf("\n");
}

}  // namespace moekit::cli
