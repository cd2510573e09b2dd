// backward_test.cu — moe_backward on the GPU against the oracle (ref::moe_backward,
// ref::router_backward), within the bounds derived in backward_util.hpp: small model-scaled layers
// and partial tiles, both SavedActivations modes, the decode (16-row) and prefill (64-row) kernels
// over layouts of block_m 16, 64 and 128, adversarial routings (every token on two experts, empty
// experts, counts 0, 1, block_m, block_m + 1, one token, ids outside [0, E)), split-K of dx, dW and
// d_w_gate, each RouterGrad mode, f32 dW accumulated into main_grad, T = 0; poisoned outputs and
// workspace; bitwise determinism run to run and through a CUDA graph. The prefill (wgmma) kernels
// and the training forward that keeps h: backward_wgmma_test.cu.
//   build/tests/moekit_gpu_tests --gtest_filter='BackwardTest.*'
#include <string>

#include "backward_run.hpp"

namespace moekit::test {
namespace {

TEST_F(BackwardTest, MatchesTheOracle) {
  // Each case with the planner's kernels (h, D and dx on wgmma wherever block_m is 128, dW at
  // every block_m), then with every ragged GEMM on the mma.sync tile: the planner's rows, then
  // 128 x 256.
  for (const PlanOverride over : kPlanVariants)
  for (SavedActivations saved : {SavedActivations::recompute, SavedActivations::h}) {
    over_ = over;
    // 16-row layouts (the planner's at 8 rows an expert) and the 64-row kernels over 64- and
    // 128-row layouts of the same layer.
    for (int block_m : {0, 64, 128}) check({33, 256, 128, 8, 2}, block_m, options(saved));
    // Partial tiles everywhere: H = 200 and F = 72 (not multiples of 64), E = 6.
    for (int block_m : {16, 0, 128}) check({45, 200, 72, 6, 2}, block_m, options(saved));
    // The planner's prefill layout (block_m 128, wgmma forward configs).
    check({300, 256, 128, 8, 2}, 0, options(saved));
    // The 128 x 256 tile with every ring slot reused (K-tiles: 9 of H, 11 of 2F, ~6 of an
    // expert's ~375 rows, through 4 stages), several column tiles and partial ones (H = 576,
    // F = 328, 2F = 656) and a partial last ⟨D, act⟩ group (328 = 5·64 + 8).
    check({1500, 576, 328, 8, 2}, 128, options(saved));
  }
}

TEST_F(BackwardTest, AdversarialRoutings) {
  // The planner's kernels (wgmma wherever block_m is 128), the mma.sync tile, the 128 x 256 tile.
  for (const PlanOverride over : kPlanVariants) {
    over_ = over;
    adversarial_routings();
  }
}

}  // namespace

// A member of the shared fixture (backward_run.hpp): outside this file's unnamed namespace.
void BackwardTest::adversarial_routings() {
  std::mt19937_64 rng(fresh_seed());
  const MoeShape s{40, 256, 128, 8, 2};
  // Every token on experts 7 and 0, the other six empty (their dW exactly 0); a quarter of the
  // experts used.
  for (int block_m : {16, 128}) {
    check(s, block_m, options(), {}, make_routing(RoutingKind::AllOnOne, s.tokens, s.topk, s.experts, rng));
    check(s, block_m, options(), {}, make_routing(RoutingKind::EmptyExperts, s.tokens, s.topk, s.experts, rng));
  }
  // Counts 0, 1, block_m and block_m + 1 (and their neighbours) in one layout of each block_m.
  for (int block_m : {16, 32, 64, 128}) {
    const int64_t b = block_m;
    const std::vector<int64_t> counts{0, 1, b, b + 1, 0, 2, b - 1, 5};
    int64_t sum = 0;
    for (int64_t n : counts) sum += n;
    const MoeShape cs{sum / 2, 256, 128, 8, 2};
    check(cs, block_m, options(SavedActivations::h), {}, routing_with_counts(counts, 2));
  }
  // One token: k = 2 of 8 experts, and k = 8 (every expert one row).
  check({1, 256, 128, 8, 2}, 0, options());
  check({1, 256, 128, 8, 8}, 0, options(SavedActivations::h));
}

namespace {

// Ids outside [0, E) have no row (align skips them and reports it in ws.status): no gradient, and
// dx of their tokens sums their other slots.
TEST_F(BackwardTest, OutOfRangeIdsHaveNoGradient) {
  std::mt19937_64 rng(fresh_seed());
  const MoeShape s{20, 256, 128, 8, 2};
  std::vector<int32_t> ids = make_routing(RoutingKind::Uniform, s.tokens, s.topk, s.experts, rng);
  ids[3] = int32_t(s.experts);
  ids[10] = -1;
  check(s, 0, options(), {}, ids);
}

TEST_F(BackwardTest, RouterGradients) {
  const MoeShape s{40, 256, 128, 16, 4};
  RouterOptions plain;  // softmax without renormalisation: unchosen experts get gradient too
  for (const RouterOptions& opt : {plain, softmax_renorm(), sigmoid_grouped()}) {
    check(s, 0, options(SavedActivations::recompute, RouterGrad::logits), opt);
    check(s, 0, options(SavedActivations::h, RouterGrad::gate), opt, {}, DType::bf16, /*aux=*/true);
    check(s, 0, options(SavedActivations::recompute, RouterGrad::gate), opt, {}, DType::f32);
  }
  // E = 6 (d_logits padded to 8 columns), d_topk_weights left to the workspace, no dx.
  BackwardOptions no_dx = options(SavedActivations::recompute, RouterGrad::gate);
  no_dx.input_grad = false;
  RouterOptions sigmoid_scaled;
  sigmoid_scaled.scoring = Scoring::sigmoid;
  sigmoid_scaled.routed_scaling_factor = 2.5f;
  check({33, 256, 128, 6, 2}, 0, options(SavedActivations::recompute, RouterGrad::gate), softmax_renorm(), {},
        DType::f32, true, /*pass_d_topk=*/false);
  check({33, 256, 128, 6, 2}, 0, no_dx, sigmoid_scaled, {}, DType::bf16, false, false);
  // E = 72 > 64: d_w_gate's 128 x 128 tile, d_logits padded to 72 columns inside it; k = 16, the
  // most slots dx_router_combine stages a token (its largest shared-memory use).
  check({48, 256, 128, 72, 16}, 0, options(SavedActivations::h, RouterGrad::gate), softmax_renorm());
  check({48, 256, 128, 72, 16}, 0, options(SavedActivations::recompute, RouterGrad::gate), sigmoid_grouped(), {},
        DType::f32);
  // router_grad's lane width follows E (1, 2, 4, 8 or 16 experts a lane): E = 200 and 300 take the
  // 8- and 16-wide instances, which no smaller E reaches.
  for (int64_t E : {200, 300}) {
    check({24, 256, 128, E, 8}, 0, options(SavedActivations::recompute, RouterGrad::logits), softmax_renorm());
    check({24, 256, 128, E, 8}, 0, options(SavedActivations::recompute, RouterGrad::logits), sigmoid_grouped());
  }
}

TEST_F(BackwardTest, F32WeightGradsAccumulated) {
  for (bool accumulate : {false, true}) {
    BackwardOptions o = options();
    o.weight_grad_dtype = DType::f32;
    o.accumulate_weight_grads = accumulate;
    check({33, 256, 128, 8, 2}, 0, o);
    check({1024, 256, 128, 4, 2}, 0, o);  // dw_splits 2: the split sum accumulates
    check({300, 256, 128, 8, 2}, 0, o);   // block_m 128, dw_splits 1: the wgmma kernel's own f32 stores
    // Experts with no rows (6 of 8, 2 of 4): accumulated, their main_grad (a -0 in every
    // five) stays bitwise as it was — the mma.sync kernel, the wgmma kernel, and the split sum.
    std::mt19937_64 rng(fresh_seed());
    for (const MoeShape s : {MoeShape{40, 256, 128, 8, 2}, MoeShape{1024, 256, 128, 4, 2}})
      for (int block_m : {0, 16, 128})  // 0: the planner's (dw_splits 2 at T = 1024, as above)
        check(s, block_m, o, {}, make_routing(RoutingKind::EmptyExperts, s.tokens, s.topk, s.experts, rng));
  }
}

TEST_F(BackwardTest, OptionSubsets) {
  const MoeShape s{33, 256, 128, 8, 2};
  for (int grads = 0; grads < 3; ++grads) {  // dx only, dW only, d_topk_weights only
    BackwardOptions o = options(SavedActivations::h);
    o.input_grad = grads == 0;
    o.weight_grads = grads == 1;
    check(s, 0, o);
  }
}

// Split-K of dx (decode: few tiles, K = 2F deep), of dW (few experts, many rows each) and of
// d_w_gate (K = T): each checked against the oracle, then bitwise equal over three more runs.
TEST_F(BackwardTest, SplitKAndBitwiseDeterminism) {
  struct Shape {
    MoeShape s;
    RouterGrad router;
    int block_m;  // the forward's layout (0: the planner's)
  };
  // Split-K of dx (decode; with RouterGrad::gate too, whose dx kernel then sums the partials
  // unstaged), of dW and d_w_gate with the 64-row tile (512 rows an expert) and with the 128 x 256
  // one (2048). The layouts those tiles need are given, not left to the planner, whose cost model
  // plans 32-row blocks at T = 1024 on this shape.
  for (const Shape& sh : {Shape{{4, 256, 1024, 8, 2}, RouterGrad::logits, 0},
                          Shape{{4, 256, 1024, 8, 2}, RouterGrad::gate, 0},
                          Shape{{1024, 256, 128, 4, 2}, RouterGrad::gate, 64},
                          Shape{{4096, 256, 128, 4, 2}, RouterGrad::gate, 128}}) {
    const uint64_t seed = fresh_seed();
    const BackwardOptions o = options(SavedActivations::recompute, sh.router);
    SCOPED_TRACE(name_of(sh.s, sh.block_m, o, seed));
    std::mt19937_64 rng(seed);
    BackwardRun run(forward_plan(sh.s, sh.block_m), o, make_case(sh.s, rng, sh.router, softmax_renorm()), stream, rng);
    if (sh.s.tokens == 4) {
      EXPECT_GT(run.plan.dx_splits, 1) << run.plan.str();
    } else {
      EXPECT_GT(run.plan.dw_splits, 1) << run.plan.str();
      EXPECT_GT(run.plan.gate_splits, 1) << run.plan.str();
      EXPECT_EQ(run.plan.tile_rows, sh.s.tokens == 4096 ? 128 : 64) << run.plan.str();
    }
    const Outputs first = run.run(stream);
    check_outputs(run, first);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(run.run(stream) == first) << "run " << i << " differs";
  }
}

// The whole backward captured once (global mode: a sync or allocation inside fails) and replayed
// on new dy in the same buffers: each replay matches the oracle and an eager run, bitwise.
TEST_F(BackwardTest, CudaGraphCaptureAndReplay) {
  struct Variant {
    int64_t T;
    PlanOverride over;
  };
  // The 16-row kernels; at T = 300 on a layout of block_m 128 (given: the planner's cost model
  // plans 16-row blocks there) the planner's h, D and dx on wgmma, then the 64-row mma.sync
  // kernels and the 128 x 256 tile.
  for (const Variant v : {Variant{16, {}}, Variant{300, {}}, Variant{300, PlanOverride::mma_sync()},
                          Variant{300, PlanOverride::mma_sync(128)}}) {
    const int64_t T = v.T;
    const int block_m = T == 300 ? 128 : 0;
    const uint64_t seed = fresh_seed();
    const MoeShape s{T, 256, 128, 8, 2};
    BackwardOptions o = options(SavedActivations::recompute, RouterGrad::gate);
    SCOPED_TRACE(name_of(s, block_m, o, seed));
    std::mt19937_64 rng(seed);
    BackwardRun run(forward_plan(s, block_m), o, make_case(s, rng, RouterGrad::gate, softmax_renorm()), stream, rng,
                    true, v.over);
    SCOPED_TRACE(run.plan.str());
    if (v.T == 300 && v.over.planner)
      ASSERT_TRUE(run.plan.h_wgmma && run.plan.d_wgmma && run.plan.dx_wgmma) << "T = 300 has block_m 128";
    run.run(stream);  // one eager call first, as for every captured moekit entry
    const CapturedGraph graph(stream, [&] { run.enqueue(stream); });
    for (int replay = 0; replay < 2; ++replay) {
      run.c.dy = random_bf16(run.c.dy.size(), rng);
      run.dy.upload(run.c.dy);
      run.poison();
      graph.launch(stream);
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
      const Outputs replayed = run.download();
      check_outputs(run, replayed);
      ASSERT_TRUE(run.run(stream) == replayed) << "replay " << replay << " differs from an eager run";
    }
  }
}

// T = 0: nothing to route; the weights' gradients are exact zeros, or untouched when accumulated.
TEST_F(BackwardTest, EmptyBatch) {
  std::mt19937_64 rng(fresh_seed());
  const MoeShape s{0, 256, 128, 8, 2};
  for (bool accumulate : {false, true}) {
    BackwardOptions o = options(SavedActivations::recompute, RouterGrad::gate);
    o.weight_grad_dtype = DType::f32;
    o.accumulate_weight_grads = accumulate;
    BackwardRun run(forward_plan(s), o, make_case(s, rng, RouterGrad::gate), stream, rng);
    const Outputs out = run.run(stream);
    auto zeros = [](const std::vector<unsigned char>& v) {
      return std::all_of(v.begin(), v.end(), [](unsigned char b) { return b == 0; });
    };
    EXPECT_TRUE(accumulate ? out.dw13 == run.dw_init13 && out.dw2 == run.dw_init2 : zeros(out.dw13) && zeros(out.dw2));
    EXPECT_TRUE(zeros(out.d_w_gate));
  }
}

// 64-bit offsets: T·H = 2.46e9 elements of x, dy and dx, and T·k·H of dx_rows, past 2^31. dy (and x)
// are zero outside a few sampled tokens, among them rows past 2^31 / H = 524,288, so every other
// token's gradients are exactly zero and the whole dW is the sampled tokens' alone: the oracle
// runs on those tokens only (ref::moe_backward's token list) and every other dx row and
// d_topk_weights entry must be exactly 0 (a write that lands on a wrong row is caught there).
// The planner's tile (128 x 256 at 150,000 rows an expert), the 64 x 64 one, and D and dx on wgmma.
TEST_F(BackwardTest, SixtyFourBitOffsets) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const MoeShape s{600000, 4096, 128, 8, 2};
  const int64_t T = s.tokens, H = s.hidden, F = s.inter, E = s.experts, k = s.topk;
  ASSERT_GT(T * H, int64_t(1) << 31);
  const std::vector<int64_t> sampled{0, 7, 262144, 524287, 524288, 524289, T - 2, T - 1};
  Case c;
  c.s = s;
  c.ids = make_routing(RoutingKind::Uniform, T, k, E, rng);
  c.weights.resize(size_t(T * k));
  for (float& w : c.weights) w = float(rng() % 1000 + 1) / 1000.0f;
  c.w13 = random_bf16(size_t(E * 2 * F * H), rng, 1.0f / std::sqrt(float(H)));
  c.w2 = random_bf16(size_t(E * H * F), rng, 1.0f / std::sqrt(float(F)));
  c.x.assign(size_t(T * H), ref::bf16(0));
  c.dy.assign(size_t(T * H), ref::bf16(0));
  for (int64_t t : sampled) {
    const std::vector<ref::bf16> xr = random_bf16(size_t(H), rng), dyr = random_bf16(size_t(H), rng);
    std::copy(xr.begin(), xr.end(), c.x.begin() + t * H);
    std::copy(dyr.begin(), dyr.end(), c.dy.begin() + t * H);
  }
  const ref::MoeGrads want = ref::moe_backward(s, c.x.data(), c.w13.data(), c.w2.data(), c.ids.data(),
                                               c.weights.data(), c.dy.data(), sampled);
  // ‖D ⊙ act‖ of the sampled tokens' assignments: the scale of d_topk_weights' rounding error.
  std::vector<double> scale(sampled.size() * size_t(k));
  for (size_t i = 0; i < sampled.size(); ++i)
    for (int64_t j = 0; j < k; ++j)
      scale[i * size_t(k) + size_t(j)] = dw_term_scale(c, sampled[i], c.ids[size_t(sampled[i] * k + j)]);

