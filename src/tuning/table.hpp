// table.hpp — the library's side of the measured tile-config tables: the table compiled into
// it and how plan_forward looks a shape up there. What `moekit tune` uses to make a table (the
// candidates, the bucket rule, the records) is public: moekit/tuning.hpp.
// Pure host code, unit-tested on the CPU (tests/cpu/tuning_table_test.cpp).
//
// NOTES: the library never parses JSON at run time. cmake/tuning_tables.cmake reads every
// configs/*.json at configure time and generates a C++ array of TuningEntry (build dir), which
// compiled_tuning_table() returns. The format and the bucket rule are in configs/README.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "moekit/moe.hpp"
#include "moekit/tuning.hpp"

namespace moekit::tuning {

// One bucket of a table, as compiled into the library: on `device`, for the shape (H, F, E, k)
// and rows per expert up to rows_per_expert_max, run `up` and `down` (GemmConfig::str() names)
// with down_splits. Its precision is its names' (config_name_precision). A bucket covers (the
// next smaller bound of the same shape and precision, this bound].
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

// The compiled config whose str() is `name`, or nullptr.
const GemmConfig* compiled_config_named(std::string_view name);

// The configs an entry names, when plan_forward_with would accept them on `device`: both
// compiled, one block_m, down_splits in [1, kMaxDownSplits] that the down config takes (down_splits_ok),
// both pipelines within the device's shared memory. nullopt for a stale entry (e.g. a config since
// removed from src/gemm/configs.hpp): plan_forward then skips it, never fails on it.
std::optional<TileChoice> resolve_entry(const TuningEntry& e, const DeviceInfo& device);

// The entry of `table` that applies: among the entries for this device (name matched exactly),
// shape (H, F, E, k) and precision (up and down both name configs of `precision`; an entry of the
// other precision, or one mixing the two, is not this plan's) that resolve, the one with the
// smallest rows_per_expert_max >= the shape's rows per expert (the first such in table order on a
// tie). nullptr when none does — a shape above every bound, another shape, device or precision,
// or only stale entries: the heuristic decides.
const TuningEntry* find_entry(std::span<const TuningEntry> table, const MoeShape& shape, const DeviceInfo& device,
                              Precision precision = Precision::bf16);

// The plan of find_entry's entry (its configs, checked as plan_forward_with checks them, and the
// router's and align's kernels for this device; source
// "table:<file>(rows/expert<=<bound>)"), or nullopt when there is none. plan_forward calls this
// with compiled_tuning_table() before its heuristic, for either precision; tests call it with
// tables of their own.
std::optional<ForwardPlan> plan_from_table(std::span<const TuningEntry> table, const MoeShape& shape,
                                           const DeviceInfo& device, Precision precision = Precision::bf16);

}  // namespace moekit::tuning
