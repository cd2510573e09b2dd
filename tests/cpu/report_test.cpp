// report_test.cpp — the files `moekit bench` writes (tools/moekit/report.cpp), without a GPU: the
// --json document and the --csv lines of the same rows, read back. The CSV writer once iterated a
// destroyed temporary (a segfault on the device after a whole benchmark's work). And what the
// backward's rows count (tools/moekit/metrics.hpp), and their x_roof in the file.
//
// Build and run: cmake --build build --target moekit_cpu_tests && ./build/tests/moekit_cpu_tests --gtest_filter='Report*'
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/report.hpp"

namespace moekit::cli {
namespace {

// RFC 4180 fields of one line (quoted fields may hold commas and doubled quotes).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
    else if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

std::vector<Row> sample_rows() {
  std::vector<Row> rows(2);
  rows[0].preset = "mixtral-8x7b";
  rows[0].shape = {16, 4096, 14336, 8, 2};
  rows[0].stage = "up";
  rows[0].impl = "moekit";
  rows[0].ms = 0.25;
  rows[0].cost = {1000000, 2000, 3.5e9};
  rows[0].read_time_ms = 0.2;
  rows[0].tokens_per_expert = {4, 0, 7, 21};
  rows[0].note = "a note, with a comma and a \"quote\"";
  rows[1] = rows[0];
  rows[1].stage = "down";
  rows[1].read_time_ms.reset();  // a stage without weights: x_read_time is null
  rows[1].dtype = "fp8";
  rows[1].calc_diff = 2e-3;
  return rows;
}

TEST(Report, CsvAndJsonHoldTheSameRows) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string json_path = (dir / "moekit_report_test.json").string();
  const std::string csv_path = (dir / "moekit_report_test.csv").string();
  RunInfo info;
  info.command = "moekit bench --csv x.csv";
  info.read_ceiling_TBps = 4.5;
  info.dense_ceiling_TFLOPs = 700;
  const std::vector<Row> rows = sample_rows();
  write_rows(json_path, csv_path, info, rows);

  std::ifstream jf(json_path);
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(jf);
  ASSERT_EQ(doc["rows"].size(), rows.size());
  EXPECT_EQ(doc["rows"][0]["stage"], "up");
  EXPECT_DOUBLE_EQ(doc["rows"][0]["x_read_time"].get<double>(), 0.25 / 0.2);
  EXPECT_TRUE(doc["rows"][1]["x_read_time"].is_null());
  EXPECT_EQ(doc["rows"][1]["dtype"], "fp8");

  std::ifstream cf(csv_path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(cf, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), rows.size() + 1) << "a header, then one line per row";
  const std::vector<std::string> header = csv_fields(lines[0]);
  const auto& keys = doc["rows"][0];
  ASSERT_EQ(header.size(), keys.size());
  size_t i = 0;
  for (const auto& [key, v] : keys.items()) EXPECT_EQ(header[i++], key);
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<std::string> f = csv_fields(lines[r + 1]);
    ASSERT_EQ(f.size(), header.size()) << "line " << r + 1 << ": " << lines[r + 1];
    auto field = [&](const std::string& k) {
      for (size_t j = 0; j < header.size(); ++j)
        if (header[j] == k) return f[j];
      ADD_FAILURE() << "no column " << k;
      return std::string();
    };
    EXPECT_EQ(field("stage"), rows[r].stage);
    EXPECT_EQ(field("tokens_per_expert"), "4;0;7;21");
    EXPECT_EQ(field("note"), rows[r].note);
    EXPECT_EQ(field("x_read_time"), r == 0 ? doc["rows"][0]["x_read_time"].dump() : "");
  }
  std::remove(json_path.c_str());
  std::remove(csv_path.c_str());
}

