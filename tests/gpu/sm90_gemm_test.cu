// sm90_gemm_test.cu — the Hopper wgmma expert GEMM (detail::launch_sm90_expert_gemm) against the
// CPU oracle, as gemm_test.cu checks the mma.sync kernel: relative-norm error on random data,
// exact results on small integers, padding rows never written, every assignment row written,
// adversarial routings (counts 0, 1, BLOCK_M, BLOCK_M+1; K and N not multiples of the tile),
// many tiles per CTA, and bitwise determinism across runs — for every compiled block_n; and the
// down GEMM split along K (FP32 partial rows, a K-slice past K included).
//
// Built for one device run that must explain any failure by itself: each mismatch report names
// the mode, the sorted row / assignment, the column, expected and got, and where in the same row
// (or column) the value it got would have been right — a layout error shows as a shift.
//
// Run: ./build/tests/moekit_gpu_tests --gtest_filter='Sm90Gemm*'
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gemm/launch.hpp"
#include "gemm/params.hpp"
#include "gpu_util.hpp"

namespace moekit::test {
namespace {

using kernels::gemm::Mode;
using kernels::gemm::Params;

// The bounds of gemm_test.cu. act is FP32-accumulated from bf16 operands, then rounded once to
// bf16: each element within 2^-9 relative of the exact value, so the norm-wise error is at most
// 2^-9 (+ FP32 rounding). y_rows carries act's rounding through the down GEMM plus its own.
constexpr double kActRelTol = 1.25 / 512;
constexpr double kDownRelTol = 2.5 / 512;
// Element-wise screen for the diagnostics (not the contract): a wrong element of a layout or
// pipeline bug is off by O(1) of the row's scale; rounding is 2^-9 of the element.
constexpr double kElemRelTol = 1.0 / 64;

// Every compiled block_n of the wgmma kernel (the planner's config list).
std::vector<int> wgmma_block_ns() {
  std::vector<int> ns;
  for (const GemmConfig& c : compiled_gemm_configs())
    if (c.kernel == GemmKernel::wgmma) ns.push_back(c.block_n);
  return ns;
}

// The mma.sync config whose block_m (128) the sm90 kernel shares: it gives the plan and align.
const GemmConfig kPlanConfig{128, 128, 64, 2, 4, 3};

struct Sm90Case {
  int64_t T, H, F, E, k;
  RoutingKind kind;
};

// Element-wise screen of one output matrix, collecting the first mismatches with hints: the
// column of the same row, or the sorted row of the same column, whose expected value equals what
// was got (a layout error shows as a shift of columns or rows).
struct Mismatches {
  std::string what;
  const std::vector<std::vector<double>>* want_rows = nullptr;  // by sorted row
  int64_t count = 0;
  std::string report;
  void add(int32_t sorted_row, int64_t label_row, int64_t col, double want, double got) {
    if (count++ >= 8) return;
    const std::vector<double>& row = (*want_rows)[size_t(sorted_row)];
    char buf[200];
    std::snprintf(buf, sizeof buf, "  %s %lld (sorted row %d) col %lld: want %.6g got %.6g", what.c_str(),
                  (long long)label_row, sorted_row, (long long)col, want, got);
    report += buf;
    const double tol = std::fabs(got) * kElemRelTol + 1e-6;
    for (size_t c = 0; c < row.size(); ++c)
      if (int64_t(c) != col && std::fabs(row[c] - got) <= tol) {
        report += " [= want at col " + std::to_string(c) + " of this row]";
        break;
      }
    for (size_t r = 0; r < want_rows->size(); ++r) {
      const auto& other = (*want_rows)[r];
      if (int32_t(r) != sorted_row && !other.empty() && std::fabs(other[size_t(col)] - got) <= tol) {
        report += " [= want at sorted row " + std::to_string(r) + " of this col]";
        break;
      }
    }
    report += "\n";
  }
};

// The oracle for every sorted row at once, on all cores: row r -> f(r) ([] for padding rows).
std::vector<std::vector<double>> oracle_rows(const ref::Aligned& al, int64_t TK,
                                             const std::function<std::vector<double>(int32_t r, int32_t a)>& f) {
  std::vector<std::vector<double>> rows(size_t(al.num_rows_padded));
  ref::parallel_for(al.num_rows_padded, [&](int64_t r) {
    const int32_t a = al.sorted_ids[size_t(r)];
    if (a < TK) rows[size_t(r)] = f(int32_t(r), a);
  });
  return rows;
}

double rms_of(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum / double(std::max<size_t>(v.size(), 1)));
}

class Sm90GemmTest : public GpuTest {
 protected:
  struct Outputs {
    std::vector<ref::bf16> act, y_rows;
    std::vector<float> y_partials;  // split-K: [S, T*k, H]
  };

