// validation_overflow_test.cpp — shapes whose products would wrap 64 (or 32) bits are refused
// before any product is formed: plan_forward / plan_forward_with, workspace_bytes / carve_workspace
// of a plan edited after planning, plan_backward / backward_workspace_bytes, and the stage
// validators (a tensor's own dims). Each rejection is a moekit::Error naming its argument and
// stating the bound; the limits themselves (kMaxLayoutRows, kMaxHidden, kMaxInter) are accepted.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "common/validate.hpp"
#include "cpu_test_util.hpp"
#include "moekit/backward.hpp"

namespace moekit::testing {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
const MoeShape kMixtral{1, 4096, 14336, 8, 2};

MoeShape with_tokens(MoeShape s, int64_t T) { s.tokens = T; return s; }

// The message of the moekit::Error `call` throws ("" if none).
template <class F>
std::string message_of(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The cases: T = 2^62 was accepted with a negative max_rows, T = 2^63 - 1 gave y_rows
// [-2, 4096]. Both are refused as 'shape.tokens', stating the 32-bit ids' bound.
TEST(ValidationOverflow, HugeTokenCountsAreRefused) {
  for (int64_t T : {int64_t(1) << 62, kInt64Max, int64_t(1) << 31, int64_t(1) << 40}) {
    const MoeShape s = with_tokens(kMixtral, T);
    EXPECT_TRUE(throws_naming([&] { plan_forward(s, kH200); }, "shape.tokens")) << "T = " << T;
    EXPECT_TRUE(throws_naming([&] { plan_forward_heuristic(s, kH200); }, "shape.tokens")) << "T = " << T;
    EXPECT_TRUE(throws_naming([&] { plan_forward(s, kH200, Precision::fp8); }, "shape.tokens")) << "T = " << T;
    const std::string m = message_of([&] { plan_forward(s, kH200); });
    EXPECT_NE(m.find(std::to_string(kMaxLayoutRows)), std::string::npos) << m;
  }
}

// The T·k message names the real limit: the worst-case layout's rows against the int32
// sorted_ids (not "T·k is too large"), with the largest T that fits.
TEST(ValidationOverflow, LayoutLimitIsNamedWithTheLargestTokenCount) {
  const std::string m = message_of([&] { plan_forward(with_tokens(kMixtral, int64_t(1) << 30), kH200); });
  EXPECT_NE(m.find("'shape.tokens'"), std::string::npos) << m;
  EXPECT_NE(m.find("worst-case layout"), std::string::npos) << m;
  EXPECT_NE(m.find("32-bit sorted_ids"), std::string::npos) << m;
  // The largest T: (2^31 - 128 - 8·127) / 2 for Mixtral's E 8, k 2; it plans, one more does not.
  const int64_t max_t = (kMaxLayoutRows / 128 * 128 - 8 * 127) / 2;
  EXPECT_NE(m.find("at most T = " + std::to_string(max_t)), std::string::npos) << m;
  const ForwardPlan at_limit = plan_forward(with_tokens(kMixtral, max_t), kH200);
  EXPECT_GT(at_limit.max_rows(), 0);
  EXPECT_LE(worst_case_rows(at_limit.shape, 128), kMaxLayoutRows);
  EXPECT_TRUE(throws_naming([&] { plan_forward(with_tokens(kMixtral, max_t + 1), kH200); }, "shape.tokens"));
}

TEST(ValidationOverflow, HiddenAndInterAreBounded) {
  for (int64_t big : {int64_t(1) << 60, kMaxHidden + 8, kInt64Max - 7}) {
    MoeShape h = kMixtral, f = kMixtral;
    h.hidden = big;
    f.inter = big;
    EXPECT_TRUE(throws_naming([&] { plan_forward(h, kH200); }, "shape.hidden")) << big;
    EXPECT_TRUE(throws_naming([&] { plan_forward(f, kH200); }, "shape.inter")) << big;
    EXPECT_NE(message_of([&] { plan_forward(h, kH200); }).find(std::to_string(kMaxHidden)), std::string::npos);
  }
  MoeShape at = kMixtral;
  at.hidden = kMaxHidden;
  at.inter = kMaxInter;
  const ForwardPlan p = plan_forward(at, kH200);
  EXPECT_GT(workspace_bytes(p), size_t(kMaxInter));  // act alone is max_rows·F·2 bytes
}

// The H = F = 2^60 plan (edited after plan_forward) sized its workspace at 3072 bytes:
// workspace_bytes and carve_workspace now check the plan first.
TEST(ValidationOverflow, EditedPlansAreRefusedBySizingAndCarving) {
  const ForwardPlan good = plan_forward(kMixtral, kH200);
  const size_t bytes = workspace_bytes(good);
  struct Edit {
    const char* what;
    void (*edit)(MoeShape&);
    const char* arg;
  };
  const Edit edits[] = {
      {"H = F = 2^60", [](MoeShape& s) { s.hidden = s.inter = int64_t(1) << 60; }, "shape.hidden"},
      {"F = 2^60", [](MoeShape& s) { s.inter = int64_t(1) << 60; }, "shape.inter"},
      {"T = 2^62", [](MoeShape& s) { s.tokens = int64_t(1) << 62; }, "shape.tokens"},
      {"T = 2^63 - 1", [](MoeShape& s) { s.tokens = kInt64Max; }, "shape.tokens"},
      {"T negative", [](MoeShape& s) { s.tokens = -1; }, "shape.tokens"},
      {"E = 2^40", [](MoeShape& s) { s.experts = int64_t(1) << 40; }, "shape.experts"},
      {"k = 2^40", [](MoeShape& s) { s.topk = int64_t(1) << 40; }, "shape.topk"},
  };
  for (const Edit& e : edits) {
    ForwardPlan p = good;
    e.edit(p.shape);
    EXPECT_TRUE(throws_naming([&] { workspace_bytes(p); }, e.arg)) << e.what;
    EXPECT_TRUE(throws_naming([&] { carve_workspace(p, fake_ptr(1), bytes); }, e.arg)) << e.what;
  }
  ForwardPlan no_block = good;
  no_block.up.block_m = no_block.down.block_m = 0;
  EXPECT_TRUE(throws_naming([&] { workspace_bytes(no_block); }, "plan"));
  EXPECT_EQ(worst_case_rows(with_tokens(kMixtral, kInt64Max), 128), kInt64Max);  // saturates, never wraps
  EXPECT_EQ(worst_case_rows(kMixtral, 0), kInt64Max);
}

TEST(ValidationOverflow, PlanWithRefusesHugeShapes) {
  const GemmConfig cfg = compiled_gemm_configs().front();
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(with_tokens(kMixtral, int64_t(1) << 62), cfg, cfg); },
                            "shape.tokens"));
  MoeShape s = kMixtral;
  s.hidden = s.inter = int64_t(1) << 60;
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, cfg, cfg); }, "shape.hidden"));
}

