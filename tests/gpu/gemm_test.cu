// gemm_test.cu — stages 3-4 (expert_up, expert_down) on the GPU against the CPU oracle, for every
// compiled tile config, over adversarial routings: relative-norm error on random data, exact
// results on small integers, padding rows never written, every assignment row written.
#include <cmath>

#include "gpu_util.hpp"

namespace moekit::test {
namespace {

// act is FP32-accumulated from bf16 operands, then rounded once to bf16: each element is within
// 2^-9 relative of the exact value, so the norm-wise error is at most 2^-9 (+ FP32 rounding).
constexpr double kActRelTol = 1.25 / 512;
// y_rows likewise carries act's rounding through the down GEMM plus its own rounding to bf16.
constexpr double kDownRelTol = 2.5 / 512;

struct GemmCase {
  int64_t T, H, F, E, k;
  RoutingKind kind;
};

class GemmTest : public GpuTest {
 protected:
  void run(const GemmCase& c, const GemmConfig& cfg, bool small_ints, int splits = 1) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " cfg " + cfg.str() + " splits " + std::to_string(splits) + " T=" + std::to_string(c.T) +
                 " H=" + std::to_string(c.H) + " F=" + std::to_string(c.F) + " E=" + std::to_string(c.E) +
                 (small_ints ? " ints" : " random"));
    std::mt19937_64 rng(seed);
    const MoeShape shape{c.T, c.H, c.F, c.E, c.k};
    const ForwardPlan plan = plan_forward_with(shape, cfg, cfg, splits);
    const auto ids = make_routing(c.kind, c.T, c.k, c.E, rng);
    run_with_ids(plan, ids, rng, small_ints);
  }

  void run_with_ids(const ForwardPlan& plan, const std::vector<int32_t>& ids, std::mt19937_64& rng, bool small_ints) {
    const MoeShape& s = plan.shape;
    const int64_t TK = s.tokens * s.topk;
    const GemmInputs in = make_gemm_inputs(s, rng, small_ints);
    const auto& x = in.x;
    const auto& w13 = in.w13;
    const auto& w2 = in.w2;
    const auto& weights = in.weights;

    const AlignedGemmInputs d(plan, in, ids, stream);
    const Workspace& ws = d.ws;
    expert_up(plan, Tensor(d.x.ptr, DType::bf16, {s.tokens, s.hidden}),
              Tensor(d.w13.ptr, DType::bf16, {s.experts, 2 * s.inter, s.hidden}), ws, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));

    const ref::Aligned al = ref::align(ids.data(), s.tokens, s.topk, s.experts, plan.block_m(), plan.max_blocks());
    std::vector<ref::bf16> act(static_cast<size_t>(plan.max_rows() * s.inter));
    MK_CUDA_CHECK(cudaMemcpy(act.data(), ws.act.data, act.size() * 2, cudaMemcpyDeviceToHost));

    // Up: every real row against the double-precision oracle; padding rows stay poisoned.
    std::vector<double> got, want;
    for (int32_t r = 0; r < al.num_rows_padded; ++r) {
      const int32_t a = al.sorted_ids[size_t(r)];
      const ref::bf16* row = act.data() + int64_t(r) * s.inter;
      if (a >= TK) {
        for (int64_t f = 0; f < s.inter; ++f) ASSERT_EQ(row[f], 0xffff) << "padding row " << r << " was written";
        continue;
      }
      const int32_t e = al.block_expert[size_t(r / plan.block_m())];
      const auto ref_act = ref::expert_act(x.data() + (a / s.topk) * s.hidden, w13.data() + e * 2 * s.inter * s.hidden, s.hidden, s.inter);
      for (int64_t f = 0; f < s.inter; ++f) got.push_back(ref::to_float(row[f]));
      want.insert(want.end(), ref_act.begin(), ref_act.end());
    }
    EXPECT_LE(ref::rel_norm_error(got, want), kActRelTol);

