// validation_fp8_test.cpp — the entries of an fp8 plan (experts_forward, moe_forward, expert_up,
// expert_down) and fp8 planning reject bad arguments with a moekit::Error naming the argument,
// before anything is launched: e4m3 weights with their block scales of the exact shapes, no scales
// for a bf16 plan, x_q from the workspace for the staged up GEMM, H and F multiples of 16.
#include <gtest/gtest.h>

#include <string>

#include "cpu_test_util.hpp"
#include "tuning/planner.hpp"

namespace moekit::testing {
namespace {

// F not a multiple of 128: w13 keeps gate's and up's scale blocks apart (2 · ceil(F/128) rows).
constexpr int64_t kT = 8, kE = 16, kK = 4, kH = 384, kF = 208;
constexpr int64_t kbH = 3, kbF = 2;

struct Fp8Layer {
  ForwardPlan plan = plan_forward(MoeShape{kT, kH, kF, kE, kK}, kH200, Precision::fp8);
  Tensor x{fake_ptr(1), DType::bf16, {kT, kH}};
  ExpertWeights w{Tensor(fake_ptr(4), DType::e4m3, {kE, 2 * kF, kH}), Tensor(fake_ptr(5), DType::e4m3, {kE, kH, kF}),
                  Tensor(fake_ptr(11), DType::f32, {kE, 2 * kbF, kbH}), Tensor(fake_ptr(12), DType::f32, {kE, kbH, kbF})};
  Tensor topk_ids{fake_ptr(6), DType::i32, {kT, kK}};
  Tensor topk_weights{fake_ptr(7), DType::f32, {kT, kK}};
  Tensor y{fake_ptr(9), DType::bf16, {kT, kH}};
  void* workspace = fake_ptr(10);
  size_t bytes = workspace_bytes(plan);