TEST(ValidationOverflow, BackwardPlanAndWorkspaceRefuseEditedShapes) {
  const ForwardPlan fwd = plan_forward(kMixtral, kH200);
  BackwardOptions all;
  all.weight_grads = true;
  all.router = RouterGrad::gate;
  const BackwardPlan good = plan_backward(fwd, kH200, all);
  EXPECT_GT(backward_workspace_bytes(good), 0u);
  ForwardPlan huge = fwd;
  huge.shape.tokens = int64_t(1) << 62;
  EXPECT_TRUE(throws_naming([&] { plan_backward(huge, kH200, all); }, "shape.tokens"));
  for (auto edit : {+[](MoeShape& s) { s.hidden = s.inter = int64_t(1) << 60; },
                    +[](MoeShape& s) { s.tokens = kInt64Max; }}) {
    BackwardPlan p = good;
    edit(p.shape);
    EXPECT_THROW(backward_workspace_bytes(p), Error);
    EXPECT_THROW(carve_backward_workspace(p, fake_ptr(1), size_t(1) << 40), Error);
  }
  // The largest shape the bounds allow sizes every backward piece (dW partials included) in 64 bits.
  MoeShape at{(kMaxLayoutRows / 128 * 128 - 512 * 127) / 16, kMaxHidden, kMaxInter, 512, 16};
  const BackwardPlan big = plan_backward(plan_forward(at, kH200), kH200, all);
  EXPECT_GT(backward_workspace_bytes(big), size_t(1) << 40);
}

// Stage validators: a tensor's own dims are checked before its bytes are formed, and the
// combine's T·k before it is compared.
TEST(ValidationOverflow, TensorDimsAndCombineProductsAreChecked) {
  const Tensor wrapped(fake_ptr(1), DType::bf16, {int64_t(1) << 62, 8});
  EXPECT_TRUE(throws_naming([&] { detail::expect_tensor("t", "x", wrapped, DType::bf16, {int64_t(1) << 62, 8}); }, "x"));
  const Tensor negative(fake_ptr(1), DType::bf16, {-2, 4096});
  EXPECT_TRUE(throws_naming([&] { detail::expect_tensor("t", "x", negative, DType::bf16, {-2, 4096}); }, "x"));
  const Tensor y(fake_ptr(1), DType::bf16, {int64_t(1) << 62, 0});
  const Tensor y_rows(fake_ptr(2), DType::bf16, {0, 0});  // (2^62 · 16) wrapped to 0
  EXPECT_TRUE(throws_naming([&] { combine(y_rows, 16, y, nullptr); }, "y"));
  const Tensor parts(fake_ptr(2), DType::f32, {2, 0, 0});
  EXPECT_TRUE(throws_naming([&] { combine_partials(parts, 16, y, nullptr); }, "y"));
  EXPECT_TRUE(throws_naming([&] { detail::checked_mul("e", "a", "a·b", kInt64Max, 2); }, "a"));
  EXPECT_TRUE(throws_naming([&] { detail::checked_add("e", "a", "a+b", kInt64Max, 1); }, "a"));
  EXPECT_EQ(detail::checked_mul("e", "a", "a·b", int64_t(1) << 31, int64_t(1) << 31), int64_t(1) << 62);
}

}  // namespace
}  // namespace moekit::testing