  Params routing_params(const ForwardPlan& plan, const Workspace& ws) const {
    Params p{};
    p.sorted_ids = ws.sorted_ids.as<const int32_t>();
    p.block_expert = ws.block_expert.as<const int32_t>();
    p.num_rows_padded = ws.num_rows_padded.as<const int32_t>();
    p.tile_counter = ws.gemm_counter.as<int32_t>();
    p.num_assign = plan.shape.tokens * plan.shape.topk;
    p.topk = int(plan.shape.topk);
    return p;
  }

  // splits > 1: the down GEMM split along K (the plan, from the mma.sync config that shares the
  // block_m, sizes y_partials).
  void run(const Sm90Case& c, int block_n, bool small_ints, int splits = 1) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " block_n " + std::to_string(block_n) + " T=" + std::to_string(c.T) +
                 " H=" + std::to_string(c.H) + " F=" + std::to_string(c.F) + " E=" + std::to_string(c.E) +
                 " k=" + std::to_string(c.k) + (small_ints ? " ints" : " random") + " splits " + std::to_string(splits));
    std::mt19937_64 rng(seed);
    const ForwardPlan plan = plan_forward_with({c.T, c.H, c.F, c.E, c.k}, kPlanConfig, kPlanConfig, splits);
    run_with_ids(plan, make_routing(c.kind, c.T, c.k, c.E, rng), rng, block_n, small_ints);
  }

  // Up then Down on the device; checks both against the oracle. Returns the outputs (determinism).
  Outputs run_with_ids(const ForwardPlan& plan, const std::vector<int32_t>& ids, std::mt19937_64& rng, int block_n,
                       bool small_ints) {
    const MoeShape& s = plan.shape;
    const int64_t TK = s.tokens * s.topk;
    const GemmInputs in = make_gemm_inputs(s, rng, small_ints);
    const auto& x = in.x;
    const auto& w13 = in.w13;
    const auto& w2 = in.w2;
    const auto& weights = in.weights;

    const AlignedGemmInputs d(plan, in, ids, stream);
    const Workspace& ws = d.ws;

    Params up = routing_params(plan, ws);
    up.a = reinterpret_cast<const __nv_bfloat16*>(d.x.ptr);
    up.b = reinterpret_cast<const __nv_bfloat16*>(d.w13.ptr);
    up.out = ws.act.as<__nv_bfloat16>();
    up.k_dim = s.hidden;
    up.n_dim = s.inter;
    up.b_expert_stride = 2 * s.inter * s.hidden;
    detail::launch_sm90_expert_gemm(Mode::Up, up, plan, stream, block_n);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));

    const ref::Aligned al = ref::align(ids.data(), s.tokens, s.topk, s.experts, plan.block_m(), plan.max_blocks());
    Outputs out;
    out.act.resize(static_cast<size_t>(plan.max_rows() * s.inter));
    MK_CUDA_CHECK(cudaMemcpy(out.act.data(), ws.act.data, out.act.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<ref::bf16>& act = out.act;

    // ---- Up: every real row against the double-precision oracle; padding rows stay poisoned.
    const auto ref_acts = oracle_rows(al, TK, [&](int32_t r, int32_t a) {
      const int32_t e = al.block_expert[size_t(r / plan.block_m())];
      return ref::expert_act(x.data() + (a / s.topk) * s.hidden, w13.data() + e * 2 * s.inter * s.hidden, s.hidden,
                             s.inter);
    });
    std::vector<double> got, want;
    Mismatches up_bad{"act row", &ref_acts};
    for (int32_t r = 0; r < al.num_rows_padded; ++r) {
      const int32_t a = al.sorted_ids[size_t(r)];
      const ref::bf16* row = act.data() + int64_t(r) * s.inter;
      if (a >= TK) {
        for (int64_t f = 0; f < s.inter; ++f)
          if (row[f] != 0xffff) {
            ADD_FAILURE() << "Up: padding row " << r << " col " << f << " was written (" << ref::to_float(row[f]) << ")";
            return out;
          }
        continue;
      }
      const std::vector<double>& ref_act = ref_acts[size_t(r)];
      const double rms = rms_of(ref_act);
      for (int64_t f = 0; f < s.inter; ++f) {
        const double g = ref::to_float(row[f]);
        if (!(std::fabs(g - ref_act[size_t(f)]) <= kElemRelTol * (std::fabs(ref_act[size_t(f)]) + rms)))
          up_bad.add(r, r, f, ref_act[size_t(f)], g);
        got.push_back(g);
      }
      want.insert(want.end(), ref_act.begin(), ref_act.end());
    }
    EXPECT_EQ(up_bad.count, 0) << "Up: " << up_bad.count << " elements off by more than 1/64 of the row scale; first:\n"
                               << up_bad.report;
    EXPECT_LE(ref::rel_norm_error(got, want), kActRelTol) << "Up";

    // ---- Down: from the GPU's act (small integers: act replaced by exact small-integer rows).
    if (small_ints) {
      for (int32_t r = 0; r < al.num_rows_padded; ++r)
        for (int64_t f = 0; f < s.inter; ++f)
          if (al.sorted_ids[size_t(r)] < TK) act[size_t(r * s.inter + f)] = ref::to_bf16(float(int(rng() % 9) - 4));
      MK_CUDA_CHECK(cudaMemcpy(ws.act.data, act.data(), act.size() * 2, cudaMemcpyHostToDevice));
    }
    Params down = routing_params(plan, ws);
    down.a = ws.act.as<const __nv_bfloat16>();
    down.b = reinterpret_cast<const __nv_bfloat16*>(d.w2.ptr);
    down.out = ws.y_rows.as<__nv_bfloat16>();
    down.topk_weights = d.weights.ptr;
    down.k_dim = s.inter;
    down.n_dim = s.hidden;
    down.b_expert_stride = s.hidden * s.inter;
    const int S = plan.down_splits;
    if (S > 1) {  // every partial poisoned (NaN): each (slice, assignment, column) must be written
      down.k_splits = S;
      down.partials = ws.y_partials.as<float>();
      MK_CUDA_CHECK(cudaMemset(ws.y_partials.data, 0xff, size_t(S * TK * s.hidden) * 4));
    }
    detail::launch_sm90_expert_gemm(Mode::Down, down, plan, stream, block_n);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    // y_rows, or with split-K the sum of each assignment's partial rows (in double: what
    // combine_partials sums in FP32); a partial never written stays NaN and fails the checks.
    std::function<double(int32_t a, int64_t h)> y_at;
    if (S > 1) {
      out.y_partials.resize(static_cast<size_t>(S * TK * s.hidden));
      MK_CUDA_CHECK(cudaMemcpy(out.y_partials.data(), ws.y_partials.data, out.y_partials.size() * 4,
                               cudaMemcpyDeviceToHost));
      y_at = [&](int32_t a, int64_t h) {
        double sum = 0;
        for (int sp = 0; sp < S; ++sp) sum += out.y_partials[size_t((sp * TK + a) * s.hidden + h)];
        return sum;
      };
      // A K-slice past K (S > K-tiles) multiplies nothing: its partials are zeros, not stale sums.
      const int64_t k_tiles = (s.inter + 63) / 64, per_split = (k_tiles + S - 1) / S;
      for (int sp = int(k_tiles / per_split + (k_tiles % per_split != 0)); sp < S; ++sp)
        for (int64_t i = 0; i < TK * s.hidden; ++i)
          if (out.y_partials[size_t(sp * TK * s.hidden + i)] != 0.0f) {
            ADD_FAILURE() << "Down: slice " << sp << " is past K (" << k_tiles << " K-tiles) but element " << i
                          << " of its partials is " << out.y_partials[size_t(sp * TK * s.hidden + i)];
            return out;
          }
    } else {
      out.y_rows.resize(static_cast<size_t>(TK * s.hidden));
      MK_CUDA_CHECK(cudaMemcpy(out.y_rows.data(), ws.y_rows.data, out.y_rows.size() * 2, cudaMemcpyDeviceToHost));
      y_at = [&](int32_t a, int64_t h) { return double(ref::to_float(out.y_rows[size_t(a * s.hidden + h)])); };
    }
    // Small integers are exact through bf16 y_rows; the partials' sum rounds the weights' products
    // per slice, so it is held to the random data's bound.
    const bool exact = small_ints && S == 1;

    const auto ref_ys = oracle_rows(al, TK, [&](int32_t r, int32_t a) {
      const int32_t e = al.block_expert[size_t(r / plan.block_m())];
      return ref::expert_down_row(act.data() + int64_t(r) * s.inter, w2.data() + e * s.hidden * s.inter,
                                  weights[size_t(a)], s.hidden, s.inter);
    });
    got.clear(), want.clear();
    Mismatches down_bad{"y_rows assignment", &ref_ys};
    int64_t rows_checked = 0;
    for (int32_t r = 0; r < al.num_rows_padded; ++r) {
      const int32_t a = al.sorted_ids[size_t(r)];
      if (a >= TK) continue;
      ++rows_checked;
      const std::vector<double>& ref_y = ref_ys[size_t(r)];
      const double rms = rms_of(ref_y);
      for (int64_t h = 0; h < s.hidden; ++h) {
        const double g = y_at(a, h);
        const bool bad = exact ? out.y_rows[size_t(a * s.hidden + h)] != ref::to_bf16(float(ref_y[size_t(h)]))
                               : !(std::fabs(g - ref_y[size_t(h)]) <= kElemRelTol * (std::fabs(ref_y[size_t(h)]) + rms));
        if (bad) down_bad.add(r, a, h, ref_y[size_t(h)], g);
        got.push_back(g);
      }
      want.insert(want.end(), ref_y.begin(), ref_y.end());
    }
    EXPECT_EQ(rows_checked, TK) << "every assignment must have one sorted row";
    EXPECT_EQ(down_bad.count, 0) << "Down: " << down_bad.count << (exact ? " inexact" : " far-off")
                                 << " elements; first:\n" << down_bad.report;
    EXPECT_LE(ref::rel_norm_error(got, want), kDownRelTol) << "Down";
    // Every assignment row written: a poisoned (NaN) element would have failed above, but say so.
    int64_t poisoned = 0;
    for (ref::bf16 v : out.y_rows) poisoned += v == 0xffff;
    for (float v : out.y_partials) poisoned += std::isnan(v);
    EXPECT_EQ(poisoned, 0) << (S > 1 ? "y_partials" : "y_rows") << " elements never written";
    return out;
  }
};