  void experts() const { experts_forward(plan, x, w, topk_ids, topk_weights, y, workspace, bytes, nullptr); }
  void moe() const {
    MoeInputs in{x, Tensor(fake_ptr(2), DType::bf16, {kE, kH}), {}, {}, w.w13, w.w2, w.w13_scale, w.w2_scale};
    moe_forward(plan, in, RouterOptions{}, y, workspace, bytes, nullptr);
  }
  void up(const Tensor& xq) const {
    const Workspace ws = carve_workspace(plan, workspace, bytes);
    expert_up(plan, xq, w.w13, ws, nullptr, w.w13_scale);
  }
  void down() const {
    const Workspace ws = carve_workspace(plan, workspace, bytes);
    expert_down(plan, w.w2, topk_weights, ws, nullptr, w.w2_scale);
  }
};

template <class Mutate, class Call>
BadCall bad(std::string what, Mutate mutate, Call call, std::string arg) {
  Fp8Layer l;
  mutate(l);
  return {std::move(what), [l, call] { call(l); }, std::move(arg)};
}

TEST(Fp8Validation, E4m3IsOneByte) {
  EXPECT_EQ(dtype_bytes(DType::e4m3), 1);
  EXPECT_STREQ(dtype_name(DType::e4m3), "e4m3");
  EXPECT_EQ(Tensor(fake_ptr(1), DType::e4m3, {3, 16}).bytes(), 48);
}

TEST(Fp8Validation, PlanIsFp8WithTheLayoutItNeeds) {
  const Fp8Layer l;
  EXPECT_EQ(l.plan.precision(), Precision::fp8);
  EXPECT_TRUE(tuning::up_config_ok(l.plan.up));  // whole 128-column act groups per up tile or cluster
  const Workspace ws = carve_workspace(l.plan, l.workspace, l.bytes);
  EXPECT_EQ(ws.act.dtype, DType::e4m3);
  EXPECT_EQ(ws.x_q.dtype, DType::e4m3);
  EXPECT_EQ(ws.x_scale.shape[1], kbH);
  EXPECT_EQ(ws.act_scale.shape[1], kbF);
  const ForwardPlan bf16 = plan_forward(MoeShape{kT, kH, kF, kE, kK}, kH200);
  EXPECT_FALSE(carve_workspace(bf16, l.workspace, workspace_bytes(bf16)).x_q.given());
}

TEST(Fp8Validation, WeightsAndScales) {
  auto experts = [](const Fp8Layer& l) { l.experts(); };
  auto moe = [](const Fp8Layer& l) { l.moe(); };
  for (auto call : {+experts, +moe}) {
    expect_all_rejected({
        bad("w13 bf16 in an fp8 plan", [](Fp8Layer& l) { l.w.w13.dtype = DType::bf16; }, call, "w13"),
        bad("w2 [E, F, H]", [](Fp8Layer& l) { l.w.w2 = with_shape(l.w.w2, {kE, kF, kH}); }, call, "w2"),
        bad("w13_scale missing", [](Fp8Layer& l) { l.w.w13_scale = Tensor{}; }, call, "w13_scale"),
        bad("w2_scale missing", [](Fp8Layer& l) { l.w.w2_scale = Tensor{}; }, call, "w2_scale"),
        bad("w13_scale one K block short", [](Fp8Layer& l) { l.w.w13_scale = with_shape(l.w.w13_scale, {kE, 2 * kbF, kbH - 1}); },
            call, "w13_scale"),
        bad("w13_scale the rows of one projection", [](Fp8Layer& l) { l.w.w13_scale = with_shape(l.w.w13_scale, {kE, kbF, kbH}); },
            call, "w13_scale"),
        bad("w2_scale transposed", [](Fp8Layer& l) { l.w.w2_scale = with_shape(l.w.w2_scale, {kE, kbF, kbH}); }, call, "w2_scale"),
        bad("w2_scale bf16", [](Fp8Layer& l) { l.w.w2_scale.dtype = DType::bf16; }, call, "w2_scale"),
        bad("x e4m3 (the layer quantizes x itself)", [](Fp8Layer& l) { l.x.dtype = DType::e4m3; }, call, "x"),
    });
  }
}

TEST(Fp8Validation, Bf16PlanTakesNoScales) {
  const ForwardPlan bf16 = plan_forward(MoeShape{kT, kH, kF, kE, kK}, kH200);
  const Fp8Layer l;
  const ExpertWeights w{Tensor(fake_ptr(4), DType::bf16, {kE, 2 * kF, kH}), Tensor(fake_ptr(5), DType::bf16, {kE, kH, kF}),
                        l.w.w13_scale, {}};
  EXPECT_TRUE(throws_naming([&] {
    experts_forward(bf16, l.x, w, l.topk_ids, l.topk_weights, l.y, l.workspace, workspace_bytes(bf16), nullptr);
  }, "w13_scale"));
  const ExpertWeights fp8_weights_bf16_plan{l.w.w13, l.w.w2, {}, {}};
  EXPECT_TRUE(throws_naming([&] {
    experts_forward(bf16, l.x, fp8_weights_bf16_plan, l.topk_ids, l.topk_weights, l.y, l.workspace,
                    workspace_bytes(bf16), nullptr);
  }, "w13"));
}

TEST(Fp8Validation, StagedGemms) {
  const Fp8Layer l;
  // The up GEMM of an fp8 plan reads ws.x_q (quantize_tokens' output), not another e4m3 tensor.
  EXPECT_TRUE(throws_naming([&] { l.up(Tensor(fake_ptr(20), DType::e4m3, {kT, kH})); }, "x"));
  EXPECT_TRUE(throws_naming([&] { l.up(l.x); }, "x"));  // bf16 x
  expect_all_rejected({
      bad("up without w13_scale", [](Fp8Layer& l) { l.w.w13_scale = Tensor{}; },
          [](const Fp8Layer& l) { l.up(carve_workspace(l.plan, l.workspace, l.bytes).x_q); }, "w13_scale"),
      bad("down without w2_scale", [](Fp8Layer& l) { l.w.w2_scale = Tensor{}; }, [](const Fp8Layer& l) { l.down(); },
          "w2_scale"),
      bad("down with bf16 w2", [](Fp8Layer& l) { l.w.w2.dtype = DType::bf16; }, [](const Fp8Layer& l) { l.down(); }, "w2"),
  });
}

// The up epilogue quantizes 128-column act groups: an fp8 tile (block_n/2 act columns) covers
// one group, or 1/2, 1/4, 1/8 of one as a cluster of CTAs (mma.sync only; a cluster of at most
// 8, the portable size). Any bf16 config can be up.
TEST(Fp8Validation, UpTilesCoverWholeActGroups) {
  auto cfg = [](int block_n, GemmKernel k, Precision p = Precision::fp8) {
    return GemmConfig{16, block_n, 256, 1, 4, 4, k, p};
  };
  for (int bn : {256, 128, 64, 32}) EXPECT_TRUE(tuning::up_config_ok(cfg(bn, GemmKernel::mma_sync))) << bn;
  for (int bn : {16, 96, 192, 512}) EXPECT_FALSE(tuning::up_config_ok(cfg(bn, GemmKernel::mma_sync))) << bn;
  EXPECT_TRUE(tuning::up_config_ok(cfg(256, GemmKernel::wgmma)));
  EXPECT_FALSE(tuning::up_config_ok(cfg(128, GemmKernel::wgmma)));  // the wgmma kernel has no cluster
  EXPECT_TRUE(tuning::up_config_ok(cfg(96, GemmKernel::mma_sync, Precision::bf16)));
}

// The router quantizes an FP8 layer's x where its gate kernel does (the decode cluster tilings,
// whose slices are whole 128-column groups for any H, the x tile in shared memory); elsewhere
// quantize_tokens' pass runs. bf16 plans never ask.
TEST(Fp8Validation, RouterQuantizesXWhereTheGateCan) {
  auto router = [](int64_t T, int64_t H, int64_t F, int64_t E, int64_t k, Precision p) {
    return plan_forward(MoeShape{T, H, F, E, k}, kH200, p).router;
  };
  for (int64_t T : {1, 16, 17, 256}) {
    EXPECT_TRUE(router(T, 7168, 2048, 256, 8, Precision::fp8).quantize_x) << T;  // DeepSeek-V3 decode: clusters
    EXPECT_TRUE(router(T, 2048, 768, 128, 8, Precision::fp8).quantize_x) << T;   // Qwen3
    EXPECT_FALSE(router(T, 7168, 2048, 256, 8, Precision::bf16).quantize_x) << T;
  }
  const RouterPlan looped = router(16384, 4096, 14336, 8, 2, Precision::fp8);  // Mixtral prefill
  EXPECT_EQ(looped.gate, GateKernel::looped_64x8);
  EXPECT_FALSE(looped.quantize_x);  // prefill's tilings: the pass
  const RouterPlan pipe = router(16384, 7168, 2048, 256, 8, Precision::fp8);
  EXPECT_EQ(pipe.gate, GateKernel::pipelined_128x64);
  EXPECT_FALSE(pipe.quantize_x);
  EXPECT_TRUE(router(1, 336, 256, 8, 2, Precision::fp8).quantize_x);   // H not /128: a partial last group
  EXPECT_TRUE(router(1, 2880, 2880, 32, 4, Precision::fp8).quantize_x);  // gpt-oss-like: 22.5 groups
  // The 32 x 32 cluster tiling at H = 7168 needs ~126 KB: on a device with less, the pass.
  const RouterPlan cl = tuning::plan_router(200, 256, 7168, true, kH200.smem_per_block_optin, kH200.sm_count, Precision::fp8);
  EXPECT_EQ(cl.gate, GateKernel::cluster_32x32);
  EXPECT_TRUE(cl.quantize_x);
  EXPECT_FALSE(tuning::plan_router(200, 256, 7168, true, 100 * 1024, kH200.sm_count, Precision::fp8).quantize_x);
  EXPECT_EQ(pipe.str().find("+x_q"), std::string::npos);
  EXPECT_NE(cl.str().find("+x_q"), std::string::npos);
}

TEST(Fp8Validation, Planning) {
  EXPECT_TRUE(throws_naming([] { plan_forward(MoeShape{kT, 200, kF, kE, kK}, kH200, Precision::fp8); }, "shape.hidden"));
  EXPECT_TRUE(throws_naming([] { plan_forward(MoeShape{kT, kH, 200, kE, kK}, kH200, Precision::fp8); }, "shape.inter"));
  EXPECT_NO_THROW(plan_forward(MoeShape{kT, 200, 200, kE, kK}, kH200));  // bf16 needs multiples of 8 only
  // An fp8 up tile must cover whole act groups (tuning::up_config_ok); configs of two precisions
  // never pair.
  const ForwardPlan p = plan_forward(MoeShape{kT, kH, kF, kE, kK}, kH200, Precision::fp8);
  for (const GemmConfig& c : compiled_gemm_configs(Precision::fp8))
    if (!tuning::up_config_ok(c) && c.block_m == p.block_m())
      EXPECT_TRUE(throws_naming([&] { plan_forward_with(p.shape, c, p.down); }, "up"));
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(p.shape, p.up, compiled_gemm_configs().front()); }, "down"));
}

}  // namespace
}  // namespace moekit::testing