    // Down: from the GPU's act (small integers: act replaced by exact small-integer rows).
    if (small_ints) {
      for (int32_t r = 0; r < al.num_rows_padded; ++r)
        for (int64_t f = 0; f < s.inter; ++f)
          if (al.sorted_ids[size_t(r)] < TK) act[size_t(r * s.inter + f)] = ref::to_bf16(float(int(rng() % 9) - 4));
      MK_CUDA_CHECK(cudaMemcpy(ws.act.data, act.data(), act.size() * 2, cudaMemcpyHostToDevice));
    }
    expert_down(plan, Tensor(d.w2.ptr, DType::bf16, {s.experts, s.hidden, s.inter}),
                Tensor(d.weights.ptr, DType::f32, {s.tokens, s.topk}), ws, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    // Down output per assignment row: bf16 rows, or (split-K) the FP32 sum of the partials in
    // slice order — exact on small integers, so compared bitwise there too.
    const int64_t S = plan.down_splits;
    std::vector<float> partials(static_cast<size_t>(S > 1 ? S * TK * s.hidden : 0));
    std::vector<ref::bf16> y_rows(static_cast<size_t>(TK * s.hidden));
    if (S > 1)
      MK_CUDA_CHECK(cudaMemcpy(partials.data(), ws.y_partials.data, partials.size() * 4, cudaMemcpyDeviceToHost));
    else
      MK_CUDA_CHECK(cudaMemcpy(y_rows.data(), ws.y_rows.data, y_rows.size() * 2, cudaMemcpyDeviceToHost));
    auto down_value = [&](int64_t a, int64_t h) -> double {
      if (S == 1) return ref::to_float(y_rows[size_t(a * s.hidden + h)]);
      float v = 0.0f;
      for (int64_t sp = 0; sp < S; ++sp) v += partials[size_t((sp * TK + a) * s.hidden + h)];
      return v;
    };
    got.clear(), want.clear();
    for (int32_t r = 0; r < al.num_rows_padded; ++r) {
      const int32_t a = al.sorted_ids[size_t(r)];
      if (a >= TK) continue;
      const int32_t e = al.block_expert[size_t(r / plan.block_m())];
      const auto ref_y = ref::expert_down_row(act.data() + int64_t(r) * s.inter, w2.data() + e * s.hidden * s.inter,
                                              weights[size_t(a)], s.hidden, s.inter);
      for (int64_t h = 0; h < s.hidden; ++h) {
        const double g = down_value(a, h);
        const double exact = S == 1 ? ref::to_float(ref::to_bf16(float(ref_y[size_t(h)]))) : ref_y[size_t(h)];
        if (small_ints) ASSERT_EQ(g, exact) << "assignment " << a << " col " << h;
        got.push_back(g);
      }
      want.insert(want.end(), ref_y.begin(), ref_y.end());
    }
    EXPECT_EQ(int64_t(got.size()), TK * s.hidden) << "every assignment row must be written";
    EXPECT_LE(ref::rel_norm_error(got, want), kDownRelTol);
    if (S > 1) {  // and split-K's combine, bitwise against the oracle
      DeviceBuffer<ref::bf16> d_y(static_cast<size_t>(s.tokens * s.hidden));
      d_y.poison();
      combine_partials(ws.y_partials, s.topk, Tensor(d_y.ptr, DType::bf16, {s.tokens, s.hidden}), stream);
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
      ASSERT_EQ(d_y.download(), ref::combine_partials(partials.data(), S, s.tokens, s.topk, s.hidden));
    }
  }
};

TEST_F(GemmTest, RandomDataEveryConfig) {
  for (const GemmConfig& cfg : compiled_gemm_configs()) {
    run({33, 256, 192, 8, 2, RoutingKind::Uniform}, cfg, false);
    run({200, 128, 320, 16, 4, RoutingKind::Uniform}, cfg, false);
    run({5, 264, 136, 4, 2, RoutingKind::Uniform}, cfg, false);  // K and N not multiples of the tile
  }
}

TEST_F(GemmTest, SmallIntegersAreExact) {
  for (const GemmConfig& cfg : compiled_gemm_configs()) {
    run({64, 256, 192, 8, 2, RoutingKind::Uniform}, cfg, true);
    run({17, 192, 128, 4, 2, RoutingKind::AllOnOne}, cfg, true);
  }
}

TEST_F(GemmTest, AdversarialRoutings) {
  for (const GemmConfig& cfg : compiled_gemm_configs()) {
    run({300, 128, 128, 16, 2, RoutingKind::AllOnOne}, cfg, false);
    run({100, 128, 128, 32, 2, RoutingKind::EmptyExperts}, cfg, false);
    run({1, 128, 128, 32, 4, RoutingKind::SingleToken}, cfg, false);
    // Per-expert counts 0, 1, BLOCK_M, BLOCK_M+1.
    const int64_t bm = cfg.block_m;
    const std::vector<int64_t> counts = {0, 1, bm, bm + 1, 0, 1};
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    std::mt19937_64 rng(fresh_seed());
    run_with_ids(plan_forward_with({total, 128, 128, int64_t(counts.size()), 1}, cfg, cfg),
                 routing_with_counts(counts, 1), rng, true);
  }
}

// More work items than the persistent grid has CTAs (132-528 resident on an H200, by config):
// each CTA's K-stream runs across item and expert boundaries (the mma.sync kernel loads the next
// item's first K-tiles while it finishes the current one). Split-K: with 8 slices of 5 K-tiles (10
// for BK = 64) three trailing slices are empty, but a grid stride that is a multiple of 8 gives
// each CTA one slice only; with 5 slices of 4 K-tiles (8 for BK = 64) the last slice is empty and,
// as no resident-CTA count on an H200 is a multiple of 5, a CTA's stream meets empty slices between
// full ones (their partials are still written, as zeros) unless the even-wave rule picks such a
// stride.
TEST_F(GemmTest, ManyItemsPerCta) {
  for (const GemmConfig& cfg : compiled_gemm_configs()) {
    if (cfg.kernel != GemmKernel::mma_sync) continue;  // the wgmma kernel claims items from a counter
    run({1024, 128, 512, 8, 2, RoutingKind::Uniform}, cfg, false);
    run({256, 512, 640, 8, 2, RoutingKind::Uniform}, cfg, true, 8);
    run({256, 512, 512, 8, 2, RoutingKind::Uniform}, cfg, true, 5);
  }
}

// Split-K of the down GEMM: every slice count, K not a multiple of the slices or the tile, a slice
// left with no K-tiles (F=192, BK=128: 2 K-tiles over 8 slices), adversarial routings.
TEST_F(GemmTest, DownSplitK) {
  for (const GemmConfig& cfg : compiled_gemm_configs())
    for (int splits : {2, 3, 8}) {
      if (cfg.kernel != GemmKernel::mma_sync) continue;  // split-K is the decode kernel's
      run({33, 256, 192, 8, 2, RoutingKind::Uniform}, cfg, false, splits);
      run({64, 256, 1000, 8, 2, RoutingKind::Uniform}, cfg, true, splits);
      run({17, 192, 640, 4, 2, RoutingKind::AllOnOne}, cfg, true, splits);
      run({1, 128, 512, 32, 4, RoutingKind::SingleToken}, cfg, false, splits);
    }
}

}  // namespace
}  // namespace moekit::test
