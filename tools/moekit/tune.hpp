// tune.hpp — `moekit tune`: its options (parsed in main.cpp), its entry point (tune.cu), and the
// table file it reads and writes, configs/<device>.json (tune_table.cpp; format in
// configs/README.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moekit/tuning.hpp"
#include "presets.hpp"

namespace moekit::cli {

struct TuneArgs {
  LayerArgs layer;
  std::vector<int64_t> tokens = {1, 2, 4, 8, 16, 32, 64};  // the decode points
  int steps = 50;
  int warmup = 10;
  std::string out;     // empty: configs/<device slug>.json
  bool merge = false;  // keep this shape's points at T's not measured now
  bool exhaustive = false;  // time every candidate in full (no screening)
  uint64_t seed = 20240901;
  int check_tokens = 16;
  std::string dtype = "bf16";  // --dtype: bf16 | fp8 (the fp8 experts of bench --dtype fp8)
  std::string candidates;      // --candidates: the JSON-lines file of every candidate (empty: none)
};

// One line of --candidates: a candidate config at one T and what became of it, appended as it
// finishes (a run cut short keeps its lines). The table keeps only each T's winner; a cost model
// of the kernels is fitted to these.
struct CandidateLine {
  int64_t hidden = 0, inter = 0, experts = 0, topk = 0, tokens = 0;
  std::string dtype, up, down;
  int down_splits = 1;
  bool heuristic = false;       // the heuristic's own choice (timed first)
  std::string outcome;          // timed | screened | check_failed | determinism_failed | skipped
  std::optional<double> ms;     // timed: median of --steps; screened: of the screen's steps
  std::optional<double> read_ms;  // streaming read of the touched weights at this T
  double model_ms = 0;          // the planner's cost model's estimate (tuning::model_estimate_us)
  std::string note;             // why it was skipped, or the failed check's summary
};
void append_candidate_line(const std::string& path, const CandidateLine& line);

int run_tune(const TuneArgs& args, const std::string& command);

// configs/<device>.json in memory.
struct TableFile {
  std::string device;  // DeviceInfo::name of the GPU it was measured on
  int sm_count = 0;
  std::vector<std::string> commands;  // the `moekit tune` runs that wrote it, oldest first
  std::vector<tuning::TuningRecord> entries;
};

// nullopt when `path` does not exist; throws moekit::Error naming the file, entry and field
// when it exists but is not a table.
std::optional<TableFile> read_table_file(const std::string& path);
// Writes through a temporary file renamed over `path`, so an interrupted run leaves the old table.
void write_table_file(const std::string& path, const TableFile& table);

}  // namespace moekit::cli
