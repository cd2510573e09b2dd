// moekit/tuning.hpp — measured tile-config tables, the part a tool needs to make one: what
// `moekit tune` times (tune_candidates), the bucket rule, and the records it writes to
// configs/<device>.json (format: configs/README.md). Pure host code, unit-tested on the CPU
// (tests/cpu/tuning_table_test.cpp).
//
// The library never parses JSON at run time: cmake/tuning_tables.cmake compiles every
// configs/*.json in at configure time, and plan_forward looks a shape up in that table before its
// heuristic (src/tuning/table.hpp, internal).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/moe.hpp"

namespace moekit::tuning {

// T*k/E: the quantity tiles follow (docs/design.md, "Rules"), and the key of a table's buckets.
double rows_per_expert(const MoeShape& shape);

// Shared memory a GemmConfig's pipeline needs (bytes): stages x (A tile + B tile), bf16.
int64_t gemm_smem_bytes(const GemmConfig& c);

// Tile configs for one forward: what a table entry resolves to, and what `moekit tune` tries.
struct TileChoice {
  GemmConfig up, down;
  int down_splits = 1;
  bool operator==(const TileChoice&) const = default;
};

// "NVIDIA H200" -> "nvidia-h200": lower case, every run of other characters one '-', none at the
// ends. configs/<slug>.json is the device's table.
std::string device_slug(std::string_view device_name);

// Every candidate `moekit tune` times for `shape` on `device`: each pair (up, down) of compiled
// configs with one block_m whose pipelines fit the device's shared memory; for an mma.sync down
// config every down_splits in {1, 2, 4, ..., kMaxDownSplits} that leaves each K-slice at least
// one K-tile, for wgmma only 1. Ordered by block_m, then up, then down, then splits.
std::vector<TileChoice> tune_candidates(const MoeShape& shape, const DeviceInfo& device,
                                        Precision precision = Precision::bf16);

// The bucket rule: given the rows per expert of the measured points of one shape (ascending,
// distinct), each point's bucket ends halfway to the next point (a shape between two measured
// points takes the nearer one's configs), and the last bucket ends at the last point (no
// extrapolation: above it the heuristic decides). Throws moekit::Error if not strictly ascending.
std::vector<double> bucket_bounds(std::span<const double> rows_per_expert_ascending);

// One entry of configs/<device>.json as `moekit tune` writes it: a measured point (T) with the
// bound of its bucket and what was measured there.
struct TuningRecord {
  int64_t hidden = 0, inter = 0, experts = 0, topk = 0;
  int64_t tokens = 0;                // T the configs were measured at
  double rows_per_expert_max = 0;    // its bucket's bound (bucket_bounds)
  std::string up, down;              // GemmConfig::str()
  int down_splits = 1;
  double ms = 0;                     // median up + down + combine time of these configs
  double frac_read = 0;              // read time of the touched experts' weights / ms
  std::optional<double> heuristic_ms;  // the heuristic's configs, same measurement (if timed)
  std::string date;                  // ISO 8601 UTC of the measurement
  MoeShape shape() const { return MoeShape{tokens, hidden, inter, experts, topk}; }
};

// A table file's entries after a tune run: entries of other shapes stay as they were; for each
// shape in `fresh`, its fresh points replace existing ones at the same T, existing points at other
// T's stay when keep_other_tokens (--merge) and are dropped otherwise, and that shape's bounds are
// recomputed with bucket_bounds over all its points. Sorted by shape, then T. Throws
// moekit::Error when `fresh` measures one (shape, T) twice.
std::vector<TuningRecord> merge_records(const std::vector<TuningRecord>& existing,
                                        const std::vector<TuningRecord>& fresh, bool keep_other_tokens);

}  // namespace moekit::tuning
