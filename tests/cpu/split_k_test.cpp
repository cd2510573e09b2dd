// split_k_test.cpp — split-K of the down GEMM on the host side: when plan_forward splits, the
// workspace it sizes, the oracle of split-K's combine, and the validation of the new arguments.
#include <cmath>

#include "cpu_test_util.hpp"
#include "moekit/reference.hpp"

namespace moekit::testing {
namespace {

TEST(SplitKPlan, DecodeSplitsPrefillDoesNot) {
  // Mixtral at T=1: 2 experts x 64 column tiles cannot fill 132 SMs x 2 resident CTAs.
  const ForwardPlan decode = plan_forward({1, 4096, 14336, 8, 2}, kH200);
  EXPECT_GT(decode.down_splits, 1) << decode.str();
  EXPECT_NE(decode.str().find("down_splits"), std::string::npos);
  // Prefill tiles fill the GPU: no split.
  EXPECT_EQ(plan_forward({4096, 4096, 14336, 8, 2}, kH200).down_splits, 1);
  // DeepSeek-V3 at T=16 touches ~100 experts x 112 tiles: no split needed.
  EXPECT_EQ(plan_forward({16, 7168, 2048, 256, 8}, kH200).down_splits, 1);
  // Every choice is in range and leaves each slice at least one K-tile.
  for (int64_t T : {1, 2, 4, 8, 16, 32, 64})
    for (const MoeShape& s : {MoeShape{T, 4096, 14336, 8, 2}, MoeShape{T, 2048, 768, 128, 8}, MoeShape{T, 7168, 2048, 256, 8}}) {
      const ForwardPlan p = plan_forward(s, kH200);
      EXPECT_GE(p.down_splits, 1);
      EXPECT_LE(p.down_splits, kMaxDownSplits);
      EXPECT_LE(p.down_splits, (s.inter + p.down.block_k - 1) / p.down.block_k) << p.str();
    }
}

TEST(SplitKPlan, WorkspaceHoldsThePartials) {
  const GemmConfig c = compiled_gemm_configs().front();
  const MoeShape s{5, 256, 512, 8, 2};
  const ForwardPlan one = plan_forward_with(s, c, c, 1), four = plan_forward_with(s, c, c, 4);
  EXPECT_GE(workspace_bytes(four), workspace_bytes(one) + size_t(4 * 10 * 256 * 4));
  const Workspace ws1 = carve_workspace(one, fake_ptr(1), workspace_bytes(one));
  EXPECT_FALSE(ws1.y_partials.given());
  const Workspace ws4 = carve_workspace(four, fake_ptr(1), workspace_bytes(four));
  ASSERT_EQ(ws4.y_partials.rank, 3);
  EXPECT_EQ(ws4.y_partials.dim(0), 4);
  EXPECT_EQ(ws4.y_partials.dim(1), 10);
  EXPECT_EQ(ws4.y_partials.dim(2), 256);
  const char* end = static_cast<const char*>(fake_ptr(1)) + workspace_bytes(four);
  EXPECT_LE(static_cast<const char*>(ws4.y_partials.data) + ws4.y_partials.bytes(), end);
}

TEST(SplitKPlan, RejectsOutOfRangeSplits) {
  const GemmConfig c = compiled_gemm_configs().front();
  const MoeShape s{5, 256, 512, 8, 2};
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, c, c, 0); }, "down_splits"));
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, c, c, kMaxDownSplits + 1); }, "down_splits"));
  ForwardPlan p = plan_forward_with(s, c, c, 2);
  p.down_splits = 99;  // edited after planning
  const Workspace ws = carve_workspace(plan_forward_with(s, c, c, 2), fake_ptr(1), workspace_bytes(p));
  EXPECT_TRUE(throws_naming([&] { expert_down(p, Tensor(fake_ptr(2), DType::bf16, {8, 256, 512}),
                                              Tensor(fake_ptr(3), DType::f32, {5, 2}), ws, nullptr); }, "plan"));
}

TEST(SplitKCombine, OracleSumsSlotsThenSlices) {
  // T=1, k=2, S=2, H=1: order j0s0, j0s1, j1s0, j1s1. 1e8 + 1 - 1e8 + 1 in FP32 is 1, not 2.
  const float partials[4] = {1e8f, -1e8f, 1.0f, 1.0f};  // [s][a]: s0 = {1e8, -1e8}, s1 = {1, 1}
  const auto y = ref::combine_partials(partials, 2, 1, 2, 1);
  float want = 0.0f;
  for (float v : {1e8f, 1.0f, -1e8f, 1.0f}) want += v;
  EXPECT_EQ(y[0], ref::to_bf16(want));
}

TEST(SplitKCombine, Validation) {
  const Tensor y(fake_ptr(1), DType::bf16, {4, 64});
  EXPECT_TRUE(throws_naming([&] { combine_partials(Tensor(fake_ptr(2), DType::bf16, {2, 8, 64}), 2, y, nullptr); }, "y_partials"));
  EXPECT_TRUE(throws_naming([&] { combine_partials(Tensor(fake_ptr(2), DType::f32, {2, 9, 64}), 2, y, nullptr); }, "y_partials"));
  EXPECT_TRUE(throws_naming([&] { combine_partials(Tensor(fake_ptr(2), DType::f32, {9, 8, 64}), 2, y, nullptr); }, "y_partials"));
  EXPECT_TRUE(throws_naming([&] { combine_partials(Tensor(fake_ptr(2), DType::f32, {8, 64}), 2, y, nullptr); }, "y_partials"));
  EXPECT_TRUE(throws_naming([&] { combine_partials(Tensor(fake_ptr(2), DType::f32, {2, 8, 64}), 0, y, nullptr); }, "topk"));
  EXPECT_TRUE(throws_naming([&] { combine_partials(Tensor(fake_ptr(2), DType::f32, {2, 8, 64}), 2,
                                                   Tensor(fake_ptr(1), DType::f32, {4, 64}), nullptr); }, "y"));
}

// The multi-CTA align's scratch: carved exactly when T*k is past the one-CTA kernel's range.
TEST(AlignPlan, WorkspaceHoldsTheGridScratchOnlyWhenUsed) {
  const GemmConfig c = compiled_gemm_configs().front();
  for (int64_t T : {int64_t(1), kAlignGridMinAssignments / 2, kAlignGridMinAssignments / 2 + 1, int64_t(100000)}) {
    const ForwardPlan p = plan_forward_with({T, 256, 512, 64, 2}, c, c, 1);
    const Workspace ws = carve_workspace(p, fake_ptr(1), workspace_bytes(p));
    const bool grid = T * 2 > kAlignGridMinAssignments;
    ASSERT_EQ(ws.align_scratch.given(), grid) << "T=" << T;
    if (!grid) continue;
    EXPECT_EQ(ws.align_scratch.dim(0), kAlignMaxCtas);
    EXPECT_EQ(ws.align_scratch.dim(1), 65);
    const char* end = static_cast<const char*>(fake_ptr(1)) + workspace_bytes(p);
    EXPECT_LE(static_cast<const char*>(ws.align_scratch.data) + ws.align_scratch.bytes(), end);
    EXPECT_GE(static_cast<const char*>(ws.align_scratch.data), static_cast<const char*>(ws.y_rows.data) + ws.y_rows.bytes());
  }
}

}  // namespace
}  // namespace moekit::testing