TEST_F(Sm90GemmTest, RandomData) {
  for (int bn : wgmma_block_ns()) {
    run({33, 256, 192, 8, 2, RoutingKind::Uniform}, bn, false);
    run({200, 128, 320, 16, 4, RoutingKind::Uniform}, bn, false);
    run({5, 264, 136, 4, 2, RoutingKind::Uniform}, bn, false);  // K and N not multiples of the tile
    run({300, 1000, 520, 4, 2, RoutingKind::Uniform}, bn, false);  // several K tiles, ragged K and N
  }
}

TEST_F(Sm90GemmTest, SmallIntegersAreExact) {
  for (int bn : wgmma_block_ns()) {
    run({64, 256, 192, 8, 2, RoutingKind::Uniform}, bn, true);
    run({17, 192, 128, 4, 2, RoutingKind::AllOnOne}, bn, true);
    run({150, 520, 264, 3, 2, RoutingKind::Uniform}, bn, true);
  }
}

TEST_F(Sm90GemmTest, AdversarialRoutings) {
  for (int bn : wgmma_block_ns()) {
    run({300, 128, 128, 16, 2, RoutingKind::AllOnOne}, bn, false);
    run({100, 128, 128, 32, 2, RoutingKind::EmptyExperts}, bn, false);
    run({1, 128, 128, 32, 4, RoutingKind::SingleToken}, bn, false);
    // Per-expert counts 0, 1, BLOCK_M, BLOCK_M+1 (block_m = 128), K and N ragged.
    const int64_t bm = kPlanConfig.block_m;
    const std::vector<int64_t> counts = {0, 1, bm, bm + 1, 0, 1, 2 * bm - 1};
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    std::mt19937_64 rng(fresh_seed());
    SCOPED_TRACE("counts 0,1,128,129,0,1,255 block_n " + std::to_string(bn));
    run_with_ids(plan_forward_with({total, 136, 200, int64_t(counts.size()), 1}, kPlanConfig, kPlanConfig),
                 routing_with_counts(counts, 1), rng, bn, true);
  }
}

