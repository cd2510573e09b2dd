// tuning_precision_test.cpp — the two precisions in one measured table (src/tuning/table.hpp,
// moekit/tuning.hpp): an entry's precision is its config names', each precision plans from its
// own buckets only (an fp8 run merged beside bf16 entries changes no bf16 plan, and the other way
// round), entries of the other precision or mixing the two are skipped, merging keeps the two
// precisions' buckets apart, and `moekit tune --dtype fp8` gets only fp8 candidates.
#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_test_util.hpp"
#include "tuning/planner.hpp"
#include "tuning/table.hpp"

namespace moekit::testing {
namespace {

using tuning::TuningEntry;
using tuning::TuningRecord;

DeviceInfo test_gpu() {
  DeviceInfo d = kH200;
  d.name = "Test GPU";
  return d;
}

// The first compiled config of `precision` with this block_m, kernel and (when > 0) block_n.
const GemmConfig& compiled(Precision precision, int block_m, GemmKernel kernel, int block_n = 0) {
  for (const GemmConfig& c : compiled_gemm_configs(precision))
    if (c.block_m == block_m && c.kernel == kernel && (block_n == 0 || c.block_n == block_n)) return c;
  throw std::logic_error("no compiled " + std::string(precision_name(precision)) + " config with block_m " +
                         std::to_string(block_m));
}
const GemmConfig& bf16_decode() { return compiled(Precision::bf16, 16, GemmKernel::mma_sync); }
const GemmConfig& fp8_up() { return compiled(Precision::fp8, 16, GemmKernel::mma_sync, 2 * kFp8Block); }
const GemmConfig& fp8_down() { return compiled(Precision::fp8, 16, GemmKernel::mma_sync); }

// Names live as long as the test binary (TuningEntry holds string_views, as the generated one).
std::string_view keep(const std::string& s) {
  static std::set<std::string> names;
  return *names.insert(s).first;
}

constexpr int64_t kH = 7168, kF = 2048, kE = 256, kK = 8;  // DeepSeek-V3's layer: rows per expert T/32
MoeShape deepseek(int64_t T) { return MoeShape{T, kH, kF, kE, kK}; }

TuningEntry entry(double bound, const GemmConfig& up, const GemmConfig& down, int splits) {
  return TuningEntry{"Test GPU", "configs/test-gpu.json", kH, kF, kE, kK, bound, keep(up.str()), keep(down.str()), splits};
}

// bf16 buckets <= 0.0625 (splits 2) and <= 0.5 (splits 1); fp8 buckets <= 0.03125 (splits 4) and
// <= 0.25 (splits 8), interleaved in table order. The splits say which entry a plan came from.
std::vector<TuningEntry> mixed_table() {
  return {entry(0.0625, bf16_decode(), bf16_decode(), 2), entry(0.03125, fp8_up(), fp8_down(), 4),
          entry(0.5, bf16_decode(), bf16_decode(), 1), entry(0.25, fp8_up(), fp8_down(), 8)};
}

TEST(TuningPrecision, ConfigNamesSayTheirPrecision) {
  for (Precision p : {Precision::bf16, Precision::fp8})
    for (const GemmConfig& c : compiled_gemm_configs(p)) EXPECT_EQ(tuning::config_name_precision(c.str()), p) << c.str();
  EXPECT_EQ(tuning::config_name_precision("fp8-m16n64k128w1x4s99"), Precision::fp8);  // uncompiled: still fp8
  EXPECT_EQ(tuning::config_name_precision("m16n64k128w1x4s4"), Precision::bf16);
  EXPECT_EQ(tuning::config_name_precision("fp8"), Precision::bf16);  // no "fp8-" prefix
  TuningRecord r;
  r.up = r.down = fp8_up().str();
  EXPECT_EQ(r.precision(), Precision::fp8);
}

TEST(TuningPrecision, EachPrecisionPlansFromItsOwnEntries) {
  const std::vector<TuningEntry> t = mixed_table();
  const DeviceInfo d = test_gpu();
  auto splits = [&](int64_t T, Precision p) {
    const TuningEntry* e = tuning::find_entry(t, deepseek(T), d, p);
    return e ? e->down_splits : 0;
  };
  // T 1: 0.03125 rows per expert, in the smallest bucket of each precision.
  EXPECT_EQ(splits(1, Precision::bf16), 2);
  EXPECT_EQ(splits(1, Precision::fp8), 4);
  // T 2 (0.0625): fp8's first bucket ends below it; bf16's first bucket is not fp8's.
  EXPECT_EQ(splits(2, Precision::bf16), 2);
  EXPECT_EQ(splits(2, Precision::fp8), 8);
  // T 16 (0.5): past every fp8 bound (the heuristic decides), in bf16's last bucket.
  EXPECT_EQ(splits(16, Precision::bf16), 1);
  EXPECT_EQ(splits(16, Precision::fp8), 0);
  EXPECT_EQ(splits(8, Precision::fp8), 8);  // exactly 0.25
  // The plans carry their precision's configs.
  const auto bf = tuning::plan_from_table(t, deepseek(2), d, Precision::bf16);
  const auto f8 = tuning::plan_from_table(t, deepseek(2), d, Precision::fp8);
  ASSERT_TRUE(bf.has_value());
  ASSERT_TRUE(f8.has_value());
  EXPECT_EQ(bf->up, bf16_decode());
  EXPECT_EQ(bf->precision(), Precision::bf16);
  EXPECT_EQ(f8->up, fp8_up());
  EXPECT_EQ(f8->down, fp8_down());
  EXPECT_EQ(f8->precision(), Precision::fp8);
  EXPECT_EQ(f8->down_splits, 8);
  EXPECT_EQ(f8->source, "table:configs/test-gpu.json(rows/expert<=0.25)");
  EXPECT_FALSE(tuning::plan_from_table(t, deepseek(16), d, Precision::fp8).has_value());
  // The default is bf16, as plan_forward's.
  EXPECT_EQ(tuning::find_entry(t, deepseek(1), d), tuning::find_entry(t, deepseek(1), d, Precision::bf16));
}

TEST(TuningPrecision, AddingTheOtherPrecisionChangesNoPlan) {
  const DeviceInfo d = test_gpu();
  const std::vector<TuningEntry> both = mixed_table();
  std::vector<TuningEntry> bf16_only, fp8_only;
  for (const TuningEntry& e : both)
    (tuning::config_name_precision(e.up) == Precision::fp8 ? fp8_only : bf16_only).push_back(e);
  for (int64_t T : {1, 2, 3, 4, 8, 9, 16, 17, 4096}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    EXPECT_EQ(tuning::find_entry(both, deepseek(T), d, Precision::bf16) != nullptr,
              tuning::find_entry(bf16_only, deepseek(T), d, Precision::bf16) != nullptr);
    EXPECT_EQ(tuning::find_entry(both, deepseek(T), d, Precision::fp8) != nullptr,
              tuning::find_entry(fp8_only, deepseek(T), d, Precision::fp8) != nullptr);
    const TuningEntry* b = tuning::find_entry(both, deepseek(T), d, Precision::bf16);
    if (b) EXPECT_EQ(b->down_splits, tuning::find_entry(bf16_only, deepseek(T), d)->down_splits);
    const TuningEntry* f = tuning::find_entry(both, deepseek(T), d, Precision::fp8);
    if (f) EXPECT_EQ(f->down_splits, tuning::find_entry(fp8_only, deepseek(T), d, Precision::fp8)->down_splits);
    // A table of one precision gives the other nothing.
    EXPECT_EQ(tuning::find_entry(bf16_only, deepseek(T), d, Precision::fp8), nullptr);
    EXPECT_EQ(tuning::find_entry(fp8_only, deepseek(T), d, Precision::bf16), nullptr);
  }
}

TEST(TuningPrecision, EntriesMixingThePrecisionsOrBreakingFp8RulesAreSkipped) {
  const DeviceInfo d = test_gpu();
  struct Mixed {
    const char* why;
    TuningEntry e;
  };
  const Mixed mixed[] = {
      {"fp8 up, bf16 down", entry(0.25, fp8_up(), bf16_decode(), 1)},
      {"bf16 up, fp8 down", entry(0.25, bf16_decode(), fp8_down(), 1)},
  };
  for (const Mixed& m : mixed) {
    SCOPED_TRACE(m.why);
    EXPECT_FALSE(tuning::resolve_entry(m.e, d).has_value());
    for (Precision p : {Precision::bf16, Precision::fp8}) {
      const TuningEntry only[] = {m.e};
      EXPECT_EQ(tuning::find_entry(only, deepseek(1), d, p), nullptr);
      EXPECT_NO_THROW(EXPECT_FALSE(tuning::plan_from_table(only, deepseek(1), d, p).has_value()));
      // Before a valid bucket of each precision: skipped, that precision's own bucket serves.
      const TuningEntry three[] = {m.e, entry(0.5, bf16_decode(), bf16_decode(), 2), entry(0.5, fp8_up(), fp8_down(), 4)};
      const TuningEntry* e = tuning::find_entry(three, deepseek(1), d, p);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->down_splits, p == Precision::fp8 ? 4 : 2);
    }
  }
}

TEST(TuningPrecision, PlanForwardFp8WithoutATableIsTheHeuristic) {
  // kH200 is named "H200": no table of configs/ applies (tuning_table_test.cpp says why).
  for (int64_t T : {1, 16, 64, 512, 4096}) {
    const ForwardPlan a = plan_forward(deepseek(T), kH200, Precision::fp8);
    const ForwardPlan b = plan_forward_heuristic(deepseek(T), kH200, Precision::fp8);
    EXPECT_EQ(a.up, b.up);
    EXPECT_EQ(a.down, b.down);
    EXPECT_EQ(a.down_splits, b.down_splits);
    EXPECT_EQ(a.precision(), Precision::fp8);
    EXPECT_EQ(a.source, "heuristic");
  }
}

TuningRecord record(int64_t T, const GemmConfig& c, double bound = -1) {
  TuningRecord r;
  r.hidden = kH, r.inter = kF, r.experts = kE, r.topk = kK, r.tokens = T;
  r.up = r.down = c.str();
  r.rows_per_expert_max = bound;
  return r;
}

TEST(TuningPrecision, MergeKeepsThePrecisionsBucketsApart) {
  const GemmConfig& b = bf16_decode();
  const GemmConfig& f = fp8_up();
  // bf16 measured at T 1, 2, 4 (rows per expert 1/32, 1/16, 1/8).
  const std::vector<TuningRecord> existing = {record(1, b, 0.046875), record(2, b, 0.09375), record(4, b, 0.125)};
  using Row = std::tuple<int64_t, Precision, double>;
  auto summary = [](const std::vector<TuningRecord>& v) {
    std::vector<Row> s;
    for (const TuningRecord& r : v) s.emplace_back(r.tokens, r.precision(), r.rows_per_expert_max);
    return s;
  };
  // An fp8 run at T 2 and 8, merged or not: the bf16 points and bounds stay; fp8's bounds come
  // from its own points (1/16, 1/4); sorted bf16 first.
  for (bool keep_other_tokens : {false, true})
    EXPECT_EQ(summary(tuning::merge_records(existing, {record(8, f), record(2, f)}, keep_other_tokens)),
              (std::vector<Row>{{1, Precision::bf16, 0.046875}, {2, Precision::bf16, 0.09375}, {4, Precision::bf16, 0.125},
                                {2, Precision::fp8, 0.15625}, {8, Precision::fp8, 0.25}}));
  // A bf16 run then replaces only bf16 points (without --merge: all of them).
  const std::vector<TuningRecord> both = tuning::merge_records(existing, {record(8, f), record(2, f)}, true);
  EXPECT_EQ(summary(tuning::merge_records(both, {record(16, b)}, false)),
            (std::vector<Row>{{16, Precision::bf16, 0.5}, {2, Precision::fp8, 0.15625}, {8, Precision::fp8, 0.25}}));
  // One T in both precisions is two points; one T twice in one precision is an error.
  EXPECT_NO_THROW(tuning::merge_records({}, {record(2, b), record(2, f)}, true));
  EXPECT_THROW(tuning::merge_records({}, {record(2, f), record(2, f)}, true), Error);
}

TEST(TuningPrecision, Fp8CandidatesAreFp8PairsWithGroupWideUpTiles) {
  const DeviceInfo d = test_gpu();
  for (const MoeShape& shape : {deepseek(1), MoeShape{1, 4096, 14336, 8, 2}, MoeShape{1, 2048, 768, 128, 8}}) {
    SCOPED_TRACE(::testing::Message() << "F=" << shape.inter);
    const std::vector<tuning::TileChoice> cands = tuning::tune_candidates(shape, d, Precision::fp8);
    ASSERT_FALSE(cands.empty());
    std::set<int> block_ms;
    for (const tuning::TileChoice& c : cands) {
      EXPECT_EQ(c.up.precision, Precision::fp8) << c.up.str();
      EXPECT_EQ(c.down.precision, Precision::fp8) << c.down.str();
      EXPECT_TRUE(tuning::up_config_ok(c.up)) << c.up.str();
      EXPECT_EQ(c.up.block_m, c.down.block_m);
      EXPECT_NO_THROW(plan_forward_with(shape, c.up, c.down, c.down_splits)) << c.up.str() << " " << c.down.str();
      block_ms.insert(c.up.block_m);
    }
    // Every compiled fp8 down config appears, with each block_m an fp8 up config has.
    for (const GemmConfig& down : compiled_gemm_configs(Precision::fp8))
      EXPECT_TRUE(std::any_of(cands.begin(), cands.end(), [&](const tuning::TileChoice& c) { return c.down == down; }))
          << down.str();
    std::set<int> up_block_ms;
    for (const GemmConfig& up : compiled_gemm_configs(Precision::fp8))
      if (tuning::up_config_ok(up)) up_block_ms.insert(up.block_m);
    EXPECT_EQ(block_ms, up_block_ms);
    // The heuristic's fp8 plan is one of them (tune times it first).
    for (int64_t T : {1, 16, 64, 512, 4096}) {
      MoeShape s = shape;
      s.tokens = T;
      const ForwardPlan h = plan_forward_heuristic(s, d, Precision::fp8);
      EXPECT_NE(std::find(cands.begin(), cands.end(), tuning::TileChoice{h.up, h.down, h.down_splits}), cands.end())
          << h.str();
    }
    // The bf16 candidates name no fp8 config.
    for (const tuning::TileChoice& c : tuning::tune_candidates(shape, d))
      EXPECT_TRUE(c.up.precision == Precision::bf16 && c.down.precision == Precision::bf16) << c.up.str();
  }
}

}  // namespace
}  // namespace moekit::testing
