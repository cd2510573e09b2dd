// report.cpp — the files `moekit bench` writes: --json (run-wide fields, then one object per row)
// and --csv (the same rows' fields, one line each). Plain C++ (nlohmann/json stays out of nvcc's
// way), so the CPU tests check both files without a GPU (tests/cpu/report_test.cpp).
#include "report.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <string>

#include "bench.hpp"  // kVersion, moekit::Error

namespace moekit::cli {

using json = nlohmann::ordered_json;

namespace {
// A stage's roofline for `flops`: the larger of its weights' read time and those FLOPs at `ceiling`.
double roofline_ms(const Row& r, double flops, double ceiling) {
  return std::max(r.read_time_ms.value_or(0.0), flops / (ceiling * 1e9));
}

// The roofline of a schedule that gives every touched expert an equal share of the GPU (expert
// parallelism's ranks, batches padded to a capacity): every touched expert at the busiest one's
// load. Its FLOPs are the stage's times the busiest count · touched experts / assignments; its
// read is the stage's own (an expert's weights are read once whatever its load). None for the
// stages whose FLOPs do not follow the experts' loads (router, align, combine), or without counts.
std::optional<double> busiest_roof_ms(const Row& r, double ceiling) {
  if (r.stage == "router" || r.stage == "align" || r.stage == "combine" || r.tokens_per_expert.empty()) return std::nullopt;
  int64_t assignments = 0, touched = 0, busiest = 0;
  for (const int32_t c : r.tokens_per_expert) {
    assignments += c, touched += c > 0;
    busiest = std::max<int64_t>(busiest, c);
  }
  if (assignments == 0) return std::nullopt;
  const double roof_ms = roofline_ms(r, r.cost.flops * double(busiest * touched) / double(assignments), ceiling);
  return roof_ms > 0 ? std::optional<double>(roof_ms) : std::nullopt;
}
}  // namespace

// One row of `moekit bench` as the --json file and the --csv file both hold it: the row's fields,
// then the run's (ceilings, gpu, date) it is measured against.
json row_json(const Row& r, const RunInfo& info) {
  const std::optional<double> x_read = r.x_read_time();
  // x_roof: the time over the stage's roofline, max(read time of its weight bytes, FLOPs at the
  // dense ceiling), both measured in this run (docs/design.md, "What the benchmarks report").
  // fp8 rows: the FP8 ceiling.
  const double ceiling = r.dtype == "fp8" && info.fp8_ceiling_TFLOPs > 0 ? info.fp8_ceiling_TFLOPs : info.dense_ceiling_TFLOPs;
  const double roof_ms = roofline_ms(r, r.cost.flops, ceiling);
  auto opt = [](std::optional<double> v) { return v ? json(*v) : json(nullptr); };
  const std::optional<double> busiest_ms = busiest_roof_ms(r, ceiling);
  return {{"preset", r.preset},
          {"dtype", r.dtype},
          {"tokens", r.shape.tokens},
          {"stage", r.stage},
          {"impl", r.impl},
          {"ms", r.ms},
          {"bytes", r.cost.bytes()},
          {"weight_bytes", r.cost.weight_bytes},
          {"act_bytes", r.cost.act_bytes},
          {"flops", r.cost.flops},
          {"TBps", r.TBps()},
          {"TFLOPs", r.TFLOPs()},
          {"read_ceiling_TBps", info.read_ceiling_TBps},
          {"dense_ceiling_TFLOPs", info.dense_ceiling_TFLOPs},
          {"frac_read", r.TBps() / info.read_ceiling_TBps},
          {"frac_dense", r.TFLOPs() / info.dense_ceiling_TFLOPs},
          {"frac_fp8_ceiling", info.fp8_ceiling_TFLOPs > 0 ? json(r.TFLOPs() / info.fp8_ceiling_TFLOPs) : json(nullptr)},
          {"calc_diff", opt(r.calc_diff)},
          {"fidelity_err", opt(r.fidelity_err)},
          {"read_time_ms", opt(r.read_time_ms)},
          {"x_read_time", opt(x_read)},
          {"x_roof", roof_ms > 0 ? json(r.ms / roof_ms) : json(nullptr)},
          {"x_roof_busiest", busiest_ms ? json(r.ms / *busiest_ms) : json(nullptr)},
          {"tokens_per_expert_max_over_mean", r.tokens_per_expert_max_over_mean},
          {"touched_experts", r.touched_experts},
          {"tokens_per_expert", r.tokens_per_expert},
          {"hidden", r.shape.hidden},
          {"inter", r.shape.inter},
          {"experts", r.shape.experts},
          {"topk", r.shape.topk},
          {"skew", r.skew},
          {"weight_copies", r.weight_copies},
          {"sm_clock_MHz", r.clocks ? json(r.clocks->sm_clock_mhz) : json(nullptr)},
          {"sm_clock_min_MHz", r.clocks ? json(r.clocks->sm_clock_min_mhz) : json(nullptr)},
          {"power_W", r.clocks ? json(r.clocks->power_w) : json(nullptr)},
          {"clock_limits", r.clocks ? json(clock_limit_names(r.clocks->limit_reasons)) : json(nullptr)},
          {"clock_samples", r.clocks ? json(r.clocks->samples) : json(nullptr)},
          {"gpu", info.gpu},
          {"date", info.date},
          {"config", r.config},
          {"note", r.note}};
}

// The --json file of `moekit bench`: run-wide fields, then one object per row. Lives here
// because this translation unit is plain C++ (nlohmann/json stays out of nvcc's way).
void write_json(const std::string& path, const RunInfo& info, const std::vector<Row>& rows) {
  json doc = {{"command", info.command},
              {"date", info.date},
              {"gpu", info.gpu},
              {"sm_count", info.sm_count},
              {"l2_bytes", info.l2_bytes},
              {"read_ceiling_TBps", info.read_ceiling_TBps},
              {"read_ceiling_buffer_bytes", info.read_ceiling_bytes},
              {"dense_ceiling_TFLOPs", info.dense_ceiling_TFLOPs},
              {"dense_ceiling_gemm",
               std::to_string(info.dense_ceiling_dim) + "^3 bf16, FP32 accumulate, cublasGemmEx"},
              {"moekit_version", kVersion}};
  if (info.fp8_ceiling_TFLOPs > 0) {
    doc["fp8_ceiling_TFLOPs"] = info.fp8_ceiling_TFLOPs;
    doc["fp8_ceiling_gemm"] = info.fp8_ceiling_note;
  }
  json out = json::array();
  for (const Row& r : rows) out.push_back(row_json(r, info));
  doc["rows"] = std::move(out);
  std::ofstream f(path);
  if (!f) throw Error("--json: cannot open '" + path + "' for writing");
  f << doc.dump(2) << "\n";
  if (!f) throw Error("--json: writing '" + path + "' failed");
}

// One CSV field (RFC 4180): a JSON scalar as text (null empty), tokens_per_expert as its counts
// joined by ';', quoted when it holds a comma, quote or newline.
static std::string csv_field(const json& v) {
  std::string s;
  if (v.is_null()) return s;
  if (v.is_string()) s = v.get<std::string>();
  else if (v.is_array())
    for (const json& e : v) s += (s.empty() ? "" : ";") + e.dump();
  else s = v.dump();
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// The --csv file of `moekit bench`: a header of the --json rows' keys, then one line per row.
void write_csv(const std::string& path, const RunInfo& info, const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) throw Error("--csv: cannot open '" + path + "' for writing");
  const json header = row_json(Row{}, info);
  std::string line;
  for (const auto& [key, v] : header.items()) line += (line.empty() ? "" : ",") + key;
  f << line << "\n";
  for (const Row& r : rows) {
    line.clear();
    bool first = true;
    // Named: a range-for over items() of a temporary json iterates a destroyed object.
    const json fields = row_json(r, info);
    for (const auto& [key, v] : fields.items()) line += (first ? "" : ",") + csv_field(v), first = false;
    f << line << "\n";
  }
  if (!f) throw Error("--csv: writing '" + path + "' failed");
}

void write_rows(const std::string& json_path, const std::string& csv_path, const RunInfo& info,
                const std::vector<Row>& rows) {
  if (!json_path.empty()) {
    write_json(json_path, info, rows);
    std::printf("\nwrote %zu rows to %s\n", rows.size(), json_path.c_str());
  }
  if (!csv_path.empty()) {
    write_csv(csv_path, info, rows);
    std::printf("wrote %zu rows to %s\n", rows.size(), csv_path.c_str());
  }
}

}  // namespace moekit::cli
