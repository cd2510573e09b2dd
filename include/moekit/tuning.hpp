// moekit/tuning.hpp — measured tile-config tables, the part a tool needs to make one: what
// `moekit tune` times (tune_candidates), the bucket rule, and the records it writes to
// configs/<device>.json (format: configs/README.md). Pure host code, unit-tested on the CPU
// (tests/cpu/tuning_table_test.cpp).
//
// The library never parses JSON at run time: cmake/tuning_tables.cmake compiles every
// configs/*.json in at configure time, and plan_forward looks a shape up in that table before its
// heuristic (src/tuning/table.hpp, internal).
//
// One table holds both precisions. An entry's precision is the one its config names say
// (config_name_precision: GemmConfig::str() starts fp8 configs with "fp8-"), so no field can
// disagree with them; each precision's entries form buckets of their own (merge_records), and an
// fp8 plan reads only entries whose up and down name fp8 configs, a bf16 plan only bf16 ones
// (find_entry). A `moekit tune --dtype fp8` run merged into configs/<device>.json beside bf16
// entries leaves every bf16 plan as it was, and the other way round.
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
// one K-tile; for a wgmma down config 1, 2 and 4 in bf16, only 1 in fp8. Ordered by block_m, then
// up, then down, then splits.
std::vector<TileChoice> tune_candidates(const MoeShape& shape, const DeviceInfo& device,
                                        Precision precision = Precision::bf16);

// What the planner's cost model (src/tuning/cost_model.hpp) estimates `choice` takes on `device`, in
// µs: the up and down GEMMs (and split-K's extra combine traffic). plan_forward ranks the
// candidates by it where no table covers a shape; `moekit tune --candidates` records it beside
// each candidate's measured time (`model_ms`), the data to refit the model's constants from.
double model_estimate_us(const MoeShape& shape, const TileChoice& choice, const DeviceInfo& device,
                         Precision precision = Precision::bf16);

// The bucket rule: given the rows per expert of the measured points of one shape (ascending,
// distinct), each point's bucket ends halfway to the next point (a shape between two measured
// points takes the nearer one's configs), and the last bucket ends at the last point (no
// extrapolation: above it the heuristic decides). Throws moekit::Error if not strictly ascending.
std::vector<double> bucket_bounds(std::span<const double> rows_per_expert_ascending);

// The precision a GemmConfig::str() name says: fp8 when it starts with "fp8-", else bf16. The name
// need not be compiled (a stale entry keeps its precision, and its buckets).
Precision config_name_precision(std::string_view config_name);

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
  Precision precision() const { return config_name_precision(up); }  // the buckets it belongs to
};

// A table file's entries after a tune run, per (shape, precision) — a shape's bf16 and fp8 points
// are separate sets of buckets: entries of other (shape, precision)s stay as they were; for each
// one in `fresh`, its fresh points replace existing ones at the same T, existing points at other
// T's stay when keep_other_tokens (--merge) and are dropped otherwise, and its bounds are
// recomputed with bucket_bounds over all its points. Sorted by shape, then precision (bf16
// first), then T. Throws moekit::Error when `fresh` measures one (shape, precision, T) twice.
std::vector<TuningRecord> merge_records(const std::vector<TuningRecord>& existing,
                                        const std::vector<TuningRecord>& fresh, bool keep_other_tokens);

}  // namespace moekit::tuning