// More work items than SMs: every CTA walks several tiles (its first, then claimed ones), the
// stage and item rings wrap many times, and the producer runs ahead into the next tile while the
// consumers store the previous one.
TEST_F(Sm90GemmTest, ManyTilesPerCta) {
  for (int bn : wgmma_block_ns()) {
    // 6144 rows = 48+ blocks; Up 384/(bn/2) and Down 768/bn column tiles: 144+ items per GEMM.
    run({3072, 768, 384, 4, 2, RoutingKind::Uniform}, bn, true);
    // 24576 rows = 192+ blocks, short K: 384-768 items (Up), 3-6 per CTA, claimed in quick succession.
    run({12288, 256, 256, 2, 2, RoutingKind::Uniform}, bn, true);
  }
}

TEST_F(Sm90GemmTest, BitwiseDeterministic) {
  for (int bn : wgmma_block_ns()) {
    const ForwardPlan plan = plan_forward_with({700, 384, 320, 8, 2}, kPlanConfig, kPlanConfig);
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " block_n " + std::to_string(bn));
    std::mt19937_64 rng_ids(seed);
    const auto ids = make_routing(RoutingKind::Uniform, 700, 2, 8, rng_ids);
    std::mt19937_64 rng1(seed + 1), rng2(seed + 1);
    const Outputs a = run_with_ids(plan, ids, rng1, bn, false);
    const Outputs b = run_with_ids(plan, ids, rng2, bn, false);
    ASSERT_EQ(a.act.size(), b.act.size());
    for (size_t i = 0; i < a.act.size(); ++i) ASSERT_EQ(a.act[i], b.act[i]) << "act element " << i << " differs between runs";
    for (size_t i = 0; i < a.y_rows.size(); ++i)
      ASSERT_EQ(a.y_rows[i], b.y_rows[i]) << "y_rows element " << i << " differs between runs";
  }
}

