// table.hpp — measured tile-config tables: what `moekit tune` writes to configs/<device>.json,
// what the library compiles from those files, and how plan_forward looks a shape up in them.
// Pure host code, unit-tested on the CPU (tests/cpu/tuning_table_test.cpp).
//
// NOTES: the library never parses JSON at run time. cmake/tuning_tables.cmake reads every
// configs/*.json at configure time and generates a C++ array of TuningEntry (build dir), which
// compiled_tuning_table() returns. The format and the bucket rule are in configs/README.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/moe.hpp"

namespace moekit::tuning {

// One bucket of a table, as compiled into the library: on `device`, for the shape (H, F, E, k)
// and rows per expert up to rows_per_expert_max, run `up` and `down` (GemmConfig::str() names)
// with down_splits. A bucket covers (the next smaller bound of the same shape, this bound].
struct TuningEntry {
  std::string_view device;  // DeviceInfo::name, matched exactly ("NVIDIA H200")
  std::string_view source;  // the file it came from, relative to the source tree
  int64_t hidden = 0, inter = 0, experts = 0, topk = 0;
  double rows_per_expert_max = 0;
  std::string_view up, down;
  int down_splits = 1;
};

// Every configs/*.json of this build, in file order; empty when there are none.
std::span<const TuningEntry> compiled_tuning_table();

// T*k/E: the quantity tiles follow (DESIGN "Rules"), and the key of a table's buckets.
double rows_per_expert(const MoeShape& shape);

// Shared memory a GemmConfig's pipeline needs (bytes): stages x (A tile + B tile), bf16.
int64_t gemm_smem_bytes(const GemmConfig& c);

// Tile configs for one forward: what a table entry resolves to, and what `moekit tune` tries.
struct TileChoice {
  GemmConfig up, down;
  int down_splits = 1;
  bool operator==(const TileChoice&) const = default;
};

// The compiled config whose str() is `name`, or nullptr.
const GemmConfig* compiled_config_named(std::string_view name);

// The configs an entry names, when plan_forward_with would accept them on `device`: both
// compiled, one block_m, down_splits in [1, kMaxDownSplits] (and 1 unless down is mma.sync),
// both pipelines within the device's shared memory. nullopt for a stale entry (e.g. a config since
// removed from src/gemm/configs.hpp): plan_forward then skips it, never fails on it.
std::optional<TileChoice> resolve_entry(const TuningEntry& e, const DeviceInfo& device);

// The entry of `table` that applies: among the entries for this device (name matched exactly) and
// shape (H, F, E, k) that resolve, the one with the smallest rows_per_expert_max >= the shape's
// rows per expert (the first such in table order on a tie). nullptr when none does — a shape
// above every bound, another shape or device, or only stale entries: the heuristic decides.
const TuningEntry* find_entry(std::span<const TuningEntry> table, const MoeShape& shape, const DeviceInfo& device);

// The plan of find_entry's entry (plan_forward_with its configs; source
// "table:<file>(rows/expert<=<bound>)"), or nullopt when there is none. plan_forward calls this
// with compiled_tuning_table() before its heuristic; tests call it with tables of their own.
std::optional<ForwardPlan> plan_from_table(std::span<const TuningEntry> table, const MoeShape& shape,
                                           const DeviceInfo& device);

// ---- what `moekit tune` uses (the CLI writes the JSON; these are its pure parts) --------------

// "NVIDIA H200" -> "nvidia-h200": lower case, every run of other characters one '-', none at the
// ends. configs/<slug>.json is the device's table.
std::string device_slug(std::string_view device_name);

// Every candidate `moekit tune` times for `shape` on `device`: each pair (up, down) of compiled
// configs with one block_m whose pipelines fit the device's shared memory; for an mma.sync down
// config every down_splits in {1, 2, 4, ..., kMaxDownSplits} that leaves each K-slice at least
// one K-tile, for wgmma only 1. Ordered by block_m, then up, then down, then splits.
std::vector<TileChoice> tune_candidates(const MoeShape& shape, const DeviceInfo& device);

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
