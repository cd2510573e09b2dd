// backward_plan_test.cpp — the backward's planner (plan_backward: its split-K rules, tiles and kernel
// choices, the checks of a plan): pure host functions, checked on a hand-made H200. Its workspace
// layout: backward_workspace_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "backward_cpu_util.hpp"
#include "cpu_test_util.hpp"
#include "moekit/backward.hpp"
#include "tuning/backward_planner.hpp"
#include "tuning/planner.hpp"

namespace moekit::testing {
namespace {

// The first compiled wgmma config (block_m 128): the planner's prefill tile.
const GemmConfig& chosen_wgmma_config() {
  for (const GemmConfig& c : compiled_gemm_configs())
    if (c.kernel == GemmKernel::wgmma) return c;
  throw std::logic_error("no compiled wgmma config");
}

TEST(PlanBackward, ReplaysTheForwardsLayoutAndConfigs) {
  for (const Preset& p : kPresets)
    for (int64_t T : {0, 1, 16, 300, 4096, 65536}) {
      SCOPED_TRACE(::testing::Message() << p.name << " T=" << T);
      const ForwardPlan fwd = plan_forward(shape_of(p, T), kH200);
      const BackwardPlan b = plan_backward(fwd, kH200, every_grad());
      EXPECT_EQ(b.shape.tokens, T);
      EXPECT_EQ(b.shape.inter, p.F);
      EXPECT_EQ(b.block_m, fwd.block_m());
      EXPECT_EQ(b.max_rows(), fwd.max_rows());
      EXPECT_EQ(b.max_blocks(), fwd.max_blocks());
      EXPECT_EQ(b.up, fwd.up);
      EXPECT_EQ(b.d, fwd.up);
      EXPECT_EQ(b.dx, fwd.down);
      EXPECT_EQ(b.d_col_tiles(), (p.F + kDGemmTileN - 1) / kDGemmTileN);
      EXPECT_EQ(b.experts_padded(), (p.E + 7) / 8 * 8);
      EXPECT_EQ(b.source, "forward:" + fwd.source);
      EXPECT_EQ(b.options.router, RouterGrad::gate);
      // dx is the down GEMM's shape with K = 2F: the forward's split-K rule at that K.
      MoeShape dx_shape = fwd.shape;
      dx_shape.inter = 2 * p.F;
      EXPECT_EQ(b.dx_splits, tuning::plan_down_splits(dx_shape, fwd.down, kH200));
      EXPECT_GE(b.dx_splits, fwd.down_splits);  // twice the K can only split more
      EXPECT_EQ(b.dw_splits, tuning::plan_weight_grad_splits(fwd.shape, kH200));
      EXPECT_EQ(b.gate_splits, tuning::plan_gate_grad_splits(fwd.shape, kH200));
      EXPECT_NO_THROW(detail::expect_backward_plan(b, "test"));
    }
}

// The wgmma weight-gradient kernel's 32-bit work items: counted by hand for the presets, and a
// shape past 2^31 items keeps its weight gradients on the mma.sync tile; a plan edited to take
// the wgmma kernel there is refused, naming 'plan'.
TEST(PlanBackward, WgmmaWeightGradItemsFit32Bits) {
  // Mixtral: dW13 [28672, 4096] is 224 x 16 tiles, dW2 [4096, 14336] 32 x 56: 8 · 3584 items.
  EXPECT_EQ(tuning::wgmma_weight_grad_items(shape_of(kPresets[0], 16384), 1), 8 * 224 * 16);
  EXPECT_EQ(tuning::wgmma_weight_grad_items(shape_of(kPresets[0], 16384), 4), 4 * 8 * 224 * 16);
  // H = 2^20, F = 2^16, E = 512: dW13 is 1024 x 4096 tiles an expert, 2^31 items in all.
  const MoeShape huge{8192, int64_t(1) << 20, int64_t(1) << 16, 512, 8};
  EXPECT_EQ(tuning::wgmma_weight_grad_items(huge, 1), int64_t(1) << 31);
  const GemmConfig& wide = chosen_wgmma_config();
  const ForwardPlan fwd = plan_forward_with(huge, wide, wide);
  BackwardPlan b = plan_backward(fwd, kH200, every_grad());
  EXPECT_EQ(b.block_m, 128);
  EXPECT_TRUE(b.d_wgmma) << b.str();
  EXPECT_FALSE(b.dw_wgmma) << "2^31 items do not fit the wgmma kernel's 32-bit items: " << b.str();
  EXPECT_NO_THROW(detail::expect_backward_plan(b, "test"));
  b.dw_wgmma = true;
  EXPECT_TRUE(throws_naming([&] { detail::expect_backward_plan(b, "test"); }, "plan"));
  const MoeShape fits{8192, int64_t(1) << 20, (int64_t(1) << 16) - 128, 512, 8};
  EXPECT_LT(tuning::wgmma_weight_grad_items(fits, 1), int64_t(1) << 31);
  EXPECT_TRUE(plan_backward(plan_forward_with(fits, wide, wide), kH200, every_grad()).dw_wgmma);
}

TEST(PlanBackward, SplitRulesByHand) {
  // Doubling while the tiles cover 264 CTAs less than twice and each slice keeps 4 K steps.
  EXPECT_EQ(tuning::plan_splits(24, 32, 132, 8), 8);   // 24·4 < 264 and 32/8 = 4
  EXPECT_EQ(tuning::plan_splits(24, 31, 132, 8), 4);   // 31/8 < 4
  EXPECT_EQ(tuning::plan_splits(100, 64, 132, 8), 4);  // 100·2 < 264, 100·4 >= 264
  EXPECT_EQ(tuning::plan_splits(264, 1000, 132, 8), 1);
  EXPECT_EQ(tuning::plan_splits(1, 1000, 132, 2), 2);  // the cap
  EXPECT_EQ(tuning::plan_splits(1, 7, 132, 8), 1);     // 7/2 < 4: no slice would keep 4 steps
  // dW of the presets: thousands of 128 x 128 tiles (DeepSeek-V3: 256 experts x (32·56 + 56·16)),
  // never split.
  for (const Preset& p : kPresets)
    for (int64_t T : {1, 4096, 65536}) EXPECT_EQ(tuning::plan_weight_grad_splits(shape_of(p, T), kH200), 1);
  // A small layer (H 256, F 128, E 4, k 2): 4·(2·2 + 2·1) = 24 tiles. T 4096 -> 2048 rows per
  // expert, 32 K steps: 8 splits. T 256 -> 128 rows, 2 steps: none.
  EXPECT_EQ(tuning::plan_weight_grad_splits(MoeShape{4096, 256, 128, 4, 2}, kH200), 8);
  EXPECT_EQ(tuning::plan_weight_grad_splits(MoeShape{256, 256, 128, 4, 2}, kH200), 1);
  EXPECT_EQ(tuning::plan_weight_grad_splits(MoeShape{0, 256, 128, 4, 2}, kH200), 1);
  // d_w_gate of DeepSeek-V3: 2·56 = 112 tiles; T 16384 is 256 K steps: 4 splits (112·4 >= 264).
  EXPECT_EQ(tuning::plan_gate_grad_splits(shape_of(kPresets[2], 16384), kH200), 4);
  EXPECT_EQ(tuning::plan_gate_grad_splits(shape_of(kPresets[2], 64), kH200), 1);
}

TEST(PlanBackward, OnlyWhatIsComputedIsSplit) {
  const ForwardPlan fwd = plan_forward(MoeShape{16384, 256, 128, 4, 2}, kH200);
  BackwardOptions all = every_grad();
  const BackwardPlan b = plan_backward(fwd, kH200, all);
  ASSERT_GT(b.dw_splits, 1);
  ASSERT_GT(b.gate_splits, 1);
  BackwardOptions none;
  none.input_grad = false;
  none.weight_grads = false;
  const BackwardPlan n = plan_backward(fwd, kH200, none);
  EXPECT_EQ(n.dx_splits, 1);
  EXPECT_EQ(n.dw_splits, 1);
  EXPECT_EQ(n.gate_splits, 1);
  EXPECT_EQ(n.str().find("dx="), std::string::npos);
  EXPECT_NE(n.str().find("grads=none"), std::string::npos);
}

TEST(PlanBackward, PrintsItsChoices) {
  BackwardOptions o = every_grad();
  o.weight_grad_dtype = DType::f32;
  o.accumulate_weight_grads = true;
  const BackwardPlan b = plan_backward(plan_forward(MoeShape{16384, 256, 128, 4, 2}, kH200), kH200, o);
  const std::string s = b.str();
  for (const std::string want : {"backward T=16384", "block_m=128", "saved=recompute", "router=gate",
                                 "grads=dx,dw(f32,accumulate)", "tiles=mma_sync-m128n256 from:", " up=", " d=", " dx=",
                                 "dw_splits=8", "gate_splits=", "source=forward:"})
    EXPECT_NE(s.find(want), std::string::npos) << want << " in " << s;
  // The tile that runs follows the layout: 16 rows at decode's block_m (16, 32), 128 x 256 at block_m 128
  // with 8192 rows an expert.
  EXPECT_NE(plan_backward(plan_forward(MoeShape{4, 256, 128, 4, 2}, kH200), kH200, o).str().find("tiles=mma_sync-m16n64"),
            std::string::npos);
  o.saved = SavedActivations::h;
  EXPECT_EQ(plan_backward(plan_forward(MoeShape{16, 256, 128, 4, 2}, kH200), kH200, o).str().find(" up="),
            std::string::npos);  // nothing to recompute
  EXPECT_STREQ(saved_activations_name(SavedActivations::h), "h");
  EXPECT_STREQ(router_grad_name(RouterGrad::logits), "logits");
}

TEST(PlanBackward, RefusesWhatItCannotPlan) {
  const ForwardPlan fwd = plan_forward(MoeShape{64, 2048, 768, 128, 8}, kH200);
  DeviceInfo ampere = kH200;
  ampere.cc_major = 8;
  EXPECT_TRUE(throws_naming([&] { plan_backward(fwd, ampere); }, "device"));
  const ForwardPlan fp8 = plan_forward(MoeShape{64, 2048, 768, 128, 8}, kH200, Precision::fp8);
  EXPECT_TRUE(throws_naming([&] { plan_backward(fp8, kH200); }, "plan"));
  ForwardPlan bad = fwd;
  bad.shape.tokens = -1;
  EXPECT_TRUE(throws_naming([&] { plan_backward(bad, kH200); }, "shape.tokens"));
  bad = fwd;
  bad.down.block_m = 64;
  EXPECT_TRUE(throws_naming([&] { plan_backward(bad, kH200); }, "plan"));
  auto with = [&](auto edit) {
    BackwardOptions o;
    edit(o);
    return [o, &fwd] { plan_backward(fwd, kH200, o); };
  };
  EXPECT_TRUE(throws_naming(with([](BackwardOptions& o) { o.saved = SavedActivations(2); }), "options.saved"));
  EXPECT_TRUE(throws_naming(with([](BackwardOptions& o) { o.router = RouterGrad(3); }), "options.router"));
  EXPECT_TRUE(throws_naming(with([](BackwardOptions& o) { o.weight_grad_dtype = DType::i32; }), "options.weight_grad_dtype"));
  EXPECT_TRUE(throws_naming(with([](BackwardOptions& o) { o.weight_grad_dtype = DType::e4m3; }), "options.weight_grad_dtype"));
  EXPECT_TRUE(throws_naming(with([](BackwardOptions& o) { o.accumulate_weight_grads = true; }),  // bf16
                            "options.accumulate_weight_grads"));
  EXPECT_TRUE(throws_naming(with([](BackwardOptions& o) {
                              o.weight_grad_dtype = DType::f32, o.accumulate_weight_grads = true, o.weight_grads = false;
                            }),
                            "options.accumulate_weight_grads"));
}

TEST(PlanBackward, TileRowsFollowTheLayoutAndTheRowsAnExpertGets) {
  using tuning::kWideTileRowsPerExpert;
  using tuning::plan_backward_tile_rows;
  // Below block_m 64: the 16-row tile; block_m 64: the 64-row one, whatever the rows.
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{1 << 20, 256, 128, 4, 2}, 16), 16);
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{1 << 20, 256, 128, 4, 2}, 32), 16);
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{1 << 20, 256, 128, 4, 2}, 64), 64);
  // block_m 128: the wide tile from kWideTileRowsPerExpert rows an expert on (T·k / E), not below.
  const int64_t E = 8, k = 2, T = kWideTileRowsPerExpert * E / k;
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{T, 4096, 14336, E, k}, 128), 128);
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{T - 1, 4096, 14336, E, k}, 128), 64);
  // Qwen3-30B-A3B at T = 4096 (256 rows an expert) and 16384 (1024); fewer assignments than
  // experts count the touched ones only (one row each).
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{4096, 2048, 768, 128, 8}, 128), 64);
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{16384, 2048, 768, 128, 8}, 128), 128);
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{3, 2048, 768, 128, 8}, 128), 64);
  EXPECT_EQ(plan_backward_tile_rows(MoeShape{0, 2048, 768, 128, 8}, 128), 64);
  // A plan's tile must divide its layout's blocks.
  BackwardPlan b = plan_backward(plan_forward(MoeShape{16384, 256, 128, 4, 2}, kH200), kH200, every_grad());
  EXPECT_EQ(b.tile_rows, 128);
  b.tile_rows = 32;
  EXPECT_THROW(detail::expect_backward_plan(b, "moe_backward"), Error);
}

