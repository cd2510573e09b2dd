// validation_forward_test.cpp — the whole-layer entries (experts_forward, moe_forward) and the
// planning entries (plan_forward, carve_workspace) reject bad arguments with a moekit::Error
// that names the argument, before anything is launched.
#include <gtest/gtest.h>

#include <string>

#include "cpu_test_util.hpp"

namespace moekit::testing {
namespace {

constexpr int64_t kT = FakeLayerArgs::kT, kE = FakeLayerArgs::kE, kK = FakeLayerArgs::kK, kH = FakeLayerArgs::kH,
                  kF = FakeLayerArgs::kF;

// Every argument of the layer on fake pointers (FakeLayerArgs), and its two entries.
struct Layer : FakeLayerArgs {
  void experts() const {
    experts_forward(plan, in.x, in.w13, in.w2, topk_ids, topk_weights, y, workspace, bytes, nullptr);
  }
  void moe() const { moe_forward(plan, in, opt, y, workspace, bytes, nullptr); }
};

template <class Mutate>
BadCall bad_experts(std::string what, Mutate mutate, std::string arg) {
  Layer l;
  mutate(l);
  return {std::move(what), [l] { l.experts(); }, std::move(arg)};
}
template <class Mutate>
BadCall bad_moe(std::string what, Mutate mutate, std::string arg) {
  Layer l;
  mutate(l);
  return {std::move(what), [l] { l.moe(); }, std::move(arg)};
}

// The same shape and workspace cases for both whole-layer entries.
template <class Bad>
std::vector<BadCall> bad_shape_and_workspace(Bad bad) {
  return {
      bad("tokens < 0", [](Layer& l) { l.plan.shape.tokens = -1; }, "shape.tokens"),
      bad("hidden not a multiple of 8", [](Layer& l) { l.plan.shape.hidden = 260; }, "shape.hidden"),
      bad("inter not a multiple of 8", [](Layer& l) { l.plan.shape.inter = 130; }, "shape.inter"),
      bad("E > 512", [](Layer& l) { l.plan.shape.experts = 513; }, "shape.experts"),
      bad("k > 16", [](Layer& l) { l.plan.shape.topk = 17; }, "shape.topk"),
      bad("k > E", [](Layer& l) { l.plan.shape.experts = 3; }, "shape.topk"),
      bad("workspace null", [](Layer& l) { l.workspace = nullptr; }, "workspace"),
      bad("workspace 16- but not 256-byte aligned", [](Layer& l) { l.workspace = static_cast<char*>(l.workspace) + 16; }, "workspace"),
      bad("workspace one byte short", [](Layer& l) { l.bytes -= 1; }, "workspace_bytes"),
      bad("workspace size 0", [](Layer& l) { l.bytes = 0; }, "workspace_bytes"),
  };
}

TEST(ExpertsForwardValidation, ShapeAndWorkspace) {
  expect_all_rejected(bad_shape_and_workspace([](auto... a) { return bad_experts(a...); }));
}

TEST(ExpertsForwardValidation, Tensors) {
  expect_all_rejected({
      bad_experts("x f32", [](Layer& l) { l.in.x.dtype = DType::f32; }, "x"),
      bad_experts("x T+1 rows", [](Layer& l) { l.in.x = with_shape(l.in.x, {kT + 1, kH}); }, "x"),
      bad_experts("x not given", [](Layer& l) { l.in.x = Tensor{}; }, "x"),
      bad_experts("x null", [](Layer& l) { l.in.x = with_null_data(l.in.x); }, "x"),
      bad_experts("x misaligned", [](Layer& l) { l.in.x = misaligned(l.in.x); }, "x"),
      bad_experts("w13 f32", [](Layer& l) { l.in.w13.dtype = DType::f32; }, "w13"),
      bad_experts("w13 [E, F, H]", [](Layer& l) { l.in.w13 = with_shape(l.in.w13, {kE, kF, kH}); }, "w13"),
      bad_experts("w13 null", [](Layer& l) { l.in.w13 = with_null_data(l.in.w13); }, "w13"),
      bad_experts("w13 misaligned", [](Layer& l) { l.in.w13 = misaligned(l.in.w13); }, "w13"),
      bad_experts("w2 i32", [](Layer& l) { l.in.w2.dtype = DType::i32; }, "w2"),
      bad_experts("w2 [E, F, H]", [](Layer& l) { l.in.w2 = with_shape(l.in.w2, {kE, kF, kH}); }, "w2"),
      bad_experts("w2 null", [](Layer& l) { l.in.w2 = with_null_data(l.in.w2); }, "w2"),
      bad_experts("w2 misaligned", [](Layer& l) { l.in.w2 = misaligned(l.in.w2); }, "w2"),
      bad_experts("topk_ids f32", [](Layer& l) { l.topk_ids.dtype = DType::f32; }, "topk_ids"),
      bad_experts("topk_ids k+1", [](Layer& l) { l.topk_ids = with_shape(l.topk_ids, {kT, kK + 1}); }, "topk_ids"),
      bad_experts("topk_ids null", [](Layer& l) { l.topk_ids = with_null_data(l.topk_ids); }, "topk_ids"),
      bad_experts("topk_ids misaligned", [](Layer& l) { l.topk_ids = misaligned(l.topk_ids); }, "topk_ids"),
      bad_experts("topk_weights bf16", [](Layer& l) { l.topk_weights.dtype = DType::bf16; }, "topk_weights"),
      bad_experts("topk_weights T-1 rows", [](Layer& l) { l.topk_weights = with_shape(l.topk_weights, {kT - 1, kK}); }, "topk_weights"),
      bad_experts("topk_weights null", [](Layer& l) { l.topk_weights = with_null_data(l.topk_weights); }, "topk_weights"),
      bad_experts("topk_weights misaligned", [](Layer& l) { l.topk_weights = misaligned(l.topk_weights); }, "topk_weights"),
      bad_experts("y f32", [](Layer& l) { l.y.dtype = DType::f32; }, "y"),
      bad_experts("y wrong hidden", [](Layer& l) { l.y = with_shape(l.y, {kT, kH + 8}); }, "y"),
      bad_experts("y not given", [](Layer& l) { l.y = Tensor{}; }, "y"),
      bad_experts("y null", [](Layer& l) { l.y = with_null_data(l.y); }, "y"),
      bad_experts("y misaligned", [](Layer& l) { l.y = misaligned(l.y); }, "y"),
  });
}

TEST(ExpertsForwardValidation, WorkspaceErrorsSayWorkspace) {
  // The workspace is checked by carve_workspace, whose messages name its own parameters ('base',
  // 'bytes'); they must still say it is the workspace that is wrong.
  Layer l;
  l.workspace = nullptr;
  try {
    l.experts();
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
  }
}

TEST(MoeForwardValidation, ShapeAndWorkspace) {
  expect_all_rejected(bad_shape_and_workspace([](auto... a) { return bad_moe(a...); }));
}

TEST(MoeForwardValidation, RouterInputs) {
  auto logits = [](Layer& l) {
    l.in.w_gate = Tensor{};
    l.in.router_logits = Tensor(fake_ptr(11), DType::f32, {kT, kE});
  };
  expect_all_rejected({
      bad_moe("x f32", [](Layer& l) { l.in.x.dtype = DType::f32; }, "x"),
      bad_moe("x wrong hidden", [](Layer& l) { l.in.x = with_shape(l.in.x, {kT, kH + 8}); }, "x"),
      bad_moe("x not given", [](Layer& l) { l.in.x = Tensor{}; }, "x"),
      bad_moe("x null", [](Layer& l) { l.in.x = with_null_data(l.in.x); }, "x"),
      bad_moe("x misaligned", [](Layer& l) { l.in.x = misaligned(l.in.x); }, "x"),
      bad_moe("w_gate i32", [](Layer& l) { l.in.w_gate.dtype = DType::i32; }, "w_gate"),
      bad_moe("w_gate E+1 rows", [](Layer& l) { l.in.w_gate = with_shape(l.in.w_gate, {kE + 1, kH}); }, "w_gate"),
      bad_moe("w_gate wrong hidden", [](Layer& l) { l.in.w_gate = with_shape(l.in.w_gate, {kE, kH + 8}); }, "w_gate"),
      bad_moe("w_gate null", [](Layer& l) { l.in.w_gate = with_null_data(l.in.w_gate); }, "w_gate"),
      bad_moe("w_gate misaligned", [](Layer& l) { l.in.w_gate = misaligned(l.in.w_gate); }, "w_gate"),
      bad_moe("neither router_logits nor w_gate", [](Layer& l) { l.in.w_gate = Tensor{}; }, "w_gate"),
      bad_moe("router_logits bf16", [&](Layer& l) { logits(l); l.in.router_logits.dtype = DType::bf16; }, "router_logits"),
      bad_moe("router_logits E+1 columns", [&](Layer& l) { logits(l); l.in.router_logits = with_shape(l.in.router_logits, {kT, kE + 1}); }, "router_logits"),
      bad_moe("router_logits null", [&](Layer& l) { logits(l); l.in.router_logits = with_null_data(l.in.router_logits); }, "router_logits"),
      bad_moe("router_logits misaligned", [&](Layer& l) { logits(l); l.in.router_logits = misaligned(l.in.router_logits); }, "router_logits"),
      // Checked by route(), which validates everything before its launch.
      bad_moe("score_bias E+1", [](Layer& l) { l.in.score_bias = with_shape(l.in.score_bias, {kE + 1}); }, "score_bias"),
      bad_moe("score_bias bf16", [](Layer& l) { l.in.score_bias.dtype = DType::bf16; }, "score_bias"),
      bad_moe("n_group does not divide E", [](Layer& l) { l.opt.n_group = 3; l.opt.topk_group = 1; }, "opt.n_group"),
      bad_moe("topk_group > n_group", [](Layer& l) { l.opt.n_group = 4; l.opt.topk_group = 5; }, "opt.topk_group"),
  });
}

TEST(MoeForwardValidation, ExpertWeightsAndOutputBeforeAnyLaunch) {
  expect_all_rejected({
      bad_moe("w13 f32", [](Layer& l) { l.in.w13.dtype = DType::f32; }, "w13"),
      bad_moe("w13 [E, F, H]", [](Layer& l) { l.in.w13 = with_shape(l.in.w13, {kE, kF, kH}); }, "w13"),
      bad_moe("w2 null", [](Layer& l) { l.in.w2 = with_null_data(l.in.w2); }, "w2"),
      bad_moe("w2 misaligned", [](Layer& l) { l.in.w2 = misaligned(l.in.w2); }, "w2"),
      bad_moe("y f32", [](Layer& l) { l.y.dtype = DType::f32; }, "y"),
      bad_moe("y T+1 rows", [](Layer& l) { l.y = with_shape(l.y, {kT + 1, kH}); }, "y"),
  });
}

TEST(ExpertsForwardValidation, PlanThatNoLongerFitsItsShape) {
  Layer l;
  l.plan.shape.tokens = 4096;  // reserved rows are those of T = 8
  l.bytes = workspace_bytes(l.plan);
  l.in.x = with_shape(l.in.x, {4096, kH});
  l.topk_ids = with_shape(l.topk_ids, {4096, kK});
  l.topk_weights = with_shape(l.topk_weights, {4096, kK});
  l.y = with_shape(l.y, {4096, kH});
  EXPECT_TRUE(throws_naming([&] { l.experts(); }, "plan"));
}

// ---- the training forward (ForwardPlan::save_h) ----------------------------------------------

// h [max_rows, 2F] bf16 is required with save_h and refused without it, in each entry that runs the
// up GEMM; it may alias nothing; an fp8 plan cannot save it.
struct TrainingLayer : Layer {
  Tensor h;
  TrainingLayer() {
    plan.save_h = true;
    h = Tensor(fake_ptr(11), DType::bf16, {plan.max_rows(), 2 * kF});
  }
  void experts() const {
    experts_forward(plan, in.x, in.w13, in.w2, topk_ids, topk_weights, y, workspace, bytes, nullptr, Tensor(), h);
  }
  void moe() const { moe_forward(plan, in, opt, y, workspace, bytes, nullptr, Tensor(), h); }
  void up() const { expert_up(plan, in.x, in.w13, carve_workspace(plan, workspace, bytes), nullptr, Tensor(), h); }
};

TEST(TrainingForwardValidation, SavedH) {
  using Mutate = void (*)(TrainingLayer&);
  const std::pair<const char*, Mutate> bad[] = {
      {"save_h without h", [](TrainingLayer& l) { l.h = Tensor(); }},
      {"h f32", [](TrainingLayer& l) { l.h.dtype = DType::f32; }},
      {"h one row short", [](TrainingLayer& l) { l.h = with_shape(l.h, {l.plan.max_rows() - 1, 2 * kF}); }},
      {"h F columns", [](TrainingLayer& l) { l.h = with_shape(l.h, {l.plan.max_rows(), kF}); }},
      {"h null", [](TrainingLayer& l) { l.h = with_null_data(l.h); }},
      {"h over y", [](TrainingLayer& l) { l.h.data = l.y.data; }},
      {"h over x", [](TrainingLayer& l) { l.h.data = l.in.x.data; }},
      {"h inside the workspace", [](TrainingLayer& l) { l.h.data = static_cast<char*>(l.workspace) + 256; }},
      {"h without save_h", [](TrainingLayer& l) { l.plan.save_h = false; }},
  };
  for (const auto& [what, mutate] : bad) {
    TrainingLayer l;
    mutate(l);
    EXPECT_TRUE(throws_naming([&] { l.experts(); }, "h")) << "experts_forward, case: " << what;
    EXPECT_TRUE(throws_naming([&] { l.moe(); }, "h")) << "moe_forward, case: " << what;
    if (std::string(what) != "h over y")  // expert_up takes no y
      EXPECT_TRUE(throws_naming([&] { l.up(); }, "h")) << "expert_up, case: " << what;
  }
  TrainingLayer fp8;
  fp8.plan = plan_forward(MoeShape{kT, kH, kF, kE, kK}, kH200, Precision::fp8);
  fp8.plan.save_h = true;
  EXPECT_TRUE(throws_naming([&] { fp8.moe(); }, "plan")) << "an fp8 plan has no bf16 backward to keep h for";
}

// ---- plan_forward ---------------------------------------------------------------------------

TEST(PlanForwardValidation, Shape) {
  auto bad = [](std::string what, MoeShape s, std::string arg) {
    return BadCall{std::move(what), [s] { plan_forward(s, kH200); }, std::move(arg)};
  };
  const MoeShape ok{kT, kH, kF, kE, kK};
  auto with = [&](auto set) { MoeShape s = ok; set(s); return s; };
  EXPECT_NO_THROW(plan_forward(ok, kH200));
  expect_all_rejected({
      bad("tokens < 0", with([](MoeShape& s) { s.tokens = -1; }), "shape.tokens"),
      bad("T*k overflows int32 ids", with([](MoeShape& s) { s.tokens = int64_t(1) << 29; }), "shape.tokens"),
      bad("hidden 0", with([](MoeShape& s) { s.hidden = 0; }), "shape.hidden"),
      bad("hidden negative", with([](MoeShape& s) { s.hidden = -8; }), "shape.hidden"),
      bad("hidden not a multiple of 8", with([](MoeShape& s) { s.hidden = 4100; }), "shape.hidden"),
      bad("inter 0", with([](MoeShape& s) { s.inter = 0; }), "shape.inter"),
      bad("inter not a multiple of 8", with([](MoeShape& s) { s.inter = 14337; }), "shape.inter"),
      bad("E 0", with([](MoeShape& s) { s.experts = 0; }), "shape.experts"),
      bad("E > 512", with([](MoeShape& s) { s.experts = 513; }), "shape.experts"),
      bad("k 0", with([](MoeShape& s) { s.topk = 0; }), "shape.topk"),
      bad("k > 16", with([](MoeShape& s) { s.topk = 17; s.experts = 64; }), "shape.topk"),
      bad("k > E", with([](MoeShape& s) { s.topk = 9; s.experts = 8; }), "shape.topk"),
  });
  // The limits themselves are valid.
  EXPECT_NO_THROW(plan_forward(MoeShape{1, 8, 8, kMaxExperts, kMaxTopk}, kH200));
  EXPECT_NO_THROW(plan_forward(MoeShape{1, 8, 8, 1, 1}, kH200));
}

TEST(CarveWorkspaceValidation, BadBuffers) {
  const ForwardPlan plan = plan_forward(MoeShape{kT, kH, kF, kE, kK}, kH200);
  const size_t bytes = workspace_bytes(plan);
  expect_all_rejected({
      {"null", [&] { carve_workspace(plan, nullptr, bytes); }, "base"},
      {"8-byte aligned", [&] { carve_workspace(plan, static_cast<char*>(fake_ptr(1)) + 8, bytes); }, "base"},
      {"16-byte aligned", [&] { carve_workspace(plan, static_cast<char*>(fake_ptr(1)) + 16, bytes); }, "base"},
      {"one byte short", [&] { carve_workspace(plan, fake_ptr(1), bytes - 1); }, "bytes"},
  });
}

}  // namespace
}  // namespace moekit::testing