// The down GEMM split along K (bf16, 2 and 4 slices): random data with a ragged K whose last
// slice is past its end (F = 520: 9 K-tiles, 4 slices of 3), small integers on one expert with a
// slice past K (F = 136: 3 K-tiles), empty experts, one token, per-expert counts 0, 1, BLOCK_M,
// BLOCK_M+1, many tiles per CTA, and the partials bitwise the same run to run.
TEST_F(Sm90GemmTest, SplitKDown) {
  for (int bn : wgmma_block_ns())
    for (int S : {2, 4}) {
      run({300, 1000, 520, 4, 2, RoutingKind::Uniform}, bn, false, S);
      run({17, 192, 136, 4, 2, RoutingKind::AllOnOne}, bn, true, S);
      run({100, 128, 256, 32, 2, RoutingKind::EmptyExperts}, bn, false, S);
      run({1, 128, 264, 32, 4, RoutingKind::SingleToken}, bn, false, S);
      run({3072, 768, 384, 4, 2, RoutingKind::Uniform}, bn, true, S);
      const int64_t bm = kPlanConfig.block_m;
      const std::vector<int64_t> counts = {0, 1, bm, bm + 1, 0, 1, 2 * bm - 1};
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE("counts 0,1,128,129,0,1,255 block_n " + std::to_string(bn) + " splits " + std::to_string(S) +
                   " seed " + std::to_string(seed));
      std::mt19937_64 rng(seed);
      const ForwardPlan plan = plan_forward_with({total, 136, 328, int64_t(counts.size()), 1}, kPlanConfig, kPlanConfig, S);
      const auto ids = routing_with_counts(counts, 1);
      std::mt19937_64 rng1(seed + 1), rng2(seed + 1);
      const Outputs a = run_with_ids(plan, ids, rng1, bn, false);
      const Outputs b = run_with_ids(plan, ids, rng2, bn, false);
      ASSERT_EQ(a.y_partials.size(), size_t(S * total * 136));
      ASSERT_EQ(std::memcmp(a.y_partials.data(), b.y_partials.data(), a.y_partials.size() * 4), 0)
          << "y_partials differ between runs";
    }
}

// The launcher is unchecked: what it cannot run is refused at the public boundary, before any
// launch (tests/cpu/plan_test.cpp, Sm90Preconditions).

}  // namespace
}  // namespace moekit::test