  for (const PlanOverride over : {PlanOverride{}, PlanOverride::mma_sync(64), PlanOverride::mma_sync(128)}) {
    BackwardRun run(forward_plan(s), options(SavedActivations::recompute), c, stream, rng, true, over);
    SCOPED_TRACE(run.plan.str());
    const Outputs out = run.run(stream);
    std::vector<bool> is_sampled(size_t(T), false);
    for (int64_t t : sampled) is_sampled[size_t(t)] = true;
    std::vector<double> dx_got, d_topk_err;
    int64_t nonzero_dx = 0, nonzero_topk = 0;
    for (int64_t t = 0; t < T; ++t) {
      const ref::bf16* row = out.dx.data() + t * H;
      if (is_sampled[size_t(t)]) {
        for (int64_t h = 0; h < H; ++h) dx_got.push_back(ref::to_float(row[h]));
        continue;
      }
      for (int64_t h = 0; h < H; ++h) nonzero_dx += ref::to_float(row[h]) != 0.0f;
      for (int64_t j = 0; j < k; ++j) nonzero_topk += out.d_topk[size_t(t * k + j)] != 0.0f;
    }
    EXPECT_EQ(nonzero_dx, 0) << "dx elements of tokens with dy = 0 that are not exactly 0";
    EXPECT_EQ(nonzero_topk, 0) << "d_topk_weights of tokens with dy = 0 that are not exactly 0";
    report_error("dx", ref::rel_norm_error(dx_got, want.dx), kDxTol);
    double err2 = 0, scale2 = 0;
    for (size_t i = 0; i < sampled.size(); ++i)
      for (int64_t j = 0; j < k; ++j) {
        const size_t a = i * size_t(k) + size_t(j);
        const double d = double(out.d_topk[size_t(sampled[i] * k + j)]) - want.d_topk_weights[a];
        err2 += d * d, scale2 += scale[a] * scale[a];
      }
    report_error("d_topk_weights", std::sqrt(err2 / scale2), kDwTol);
    report_error("dw13", ref::rel_norm_error(values_of(out.dw13, DType::bf16), want.dw13), kWeightGradTol);
    report_error("dw2", ref::rel_norm_error(values_of(out.dw2, DType::bf16), want.dw2), kWeightGradTol);
  }
}

}  // namespace
}  // namespace moekit::test