// The SM clock and power of a row's timed steps (tools/moekit/gpu_clocks.hpp): median and lowest
// clock, mean power, the limit reasons by name; null where nothing was sampled (no NVML, a stage
// too short to sample), so every row keeps the same keys and the CSV its columns.
TEST(Report, ClockFieldsOfTheTimedSteps) {
  EXPECT_FALSE(summarize_clocks({}).has_value());
  const std::optional<ClockStats> c =
      summarize_clocks({{1980, 500000, 0x1}, {1755, 700000, 0x4}, {1620, 690000, 0x4 | 0x8}, {1830, 610000, 0}});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->samples, 4);
  EXPECT_DOUBLE_EQ(c->sm_clock_mhz, 0.5 * (1755 + 1830));
  EXPECT_DOUBLE_EQ(c->sm_clock_min_mhz, 1620);
  EXPECT_DOUBLE_EQ(c->power_w, 625.0);
  EXPECT_EQ(clock_limit_names(c->limit_reasons), "sw_power_cap+hw_slowdown") << "the idle bit is not a limit";
  EXPECT_EQ(clock_limit_names(0), "none");
  EXPECT_EQ(clock_limit_names(0x1 | 0x100), "none");

  std::vector<Row> rows = sample_rows();
  rows[0].clocks = c;
  RunInfo info;
  info.read_ceiling_TBps = 4.5;
  info.dense_ceiling_TFLOPs = 700;
  const std::string path = (std::filesystem::temp_directory_path() / "moekit_report_clocks.json").string();
  write_json(path, info, rows);
  std::ifstream f(path);
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(f);
  std::remove(path.c_str());
  const nlohmann::ordered_json &a = doc["rows"][0], &b = doc["rows"][1];
  EXPECT_DOUBLE_EQ(a["sm_clock_MHz"].get<double>(), 1792.5);
  EXPECT_DOUBLE_EQ(a["sm_clock_min_MHz"].get<double>(), 1620);
  EXPECT_DOUBLE_EQ(a["power_W"].get<double>(), 625.0);
  EXPECT_EQ(a["clock_limits"], "sw_power_cap+hw_slowdown");
  EXPECT_EQ(a["clock_samples"], 4);
  for (const char* k : {"sm_clock_MHz", "sm_clock_min_MHz", "power_W", "clock_limits", "clock_samples"})
    EXPECT_TRUE(b[k].is_null()) << k;
  EXPECT_EQ(a.size(), b.size());
}

// x_roof_busiest (issue: skewed routing): the roofline of every touched expert at the busiest one's
// load. Counts {4, 0, 7, 21}: 32 assignments, 3 touched, busiest 21 -> FLOPs x 63/32; the read
// floor is the stage's own; router, align and combine rows have none.
TEST(Report, BusiestExpertRoofline) {
  const std::string json_path = (std::filesystem::temp_directory_path() / "moekit_report_busiest.json").string();
  RunInfo info;
  info.read_ceiling_TBps = 4.5;
  info.dense_ceiling_TFLOPs = 700;
  std::vector<Row> rows = sample_rows();
  rows[0].cost.flops = 7e11;  // 1 ms at 700 TFLOP/s, above the 0.2 ms read: the dense floor
  rows[0].ms = 4.0;
  rows[1] = rows[0];
  rows[1].cost.flops = 1e9;  // 1.4 us of FLOPs even at the busiest load: the read floor stays
  rows[1].ms = 0.5;
  Row router = rows[0];
  router.stage = "router";
  Row balanced = rows[0];
  balanced.tokens_per_expert = {8, 8, 8, 8};
  rows.push_back(router);
  rows.push_back(balanced);
  write_rows(json_path, "", info, rows);
  std::ifstream jf(json_path);
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(jf);
  ASSERT_EQ(doc["rows"].size(), 4u);
  EXPECT_DOUBLE_EQ(doc["rows"][0]["x_roof"].get<double>(), 4.0);
  EXPECT_NEAR(doc["rows"][0]["x_roof_busiest"].get<double>(), 4.0 / (63.0 / 32.0), 1e-12);
  EXPECT_DOUBLE_EQ(doc["rows"][1]["x_roof_busiest"].get<double>(), 0.5 / 0.2);
  EXPECT_TRUE(doc["rows"][2]["x_roof_busiest"].is_null()) << "the router's FLOPs do not follow the loads";
  EXPECT_DOUBLE_EQ(doc["rows"][3]["x_roof_busiest"].get<double>(), doc["rows"][3]["x_roof"].get<double>())
      << "balanced loads: the same floor";
  std::remove(json_path.c_str());
}

