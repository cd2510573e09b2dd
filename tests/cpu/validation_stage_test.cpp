// validation_stage_test.cpp — every stage entry (route, align, expert_up, expert_down, combine,
// check_status) rejects bad arguments with a moekit::Error that names the argument.
//
// Each case starts from a valid call on fake, aligned device pointers and breaks one thing; the
// check throws before any kernel launch, so no GPU is needed. The valid starting points are
// themselves checked where an entry returns before launching (T = 0).
#include <gtest/gtest.h>

#include "cpu_test_util.hpp"

namespace moekit::testing {
namespace {

// ---- route ----------------------------------------------------------------------------------

struct RouteCall {
  Tensor x, w_gate, logits, score_bias, topk_ids, topk_weights, logits_scratch;
  RouterOptions opt;
  void operator()() const {
    route(x, w_gate, logits, score_bias, opt, topk_ids, topk_weights, nullptr, logits_scratch);
  }
};

// Scores from x [T, H] · w_gate [E, H]ᵀ (through logits_scratch [T, E]), with a score bias.
RouteCall valid_route(int64_t T, int64_t E = 64, int64_t k = 8, int64_t H = 256) {
  RouteCall c;
  c.x = Tensor(fake_ptr(1), DType::bf16, {T, H});
  c.w_gate = Tensor(fake_ptr(2), DType::bf16, {E, H});
  c.score_bias = Tensor(fake_ptr(4), DType::f32, {E});
  c.topk_ids = Tensor(fake_ptr(5), DType::i32, {T, k});
  c.topk_weights = Tensor(fake_ptr(6), DType::f32, {T, k});
  c.logits_scratch = Tensor(fake_ptr(7), DType::f32, {T, E});
  return c;
}
// Scores from logits [T, E] given by the caller.
RouteCall valid_route_logits(int64_t T, int64_t E = 64, int64_t k = 8) {
  RouteCall c = valid_route(T, E, k);
  c.x = c.w_gate = Tensor{};
  c.logits = Tensor(fake_ptr(3), DType::f32, {T, E});
  return c;
}

template <class Mutate>
BadCall bad_route(std::string what, Mutate mutate, std::string arg, bool logits = false) {
  RouteCall c = logits ? valid_route_logits(4) : valid_route(4);
  mutate(c);
  return {std::move(what), [c] { c(); }, std::move(arg)};
}

TEST(RouteValidation, ValidStartingPointsPass) {
  // T = 0 is valid and returns before launching: these are the calls the cases below break.
  EXPECT_NO_THROW(valid_route(0)());
  EXPECT_NO_THROW(valid_route_logits(0)());
  RouteCall f32_gate = valid_route(0);
  f32_gate.w_gate.dtype = DType::f32;
  EXPECT_NO_THROW(f32_gate());
  RouteCall deepseek = valid_route(0, 256, 8, 7168);
  deepseek.opt = RouterOptions{Scoring::sigmoid, true, 8, 4, 2.5f};
  EXPECT_NO_THROW(deepseek());
  RouteCall no_bias = valid_route(0, 512, 16);
  no_bias.score_bias = Tensor{};
  EXPECT_NO_THROW(no_bias());
  RouteCall no_scratch = valid_route(0);
  no_scratch.logits_scratch = Tensor{};  // optional: the logits are then computed per token
  EXPECT_NO_THROW(no_scratch());
}

TEST(RouteValidation, InputsAndGateWeights) {
  expect_all_rejected({
      bad_route("x f32", [](RouteCall& c) { c.x.dtype = DType::f32; }, "x"),
      bad_route("x wrong hidden", [](RouteCall& c) { c.x = with_shape(c.x, {4, 264}); }, "x"),
      bad_route("x rows != topk_ids rows", [](RouteCall& c) { c.x = with_shape(c.x, {5, 256}); }, "x"),
      bad_route("x rank 3", [](RouteCall& c) { c.x = with_shape(c.x, {4, 256, 1}); }, "x"),
      bad_route("x not given", [](RouteCall& c) { c.x = Tensor{}; }, "x"),
      bad_route("x null", [](RouteCall& c) { c.x = with_null_data(c.x); }, "x"),
      bad_route("x misaligned", [](RouteCall& c) { c.x = misaligned(c.x); }, "x"),
      bad_route("w_gate i32", [](RouteCall& c) { c.w_gate.dtype = DType::i32; }, "w_gate"),
      bad_route("w_gate rank 3", [](RouteCall& c) { c.w_gate = with_shape(c.w_gate, {64, 256, 1}); }, "w_gate"),
      bad_route("w_gate rank 1", [](RouteCall& c) { c.w_gate = with_shape(c.w_gate, {64}); }, "w_gate"),
      bad_route("hidden not a multiple of 8",
                [](RouteCall& c) {
                  c.w_gate = with_shape(c.w_gate, {64, 100});
                  c.x = with_shape(c.x, {4, 100});
                },
                "w_gate"),
      bad_route("w_gate null", [](RouteCall& c) { c.w_gate = with_null_data(c.w_gate); }, "w_gate"),
      bad_route("w_gate misaligned", [](RouteCall& c) { c.w_gate = misaligned(c.w_gate); }, "w_gate"),
      bad_route("neither logits nor w_gate", [](RouteCall& c) { c.w_gate = Tensor{}; }, "w_gate"),
      bad_route("logits_scratch bf16", [](RouteCall& c) { c.logits_scratch.dtype = DType::bf16; }, "logits_scratch"),
      bad_route("logits_scratch [E, T]", [](RouteCall& c) { c.logits_scratch = with_shape(c.logits_scratch, {64, 4}); }, "logits_scratch"),
      bad_route("logits_scratch rank 0 with data", [](RouteCall& c) { c.logits_scratch = with_shape(c.logits_scratch, {}); }, "logits_scratch"),
      bad_route("logits_scratch null", [](RouteCall& c) { c.logits_scratch = with_null_data(c.logits_scratch); }, "logits_scratch"),
      bad_route("logits_scratch misaligned", [](RouteCall& c) { c.logits_scratch = misaligned(c.logits_scratch); }, "logits_scratch"),
  });
}

TEST(RouteValidation, Logits) {
  expect_all_rejected({
      bad_route("logits bf16", [](RouteCall& c) { c.logits.dtype = DType::bf16; }, "logits", true),
      bad_route("logits rows != T", [](RouteCall& c) { c.logits = with_shape(c.logits, {5, 64}); }, "logits", true),
      bad_route("logits rank 1", [](RouteCall& c) { c.logits = with_shape(c.logits, {256}); }, "logits", true),
      bad_route("logits null", [](RouteCall& c) { c.logits = with_null_data(c.logits); }, "logits", true),
      bad_route("logits misaligned", [](RouteCall& c) { c.logits = misaligned(c.logits); }, "logits", true),
  });
}

TEST(RouteValidation, ExpertAndTopkLimits) {
  auto experts = [](int64_t E) {
    return [E](RouteCall& c) {
      c.w_gate = with_shape(c.w_gate, {E, 256});
      c.score_bias = with_shape(c.score_bias, {E});
    };
  };
  auto topk = [](int64_t k) {
    return [k](RouteCall& c) {
      c.topk_ids = with_shape(c.topk_ids, {4, k});
      c.topk_weights = with_shape(c.topk_weights, {4, k});
    };
  };
  expect_all_rejected({
      bad_route("E > 512 (w_gate)", experts(513), "w_gate"),
      bad_route("E = 0 (w_gate)", experts(0), "w_gate"),
      bad_route("E > 512 (logits)",
                [](RouteCall& c) {
                  c.logits = with_shape(c.logits, {4, 513});
                  c.score_bias = Tensor{};
                },
                "logits", true),
      bad_route("k > 16", topk(17), "topk_ids"),
      bad_route("k = 0", topk(0), "topk_ids"),
      bad_route("k > E", [&](RouteCall& c) { experts(8)(c); topk(9)(c); }, "topk_ids"),
      bad_route("k > E (logits)", [](RouteCall& c) {
                  c.logits = with_shape(c.logits, {4, 4});
                  c.score_bias = Tensor{};
                }, "topk_ids", true),
  });
}

TEST(RouteValidation, Outputs) {
  expect_all_rejected({
      bad_route("topk_ids f32", [](RouteCall& c) { c.topk_ids.dtype = DType::f32; }, "topk_ids"),
      bad_route("topk_ids rank 1", [](RouteCall& c) { c.topk_ids = with_shape(c.topk_ids, {32}); }, "topk_ids"),
      bad_route("topk_ids not given", [](RouteCall& c) { c.topk_ids = Tensor{}; }, "topk_ids"),
      bad_route("topk_ids null", [](RouteCall& c) { c.topk_ids = with_null_data(c.topk_ids); }, "topk_ids"),
      bad_route("topk_ids misaligned", [](RouteCall& c) { c.topk_ids = misaligned(c.topk_ids); }, "topk_ids"),
      bad_route("topk_weights bf16", [](RouteCall& c) { c.topk_weights.dtype = DType::bf16; }, "topk_weights"),
      bad_route("topk_weights k+1 columns", [](RouteCall& c) { c.topk_weights = with_shape(c.topk_weights, {4, 9}); }, "topk_weights"),
      bad_route("topk_weights T+1 rows", [](RouteCall& c) { c.topk_weights = with_shape(c.topk_weights, {5, 8}); }, "topk_weights"),
      bad_route("topk_weights not given", [](RouteCall& c) { c.topk_weights = Tensor{}; }, "topk_weights"),
      bad_route("topk_weights null", [](RouteCall& c) { c.topk_weights = with_null_data(c.topk_weights); }, "topk_weights"),
      bad_route("topk_weights misaligned", [](RouteCall& c) { c.topk_weights = misaligned(c.topk_weights); }, "topk_weights"),
  });
}

TEST(RouteValidation, ScoreBiasAndOptions) {
  auto groups = [](int64_t n_group, int64_t topk_group) {
    return [=](RouteCall& c) {
      c.opt.n_group = n_group;
      c.opt.topk_group = topk_group;
    };
  };
  expect_all_rejected({
      bad_route("score_bias E+1", [](RouteCall& c) { c.score_bias = with_shape(c.score_bias, {65}); }, "score_bias"),
      bad_route("score_bias [1, E]", [](RouteCall& c) { c.score_bias = with_shape(c.score_bias, {1, 64}); }, "score_bias"),
      bad_route("score_bias rank 0 with data", [](RouteCall& c) { c.score_bias = with_shape(c.score_bias, {}); }, "score_bias"),
      bad_route("score_bias bf16", [](RouteCall& c) { c.score_bias.dtype = DType::bf16; }, "score_bias"),
      bad_route("score_bias null", [](RouteCall& c) { c.score_bias = with_null_data(c.score_bias); }, "score_bias"),
      bad_route("score_bias misaligned", [](RouteCall& c) { c.score_bias = misaligned(c.score_bias); }, "score_bias"),
      bad_route("n_group < 0", groups(-1, 1), "opt.n_group"),
      bad_route("n_group > 32", groups(64, 4), "opt.n_group"),
      bad_route("n_group does not divide E", groups(6, 2), "opt.n_group"),
      bad_route("topk_group > n_group", groups(8, 9), "opt.topk_group"),
      bad_route("topk_group 0", groups(8, 0), "opt.topk_group"),
      bad_route("kept groups hold fewer than k experts", groups(16, 1), "opt.topk_group"),  // 4 < 8
  });
}

// ---- plan-based stages ----------------------------------------------------------------------

// A plan, a carved workspace and every tensor of the layer, all on fake pointers.
struct Stage {
  ForwardPlan plan;
  Workspace ws;
  Tensor x, w13, w2, topk_ids, topk_weights;
};
Stage valid_stage(int64_t T, int64_t E = 16, int64_t k = 4, int64_t H = 256, int64_t F = 128) {
  Stage s;
  s.plan = plan_forward(MoeShape{T, H, F, E, k}, kH200);
  s.ws = carve_workspace(s.plan, fake_ptr(8), workspace_bytes(s.plan));
  s.x = Tensor(fake_ptr(1), DType::bf16, {T, H});
  s.w13 = Tensor(fake_ptr(2), DType::bf16, {E, 2 * F, H});
  s.w2 = Tensor(fake_ptr(3), DType::bf16, {E, H, F});
  s.topk_ids = Tensor(fake_ptr(4), DType::i32, {T, k});
  s.topk_weights = Tensor(fake_ptr(5), DType::f32, {T, k});
  return s;
}

enum class Entry { align, expert_up, expert_down };
void call(Entry entry, const Stage& s) {
  switch (entry) {
    case Entry::align: align(s.plan, s.topk_ids, s.ws, nullptr); break;
    case Entry::expert_up: expert_up(s.plan, s.x, s.w13, s.ws, nullptr); break;
    case Entry::expert_down: expert_down(s.plan, s.w2, s.topk_weights, s.ws, nullptr); break;
  }
}
template <class Mutate>
BadCall bad_stage(Entry entry, std::string what, Mutate mutate, std::string arg) {
  Stage s = valid_stage(8);
  mutate(s);
  return {std::move(what), [entry, s] { call(entry, s); }, std::move(arg)};
}

// The shape checks every plan-based entry runs (through the plan it is given).
std::vector<BadCall> bad_shapes(Entry entry) {
  return {
      bad_stage(entry, "tokens < 0", [](Stage& s) { s.plan.shape.tokens = -1; }, "shape.tokens"),
      bad_stage(entry, "hidden not a multiple of 8", [](Stage& s) { s.plan.shape.hidden = 12; }, "shape.hidden"),
      bad_stage(entry, "hidden 0", [](Stage& s) { s.plan.shape.hidden = 0; }, "shape.hidden"),
      bad_stage(entry, "inter not a multiple of 8", [](Stage& s) { s.plan.shape.inter = 100; }, "shape.inter"),
      bad_stage(entry, "E > 512", [](Stage& s) { s.plan.shape.experts = 513; }, "shape.experts"),
      bad_stage(entry, "E = 0", [](Stage& s) { s.plan.shape.experts = 0; }, "shape.experts"),
      bad_stage(entry, "k > 16", [](Stage& s) { s.plan.shape.topk = 17; }, "shape.topk"),
      bad_stage(entry, "k = 0", [](Stage& s) { s.plan.shape.topk = 0; }, "shape.topk"),
      bad_stage(entry, "k > E", [](Stage& s) { s.plan.shape.experts = 2; }, "shape.topk"),
  };
}

// Bad routing-layout buffers, which every plan-based entry checks.
std::vector<BadCall> bad_layout_buffers(Entry entry) {
  return {
      bad_stage(entry, "sorted_ids too short", [](Stage& s) { s.ws.sorted_ids = with_shape(s.ws.sorted_ids, {s.plan.max_rows() - 1}); }, "ws.sorted_ids"),
      bad_stage(entry, "sorted_ids f32", [](Stage& s) { s.ws.sorted_ids.dtype = DType::f32; }, "ws.sorted_ids"),
      bad_stage(entry, "sorted_ids null", [](Stage& s) { s.ws.sorted_ids = with_null_data(s.ws.sorted_ids); }, "ws.sorted_ids"),
      bad_stage(entry, "sorted_ids misaligned", [](Stage& s) { s.ws.sorted_ids = misaligned(s.ws.sorted_ids); }, "ws.sorted_ids"),
      bad_stage(entry, "block_expert too long", [](Stage& s) { s.ws.block_expert = with_shape(s.ws.block_expert, {s.plan.max_blocks() + 1}); }, "ws.block_expert"),
      bad_stage(entry, "block_expert null", [](Stage& s) { s.ws.block_expert = with_null_data(s.ws.block_expert); }, "ws.block_expert"),
      bad_stage(entry, "num_rows_padded [2]", [](Stage& s) { s.ws.num_rows_padded = with_shape(s.ws.num_rows_padded, {2}); }, "ws.num_rows_padded"),
      bad_stage(entry, "num_rows_padded misaligned", [](Stage& s) { s.ws.num_rows_padded = misaligned(s.ws.num_rows_padded); }, "ws.num_rows_padded"),
      bad_stage(entry, "expert_counts E-1", [](Stage& s) { s.ws.expert_counts = with_shape(s.ws.expert_counts, {15}); }, "ws.expert_counts"),
      bad_stage(entry, "status f32", [](Stage& s) { s.ws.status.dtype = DType::f32; }, "ws.status"),
      bad_stage(entry, "status not given", [](Stage& s) { s.ws.status = Tensor{}; }, "ws.status"),
  };
}

TEST(AlignValidation, Shape) { expect_all_rejected(bad_shapes(Entry::align)); }
TEST(AlignValidation, LayoutBuffers) { expect_all_rejected(bad_layout_buffers(Entry::align)); }
TEST(AlignValidation, TopkIds) {
  const Entry e = Entry::align;
  expect_all_rejected({
      bad_stage(e, "topk_ids f32", [](Stage& s) { s.topk_ids.dtype = DType::f32; }, "topk_ids"),
      bad_stage(e, "topk_ids k+1 columns", [](Stage& s) { s.topk_ids = with_shape(s.topk_ids, {8, 5}); }, "topk_ids"),
      bad_stage(e, "topk_ids T+1 rows", [](Stage& s) { s.topk_ids = with_shape(s.topk_ids, {9, 4}); }, "topk_ids"),
      bad_stage(e, "topk_ids flat", [](Stage& s) { s.topk_ids = with_shape(s.topk_ids, {32}); }, "topk_ids"),
      bad_stage(e, "topk_ids not given", [](Stage& s) { s.topk_ids = Tensor{}; }, "topk_ids"),
      bad_stage(e, "topk_ids null", [](Stage& s) { s.topk_ids = with_null_data(s.topk_ids); }, "topk_ids"),
      bad_stage(e, "topk_ids misaligned", [](Stage& s) { s.topk_ids = misaligned(s.topk_ids); }, "topk_ids"),
  });
}

// Past kAlignGridMinAssignments align runs its multi-CTA kernel, which needs ws.align_scratch.
TEST(AlignValidation, GridScratch) {
  const int64_t T = kAlignGridMinAssignments / 4 + 1;  // k = 4: one assignment past the switch
  auto bad = [T](std::string what, auto mutate) {
    Stage s = valid_stage(T);
    mutate(s);
    return BadCall{std::move(what), [s] { call(Entry::align, s); }, "ws.align_scratch"};
  };
  expect_all_rejected({
      bad("not given", [](Stage& s) { s.ws.align_scratch = Tensor{}; }),
      bad("one row short", [](Stage& s) { s.ws.align_scratch = with_shape(s.ws.align_scratch, {kAlignMaxCtas - 1, 17}); }),
      bad("f32", [](Stage& s) { s.ws.align_scratch.dtype = DType::f32; }),
      bad("null", [](Stage& s) { s.ws.align_scratch = with_null_data(s.ws.align_scratch); }),
  });
  // At or below the switch the one-CTA kernel needs none.
  Stage s = valid_stage(kAlignGridMinAssignments / 4);
  EXPECT_FALSE(s.ws.align_scratch.given());
}

TEST(ExpertUpValidation, ValidStartingPointPasses) {
  EXPECT_NO_THROW(call(Entry::expert_up, valid_stage(0)));  // T = 0 returns before launching
}
TEST(ExpertUpValidation, Shape) { expect_all_rejected(bad_shapes(Entry::expert_up)); }
TEST(ExpertUpValidation, LayoutBuffers) { expect_all_rejected(bad_layout_buffers(Entry::expert_up)); }
// The GEMMs (not align) also take the wgmma kernel's work counter.
std::vector<BadCall> bad_gemm_counter(Entry e) {
  return {
      bad_stage(e, "gemm_counter not given", [](Stage& s) { s.ws.gemm_counter = Tensor{}; }, "ws.gemm_counter"),
      bad_stage(e, "gemm_counter [2]", [](Stage& s) { s.ws.gemm_counter = with_shape(s.ws.gemm_counter, {2}); }, "ws.gemm_counter"),
      bad_stage(e, "gemm_counter f32", [](Stage& s) { s.ws.gemm_counter.dtype = DType::f32; }, "ws.gemm_counter"),
  };
}
TEST(ExpertUpValidation, GemmCounter) { expect_all_rejected(bad_gemm_counter(Entry::expert_up)); }
TEST(ExpertDownValidation, GemmCounter) { expect_all_rejected(bad_gemm_counter(Entry::expert_down)); }
TEST(ExpertUpValidation, Operands) {
  const Entry e = Entry::expert_up;
  expect_all_rejected({
      bad_stage(e, "x f32", [](Stage& s) { s.x.dtype = DType::f32; }, "x"),
      bad_stage(e, "x wrong hidden", [](Stage& s) { s.x = with_shape(s.x, {8, 264}); }, "x"),
      bad_stage(e, "x null", [](Stage& s) { s.x = with_null_data(s.x); }, "x"),
      bad_stage(e, "x misaligned", [](Stage& s) { s.x = misaligned(s.x); }, "x"),
      bad_stage(e, "w13 f32", [](Stage& s) { s.w13.dtype = DType::f32; }, "w13"),
      bad_stage(e, "w13 without the up half", [](Stage& s) { s.w13 = with_shape(s.w13, {16, 128, 256}); }, "w13"),
      bad_stage(e, "w13 E+1 experts", [](Stage& s) { s.w13 = with_shape(s.w13, {17, 256, 256}); }, "w13"),
      bad_stage(e, "w13 null", [](Stage& s) { s.w13 = with_null_data(s.w13); }, "w13"),
      bad_stage(e, "w13 misaligned", [](Stage& s) { s.w13 = misaligned(s.w13); }, "w13"),
      bad_stage(e, "act wrong F", [](Stage& s) { s.ws.act = with_shape(s.ws.act, {s.plan.max_rows(), 136}); }, "ws.act"),
      bad_stage(e, "act f32", [](Stage& s) { s.ws.act.dtype = DType::f32; }, "ws.act"),
      bad_stage(e, "y_rows T*k-1 rows", [](Stage& s) { s.ws.y_rows = with_shape(s.ws.y_rows, {31, 256}); }, "ws.y_rows"),
  });
}

TEST(ExpertDownValidation, ValidStartingPointPasses) {
  EXPECT_NO_THROW(call(Entry::expert_down, valid_stage(0)));  // T = 0 returns before launching
}
TEST(ExpertDownValidation, Shape) { expect_all_rejected(bad_shapes(Entry::expert_down)); }
TEST(ExpertDownValidation, LayoutBuffers) { expect_all_rejected(bad_layout_buffers(Entry::expert_down)); }
TEST(ExpertDownValidation, Operands) {
  const Entry e = Entry::expert_down;
  expect_all_rejected({
      bad_stage(e, "w2 f32", [](Stage& s) { s.w2.dtype = DType::f32; }, "w2"),
      bad_stage(e, "w2 transposed [E, F, H]", [](Stage& s) { s.w2 = with_shape(s.w2, {16, 128, 256}); }, "w2"),
      bad_stage(e, "w2 null", [](Stage& s) { s.w2 = with_null_data(s.w2); }, "w2"),
      bad_stage(e, "w2 misaligned", [](Stage& s) { s.w2 = misaligned(s.w2); }, "w2"),
      bad_stage(e, "topk_weights bf16", [](Stage& s) { s.topk_weights.dtype = DType::bf16; }, "topk_weights"),
      bad_stage(e, "topk_weights k+1", [](Stage& s) { s.topk_weights = with_shape(s.topk_weights, {8, 5}); }, "topk_weights"),
      bad_stage(e, "topk_weights null", [](Stage& s) { s.topk_weights = with_null_data(s.topk_weights); }, "topk_weights"),
      bad_stage(e, "topk_weights misaligned", [](Stage& s) { s.topk_weights = misaligned(s.topk_weights); }, "topk_weights"),
      bad_stage(e, "y_rows f32", [](Stage& s) { s.ws.y_rows.dtype = DType::f32; }, "ws.y_rows"),
      bad_stage(e, "y_rows wrong hidden", [](Stage& s) { s.ws.y_rows = with_shape(s.ws.y_rows, {32, 264}); }, "ws.y_rows"),
      bad_stage(e, "act null", [](Stage& s) { s.ws.act = with_null_data(s.ws.act); }, "ws.act"),
  });
}

TEST(PlanConsistency, EntriesRejectAPlanThatNoLongerFitsItsShape) {
  // Planned for 8 tokens, then reused for 4096: the plan's align kernel (one warp, for 8*4
  // assignments) cannot take 4096*4. Workspace views carved from the same (stale) plan.
  Stage s = valid_stage(8);
  s.plan.shape.tokens = 4096;
  s.ws = carve_workspace(s.plan, fake_ptr(8), workspace_bytes(s.plan));
  s.x = with_shape(s.x, {4096, 256});
  s.topk_ids = with_shape(s.topk_ids, {4096, 4});
  s.topk_weights = with_shape(s.topk_weights, {4096, 4});
  EXPECT_TRUE(throws_naming([&] { call(Entry::align, s); }, "plan"));
  EXPECT_TRUE(throws_naming([&] { call(Entry::expert_up, s); }, "plan"));
  EXPECT_TRUE(throws_naming([&] { call(Entry::expert_down, s); }, "plan"));
  // A hand-made plan whose two GEMM configs disagree on block_m.
  Stage m = valid_stage(8);
  m.plan.down.block_m = 0;
  EXPECT_TRUE(throws_naming([&] { call(Entry::align, m); }, "plan"));
}

// ---- combine --------------------------------------------------------------------------------

struct CombineCall {
  Tensor y_rows, y;
  int64_t topk = 4;
  void operator()() const { combine(y_rows, topk, y, nullptr); }
};
CombineCall valid_combine(int64_t T, int64_t k = 4, int64_t H = 256) {
  return {Tensor(fake_ptr(1), DType::bf16, {T * k, H}), Tensor(fake_ptr(2), DType::bf16, {T, H}), k};
}
template <class Mutate>
BadCall bad_combine(std::string what, Mutate mutate, std::string arg) {
  CombineCall c = valid_combine(8);
  mutate(c);
  return {std::move(what), [c] { c(); }, std::move(arg)};
}

TEST(CombineValidation, ValidStartingPointPasses) {
  EXPECT_NO_THROW(valid_combine(0)());  // T = 0 returns before launching
  EXPECT_NO_THROW(valid_combine(0, 16, 8)());
}

TEST(CombineValidation, BadArguments) {
  expect_all_rejected({
      bad_combine("y f32", [](CombineCall& c) { c.y.dtype = DType::f32; }, "y"),
      bad_combine("y rank 1", [](CombineCall& c) { c.y = with_shape(c.y, {2048}); }, "y"),
      bad_combine("hidden not a multiple of 8",
                  [](CombineCall& c) {
                    c.y = with_shape(c.y, {8, 100});
                    c.y_rows = with_shape(c.y_rows, {32, 100});
                  },
                  "y"),
      bad_combine("y not given", [](CombineCall& c) { c.y = Tensor{}; }, "y"),
      bad_combine("y null", [](CombineCall& c) { c.y = with_null_data(c.y); }, "y"),
      bad_combine("y misaligned", [](CombineCall& c) { c.y = misaligned(c.y); }, "y"),
      bad_combine("y_rows f32", [](CombineCall& c) { c.y_rows.dtype = DType::f32; }, "y_rows"),
      bad_combine("y_rows T*k+1 rows", [](CombineCall& c) { c.y_rows = with_shape(c.y_rows, {33, 256}); }, "y_rows"),
      bad_combine("y_rows wrong hidden", [](CombineCall& c) { c.y_rows = with_shape(c.y_rows, {32, 264}); }, "y_rows"),
      bad_combine("y_rows [T, k, H]", [](CombineCall& c) { c.y_rows = with_shape(c.y_rows, {8, 4, 256}); }, "y_rows"),
      bad_combine("y_rows not given", [](CombineCall& c) { c.y_rows = Tensor{}; }, "y_rows"),
      bad_combine("y_rows null", [](CombineCall& c) { c.y_rows = with_null_data(c.y_rows); }, "y_rows"),
      bad_combine("y_rows misaligned", [](CombineCall& c) { c.y_rows = misaligned(c.y_rows); }, "y_rows"),
      bad_combine("k = 0", [](CombineCall& c) { c.topk = 0; }, "topk"),
      bad_combine("k > 16",
                  [](CombineCall& c) {
                    c.topk = 17;
                    c.y_rows = with_shape(c.y_rows, {8 * 17, 256});
                  },
                  "topk"),
  });
}

// ---- check_status ---------------------------------------------------------------------------

TEST(CheckStatusValidation, BadStatusBuffer) {
  Workspace ws = valid_stage(8).ws;
  Workspace f32 = ws, absent = ws, wide = ws;
  f32.status.dtype = DType::f32;
  absent.status = Tensor{};
  wide.status = with_shape(ws.status, {2});
  for (const Workspace* w : {&f32, &absent, &wide})
    EXPECT_TRUE(throws_naming([w] { check_status(*w, nullptr); }, "ws.status"));
}

}  // namespace
}  // namespace moekit::testing
