// backward_wgmma_test.cu — the backward's prefill kernels on the GPU: the wgmma GEMMs of the
// backward (h, D, dx and dW) each alone and all against the oracle and the mma.sync path, and the
// training forward that keeps h for the backward (ForwardPlan::save_h). The rest of the suite, its
// bounds and harness: backward_test.cu, backward_util.hpp, backward_run.hpp.
//   build/tests/moekit_gpu_tests --gtest_filter='BackwardTest.*'
#include <string>

#include "backward_run.hpp"

namespace moekit::test {
namespace {

// The training forward keeps h (ForwardPlan::save_h: Mode::UpSaveH on wgmma, the mma.sync up
// GEMM's UpSaveHEpilogue) into a poisoned h of the caller's, and the backward reads it
// (SavedActivations::h, in.h = that h): the forward's y is bitwise the one without save_h, the gradients match the oracle, and
// where the forward's up GEMM and the backward's recomputation are one kernel family (wgmma at
// block_m 128, mma.sync elsewhere) they are bitwise those of the recomputing backward.
TEST_F(BackwardTest, TrainingForwardKeepsH) {
  struct Shape {
    MoeShape s;
    int block_m;
    int wgmma_splits = 0;  // > 0: the first wgmma config for both GEMMs, its down split this many ways
  };
  // The 16-row layout (the planner's at 8 rows an expert), 64-row and mma.sync 128-row layouts,
  // partial tiles (H = 200, F = 72), the planner's prefill layout (wgmma up), many tiles a CTA, and
  // a wgmma down split along K (the forward's y from combine_partials; the backward unchanged).
  for (const Shape& sh : {Shape{{33, 256, 128, 8, 2}, 0}, Shape{{33, 256, 128, 8, 2}, 64}, Shape{{45, 200, 72, 6, 2}, 16},
                          Shape{{45, 200, 72, 6, 2}, 128}, Shape{{300, 256, 128, 8, 2}, 0},
                          Shape{{1500, 576, 328, 8, 2}, 0}, Shape{{1500, 576, 328, 8, 2}, 0, 2}}) {
    const uint64_t seed = fresh_seed();
    const BackwardOptions o = options(SavedActivations::h, RouterGrad::none);
    SCOPED_TRACE(name_of(sh.s, sh.block_m, o, seed));
    std::mt19937_64 rng(seed);
    const Case c = make_case(sh.s, rng);
    ForwardPlan plain = forward_plan(sh.s, sh.block_m);
    if (sh.wgmma_splits > 0)
      for (const GemmConfig& w : compiled_gemm_configs(Precision::bf16))
        if (w.kernel == GemmKernel::wgmma) {
          plain = plan_forward_with(sh.s, w, w, sh.wgmma_splits);
          break;
        }
    ForwardPlan training = plain;
    training.save_h = true;
    SCOPED_TRACE(training.str());
    BackwardRun saved(training, o, c, stream, rng);
    ASSERT_FALSE(saved.plan.h_wgmma) << "h is given: nothing is recomputed";
    const Outputs got = saved.run(stream);
    check_outputs(saved, got);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(saved.run(stream) == got) << "run " << i << " differs";
    // The forward without save_h, on the same routing: y bitwise the training forward's.
    BackwardRun forward_only(plain, options(), c, stream, rng);  // recompute: no host h to build
    forward_only.forward_h(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(forward_only.y.download() == saved.y.download()) << "save_h changed the forward's y";
    BackwardRun recompute(plain, options(SavedActivations::recompute), c, stream, rng);
    const bool same_family = (plain.up.kernel == GemmKernel::wgmma) == recompute.plan.h_wgmma;
    if (same_family) EXPECT_TRUE(recompute.run(stream) == got) << "the saved h is not the recomputed one, bitwise";
  }
}

// The recomputation of h, the D and the dx GEMMs on the wgmma kernel (Mode::UpH; Mode::DGrad and
// Mode::Dx, W2 and W13 read N-major through their own TMA boxes and descriptor) and dW2 / dW13 on
// the wgmma weight-gradient kernel (both operands MN-major by cp.async), each alone and all:
// against the oracle at partial tiles (F = 328: 256 + 72 columns and a partial ⟨D, act⟩ group;
// H = 576: 256 + 256 + 64, and dW2's M = 576 = 4.5 tiles: a last tile with one warpgroup's rows;
// K tails of 2F = 656 and of ~375 rows an expert) and many tiles a CTA, bitwise the same run to
// run, and within the bounds of the mma.sync path (the two sum in different orders; what no
// wgmma kernel touched is bitwise equal).
TEST_F(BackwardTest, RaggedGemmsOnWgmma) {
  const uint64_t seed = fresh_seed();
  const MoeShape s{1500, 576, 328, 8, 2};
  const BackwardOptions o = options(SavedActivations::recompute, RouterGrad::gate);
  SCOPED_TRACE(name_of(s, 128, o, seed));
  std::mt19937_64 rng(seed);
  const Case c = make_case(s, rng, RouterGrad::gate, softmax_renorm());
  BackwardRun mma_sync(forward_plan(s, 128), o, c, stream, rng, true, PlanOverride::mma_sync());
  const Outputs base = mma_sync.run(stream);
  // Each kernel alone (D, dx, h, dW), then all four: the planner's choice at block_m 128.
  for (const PlanOverride over :
       {PlanOverride::wgmma(false, true, false, false), PlanOverride::wgmma(false, false, true, false),
        PlanOverride::wgmma(true, false, false, false), PlanOverride::wgmma(false, false, false, true),
        PlanOverride::wgmma(true, true, true, true)}) {
    BackwardRun run(forward_plan(s, 128), o, c, stream, rng, true, over);
    SCOPED_TRACE(run.plan.str());
    ASSERT_TRUE(run.plan.d_wgmma == over.d_wgmma && run.plan.dx_wgmma == over.dx_wgmma &&
                run.plan.h_wgmma == over.h_wgmma && run.plan.dw_wgmma == over.dw_wgmma);
    const Outputs first = run.run(stream);
    check_outputs(run, first);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(run.run(stream) == first) << "run " << i << " differs";
    report_error("dx against mma.sync", ref::rel_norm_error(to_double(first.dx), to_double(base.dx)), 2 * kDxTol);
    if (!over.d_wgmma && !over.h_wgmma) {
      EXPECT_TRUE(first.d_topk == base.d_topk && first.d_w_gate == base.d_w_gate)
          << "with h and D on mma.sync, d_topk_weights and d_w_gate are the mma.sync path's";
      if (!over.dw_wgmma)
        EXPECT_TRUE(first.dw13 == base.dw13 && first.dw2 == base.dw2) << "and dW too, on mma.sync";
      if (!over.dx_wgmma) EXPECT_TRUE(first.dx == base.dx) << "and dx too, on mma.sync";
    }
  }
}

// The wgmma weight-gradient kernel's stores where a CTA takes several items (E = 64: dW13 768
// items, dW2 320 over <= 132 CTAs, so each CTA's epilogues follow each other) and every tile edge
// is partial: H = 520 (dW13's last 8 columns, dW2's last M tile of 8 rows: one warp's rows cut,
// three warps' and warpgroup 1's past M), F = 200 (dW13's M = 400: a last tile of 16 rows; dW2's
// last 64-column piece of 8). On the 128-row layout and, where the planner puts dW on wgmma there
// too, the 16-row one; against the oracle, bitwise the same run to run, and within the bounds of
// the mma.sync path.
TEST_F(BackwardTest, WeightGradsManyItemsACtaAndPartialTiles) {
  const uint64_t seed = fresh_seed();
  const MoeShape s{1200, 520, 200, 64, 4};
  const BackwardOptions o = options(SavedActivations::h);
  std::mt19937_64 rng(seed);
  const Case c = make_case(s, rng);
  for (int block_m : {128, 16}) {
    SCOPED_TRACE(name_of(s, block_m, o, seed));
    BackwardRun mma_sync(forward_plan(s, block_m), o, c, stream, rng, true, PlanOverride::mma_sync());
    const Outputs base = mma_sync.run(stream);
    BackwardRun run(forward_plan(s, block_m), o, c, stream, rng);
    SCOPED_TRACE(run.plan.str());
    if (block_m == 128) ASSERT_TRUE(run.plan.dw_wgmma) << "the planner's dW at block_m 128";
    ASSERT_EQ(run.plan.dw_splits, 1) << "unsplit: the bf16 tile stored by the kernel itself";
    const Outputs first = run.run(stream);
    check_outputs(run, first);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(run.run(stream) == first) << "run " << i << " differs";
    auto against = [](const std::vector<unsigned char>& got, const std::vector<unsigned char>& want) {
      return ref::rel_norm_error(values_of(got, DType::bf16), values_of(want, DType::bf16));
    };
    report_error("dW13 against mma.sync", against(first.dw13, base.dw13), 2 * kWeightGradTol);
    report_error("dW2 against mma.sync", against(first.dw2, base.dw2), 2 * kWeightGradTol);
  }
}

}  // namespace
}  // namespace moekit::test