// A forward whose wgmma down GEMM splits K (Mixtral T=512 on an H100, the cost model's choice):
// its backward replays the layout and the configs, and dx, a whole-row GEMM on wgmma, stays
// unsplit (the forward's split is its own: the backward never reads y_partials).
TEST(PlanBackward, AForwardsWgmmaSplitKLeavesDxWhole) {
  const ForwardPlan fwd = plan_forward(MoeShape{512, 4096, 14336, 8, 2}, kH100);
  ASSERT_EQ(fwd.down.kernel, GemmKernel::wgmma) << fwd.str();
  ASSERT_EQ(fwd.down_splits, 2) << fwd.str();
  const BackwardPlan b = plan_backward(fwd, kH100, every_grad());
  EXPECT_EQ(b.dx, fwd.down);
  EXPECT_EQ(b.dx_splits, 1);
  EXPECT_TRUE(b.dx_wgmma) << b.str();
  EXPECT_NO_THROW(detail::expect_backward_plan(b, "moe_backward"));
}

TEST(PlanBackward, WgmmaGemmsWhereverBlockMIs128AndDwAtEveryBlockM) {
  // The planner puts h, D and dx on wgmma wherever the layout's block_m is 128, dW at every block_m
  // (its K range is each expert's rows, not the layout's blocks; docs/perf/NOTES.md, "Backward").
  BackwardPlan prefill = plan_backward(plan_forward(MoeShape{16384, 256, 128, 4, 2}, kH200), kH200, every_grad());
  ASSERT_EQ(prefill.block_m, 128);
  EXPECT_TRUE(prefill.h_wgmma && prefill.d_wgmma && prefill.dx_wgmma && prefill.dw_wgmma) << prefill.str();
  EXPECT_NO_THROW(detail::expect_backward_plan(prefill, "moe_backward"));
  EXPECT_NE(prefill.str().find(" h_gemm=wgmma-m128n256 d_gemm=wgmma-m128n256 dx_gemm=wgmma-m128n256"
                               " dw_gemm=wgmma-m128n256"),
            std::string::npos)
      << prefill.str();
  // use_wgmma_gemms sets each flag as asked where the plan allows it: all off is the mma.sync path.
  use_wgmma_gemms(prefill, false, false, false, false);
  EXPECT_FALSE(prefill.h_wgmma || prefill.d_wgmma || prefill.dx_wgmma || prefill.dw_wgmma);
  EXPECT_EQ(prefill.str().find("_gemm=wgmma"), std::string::npos) << prefill.str();
  use_wgmma_gemms(prefill, false, true, false, false);
  EXPECT_TRUE(!prefill.h_wgmma && prefill.d_wgmma && !prefill.dx_wgmma && !prefill.dw_wgmma);
  use_wgmma_gemms(prefill, false, false, false, true);
  EXPECT_TRUE(!prefill.h_wgmma && !prefill.d_wgmma && !prefill.dx_wgmma && prefill.dw_wgmma);

  BackwardPlan decode = plan_backward(plan_forward(MoeShape{4, 256, 128, 4, 2}, kH200), kH200, every_grad());
  ASSERT_NE(decode.block_m, 128);
  EXPECT_FALSE(decode.h_wgmma || decode.d_wgmma || decode.dx_wgmma) << "block_m below 128: " << decode.str();
  EXPECT_TRUE(decode.dw_wgmma) << "dW at every block_m: " << decode.str();
  EXPECT_NO_THROW(detail::expect_backward_plan(decode, "moe_backward"));
  EXPECT_NE(decode.str().find(" dw_gemm=wgmma-m128n256"), std::string::npos) << decode.str();
  use_wgmma_gemms(decode, false, false, false, false);
  EXPECT_FALSE(decode.dw_wgmma) << "all off is the mma.sync path at every block_m";
  decode.dx_wgmma = true;
  EXPECT_TRUE(throws_naming([&] { detail::expect_backward_plan(decode, "moe_backward"); }, "plan"));
  decode.dx_wgmma = false;
  decode.d_wgmma = true;
  EXPECT_TRUE(throws_naming([&] { detail::expect_backward_plan(decode, "moe_backward"); }, "plan"));
  decode.d_wgmma = false;
  decode.h_wgmma = true;
  EXPECT_TRUE(throws_naming([&] { detail::expect_backward_plan(decode, "moe_backward"); }, "plan"));
  decode.h_wgmma = false;

  BackwardOptions saved = every_grad();
  saved.saved = SavedActivations::h;
  BackwardPlan given_h = plan_backward(plan_forward(MoeShape{16384, 256, 128, 4, 2}, kH200), kH200, saved);
  EXPECT_TRUE(!given_h.h_wgmma && given_h.d_wgmma && given_h.dx_wgmma && given_h.dw_wgmma)
      << "h given: nothing to recompute";
  given_h.h_wgmma = true;
  EXPECT_TRUE(throws_naming([&] { detail::expect_backward_plan(given_h, "moe_backward"); }, "plan"));

  BackwardOptions no_dx = every_grad();
  no_dx.input_grad = false;
  BackwardPlan weights_only = plan_backward(plan_forward(MoeShape{16384, 256, 128, 4, 2}, kH200), kH200, no_dx);
  EXPECT_TRUE(weights_only.h_wgmma && weights_only.d_wgmma && !weights_only.dx_wgmma) << "no dx";
  weights_only.dx_wgmma = true;
  EXPECT_TRUE(throws_naming([&] { detail::expect_backward_plan(weights_only, "moe_backward"); }, "plan"));
  weights_only.dx_wgmma = false;

  BackwardOptions no_dw = every_grad();
  no_dw.weight_grads = false;
  BackwardPlan inputs_only = plan_backward(plan_forward(MoeShape{16384, 256, 128, 4, 2}, kH200), kH200, no_dw);
  EXPECT_TRUE(inputs_only.d_wgmma && inputs_only.dx_wgmma && !inputs_only.dw_wgmma) << "no weight grads";
  inputs_only.dw_wgmma = true;
  EXPECT_TRUE(throws_naming([&] { detail::expect_backward_plan(inputs_only, "moe_backward"); }, "plan"));

  // Asking for all four turns on only what each plan allows.
  for (BackwardPlan* p : {&decode, &given_h, &weights_only, &inputs_only}) {
    use_wgmma_gemms(*p);
    EXPECT_NO_THROW(detail::expect_backward_plan(*p, "moe_backward")) << p->str();
  }
  EXPECT_TRUE(!decode.h_wgmma && !decode.d_wgmma && !decode.dx_wgmma && decode.dw_wgmma);
  EXPECT_TRUE(!given_h.h_wgmma && given_h.d_wgmma && given_h.dx_wgmma && given_h.dw_wgmma);
  EXPECT_TRUE(weights_only.h_wgmma && weights_only.d_wgmma && !weights_only.dx_wgmma && weights_only.dw_wgmma);
  EXPECT_TRUE(inputs_only.d_wgmma && inputs_only.dx_wgmma && !inputs_only.dw_wgmma);
}

}  // namespace
}  // namespace moekit::testing