// `moekit bench --backward`'s rows count what docs/design.md says: 12·T·k·H·F useful FLOPs, the
// touched experts' w13 and w2 read and every expert's gradients written (an untouched expert's
// zeros too), with w_gate and d_w_gate, the sums
// of the layer's and the backward's in forward+backward; x_roof is the time over the larger floor.
TEST(Report, BackwardRowsCountTheirWork) {
  const int64_t T = 16, H = 4096, F = 14336, E = 8, k = 2, A = T * k, touched = 3;
  const MoeShape s{T, H, F, E, k};
  const Routed routed{touched, 64, 16};
  const StageCost b = stage_cost("backward", s, routed);
  EXPECT_DOUBLE_EQ(b.flops, 12.0 * double(A) * double(H) * double(F));
  EXPECT_EQ(b.weight_bytes, touched * 3 * H * F * 2 + E * 3 * H * F * 2 + 2 * E * H * 2);
  EXPECT_GT(b.act_bytes, 3 * T * H * 2) << "x, dy and dx at least";
  const StageCost g = stage_cost("backward-graph", s, routed);
  EXPECT_EQ(g.weight_bytes, b.weight_bytes);
  EXPECT_EQ(g.act_bytes, b.act_bytes);
  EXPECT_DOUBLE_EQ(g.flops, b.flops);
  const StageCost layer = stage_cost("layer", s, routed), step = stage_cost("forward+backward", s, routed);
  EXPECT_EQ(step.weight_bytes, layer.weight_bytes + b.weight_bytes);
  EXPECT_EQ(step.act_bytes, layer.act_bytes + b.act_bytes);
  EXPECT_DOUBLE_EQ(step.flops, 18.0 * double(A) * double(H) * double(F));
  // With h kept by the forward: the same FLOPs and weights; h read once, not written and read, by
  // the backward, and written by the forward instead.
  const StageCost bh = stage_cost("backward-saved-h", s, routed), steph = stage_cost("forward+backward-saved-h", s, routed);
  EXPECT_DOUBLE_EQ(bh.flops, b.flops);
  EXPECT_EQ(bh.weight_bytes, b.weight_bytes);
  EXPECT_EQ(bh.act_bytes, b.act_bytes - A * 2 * F * 2);
  EXPECT_EQ(steph.act_bytes, layer.act_bytes + bh.act_bytes + A * 2 * F * 2);
  EXPECT_DOUBLE_EQ(steph.flops, step.flops);
  EXPECT_THROW(stage_cost("backward", s, routed, Precision::fp8), Error) << "the backward is bf16 only";

  const auto dir = std::filesystem::temp_directory_path();
  const std::string json_path = (dir / "moekit_report_backward_test.json").string();
  RunInfo info;
  info.read_ceiling_TBps = 4.5;
  info.dense_ceiling_TFLOPs = 700;
  std::vector<Row> rows(2);
  rows[0].shape = s;
  rows[0].stage = "backward";
  rows[0].cost = b;
  rows[0].ms = 2.0;
  rows[0].read_time_ms = 0.5;  // above the FLOPs' 0.032 ms at 700 TFLOP/s: the read floor
  rows[1] = rows[0];
  rows[1].read_time_ms = 0.001;  // below them: the dense floor
  write_rows(json_path, "", info, rows);
  std::ifstream jf(json_path);
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(jf);
  ASSERT_EQ(doc["rows"].size(), 2u);
  EXPECT_DOUBLE_EQ(doc["rows"][0]["x_read_time"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(doc["rows"][0]["x_roof"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(doc["rows"][1]["x_roof"].get<double>(), 2.0 / (b.flops / (700 * 1e9)));
  EXPECT_EQ(doc["rows"][1]["flops"].get<double>(), b.flops);
  EXPECT_EQ(doc["rows"][1]["weight_bytes"].get<int64_t>(), b.weight_bytes);
  std::remove(json_path.c_str());
}

}  // namespace
}  // namespace moekit::cli
