// validation_backward_test.cpp — the checks the backward entry runs first (detail::check_backward,
// src/backward/validate.cpp) reject every bad argument with a moekit::Error that names it: the
// plan, the router options, each input the forward kept, each gradient output (required when the
// plan computes it, refused when not), the workspace, and outputs that alias anything.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backward/validate.hpp"
#include "cpu_test_util.hpp"
#include "moekit/backward.hpp"

namespace moekit::testing {
namespace {

constexpr int64_t kT = 8, kE = 16, kK = 4, kH = 256, kF = 128;

BackwardOptions gate_options() {
  BackwardOptions o;
  o.router = RouterGrad::gate;
  o.saved = SavedActivations::h;
  o.weight_grad_dtype = DType::f32;
  o.accumulate_weight_grads = true;
  return o;
}

// Every argument of the backward on fake pointers (one slot each), with a workspace of exactly the
// planned size; the default is a plan that reads and writes everything.
struct Step {
  explicit Step(const BackwardOptions& o = gate_options())
      : plan(plan_backward(plan_forward(MoeShape{kT, kH, kF, kE, kK}, kH200), kH200, o)) {
    const int64_t rows = plan.max_rows();
    in.x = Tensor(fake_ptr(1), DType::bf16, {kT, kH});
    in.w13 = Tensor(fake_ptr(2), DType::bf16, {kE, 2 * kF, kH});
    in.w2 = Tensor(fake_ptr(3), DType::bf16, {kE, kH, kF});
    if (o.router == RouterGrad::gate) in.w_gate = Tensor(fake_ptr(4), DType::f32, {kE, kH});
    if (o.router != RouterGrad::none) in.router_logits = Tensor(fake_ptr(5), DType::f32, {kT, kE});
    in.topk_ids = Tensor(fake_ptr(6), DType::i32, {kT, kK});
    in.topk_weights = Tensor(fake_ptr(7), DType::f32, {kT, kK});
    in.sorted_ids = Tensor(fake_ptr(8), DType::i32, {rows});
    in.block_expert = Tensor(fake_ptr(9), DType::i32, {plan.max_blocks()});
    in.num_rows_padded = Tensor(fake_ptr(10), DType::i32, {1});
    in.expert_counts = Tensor(fake_ptr(11), DType::i32, {kE});
    if (o.saved == SavedActivations::h) in.h = Tensor(fake_ptr(12), DType::bf16, {rows, 2 * kF});
    in.dy = Tensor(fake_ptr(13), DType::bf16, {kT, kH});
    if (o.input_grad) grads.dx = Tensor(fake_ptr(14), DType::bf16, {kT, kH});
    if (o.weight_grads) {
      grads.dw13 = Tensor(fake_ptr(15), o.weight_grad_dtype, {kE, 2 * kF, kH});
      grads.dw2 = Tensor(fake_ptr(16), o.weight_grad_dtype, {kE, kH, kF});
    }
    grads.d_topk_weights = Tensor(fake_ptr(17), DType::f32, {kT, kK});
    if (o.router == RouterGrad::logits) grads.d_router_logits = Tensor(fake_ptr(18), DType::f32, {kT, kE});
    if (o.router == RouterGrad::gate) grads.d_w_gate = Tensor(fake_ptr(19), DType::f32, {kE, kH});
    bytes = backward_workspace_bytes(plan);
  }
  BackwardPlan plan;
  BackwardInputs in;
  BackwardGrads grads;
  RouterOptions opt{Scoring::sigmoid, true, 0, 0, 2.5f};
  void* workspace = fake_ptr(20);
  size_t bytes = 0;

  BackwardWorkspace check() const { return detail::check_backward(plan, in, opt, grads, workspace, bytes, "moe_backward"); }
};

template <class Mutate>
BadCall bad(std::string what, Mutate mutate, std::string arg, const BackwardOptions& o = gate_options()) {
  Step s(o);
  mutate(s);
  return {std::move(what), [s] { s.check(); }, std::move(arg)};
}

BackwardOptions minimal_options() {  // routing given, recompute, no dx, no dW: only d_topk_weights
  BackwardOptions o;
  o.input_grad = false;
  o.weight_grads = false;
  return o;
}
BackwardOptions logits_options() {
  BackwardOptions o;
  o.router = RouterGrad::logits;
  return o;
}

TEST(BackwardValidation, WellFormedStepsPass) {
  ASSERT_EQ(Step().plan.block_m, 16);
  for (const BackwardOptions& o : {gate_options(), minimal_options(), logits_options(), BackwardOptions{}}) {
    const Step s(o);
    SCOPED_TRACE(s.plan.str());
    BackwardWorkspace ws;
    EXPECT_NO_THROW(ws = s.check());
    EXPECT_EQ(ws.gemm_counter.bytes(), 4);
  }
  Step optional(gate_options());  // d_topk_weights is optional when a router gradient is computed
  optional.grads.d_topk_weights = Tensor{};
  EXPECT_NO_THROW(optional.check());
  Step aux;  // so is the gradient of the caller's losses on the logits
  aux.in.d_logits_aux = Tensor(fake_ptr(21), DType::f32, {kT, kE});
  EXPECT_NO_THROW(aux.check());
  Step bf16_gate;  // d_w_gate follows w_gate's dtype
  bf16_gate.in.w_gate.dtype = DType::bf16;
  bf16_gate.grads.d_w_gate.dtype = DType::bf16;
  EXPECT_NO_THROW(bf16_gate.check());
  Step empty;  // T = 0 is a valid, empty step: its empty tensors may be null
  empty.plan = plan_backward(plan_forward(MoeShape{0, kH, kF, kE, kK}, kH200), kH200, gate_options());
  for (Tensor* t : {&empty.in.x, &empty.in.dy, &empty.grads.dx})
    *t = Tensor(nullptr, DType::bf16, {0, kH});
  for (Tensor* t : {&empty.in.topk_weights, &empty.grads.d_topk_weights}) *t = Tensor(nullptr, DType::f32, {0, kK});
  empty.in.topk_ids = Tensor(nullptr, DType::i32, {0, kK});
  empty.in.router_logits = Tensor(nullptr, DType::f32, {0, kE});
  empty.in.sorted_ids = with_shape(empty.in.sorted_ids, {empty.plan.max_rows()});
  empty.in.block_expert = with_shape(empty.in.block_expert, {empty.plan.max_blocks()});
  empty.in.h = with_shape(empty.in.h, {empty.plan.max_rows(), 2 * kF});
  empty.bytes = backward_workspace_bytes(empty.plan);
  EXPECT_NO_THROW(empty.check());
}

TEST(BackwardValidation, PlanAndOptions) {
  expect_all_rejected({
      bad("plan shape edited", [](Step& s) { s.plan.shape.hidden = 260; }, "shape.hidden"),
      bad("plan block_m 0", [](Step& s) { s.plan.block_m = 0; }, "plan"),
      bad("plan d config not compiled", [](Step& s) { s.plan.d.stages = 99; }, "plan"),
      bad("plan dw_splits 0", [](Step& s) { s.plan.dw_splits = 0; }, "plan"),
      bad("options edited: bf16 accumulation", [](Step& s) { s.plan.options.weight_grad_dtype = DType::bf16; },
          "options.accumulate_weight_grads"),
      bad("opt.scoring unknown", [](Step& s) { s.opt.scoring = Scoring(7); }, "opt.scoring"),
  });
  // Without a router gradient the router's options are not read.
  Step s(minimal_options());
  s.opt.scoring = Scoring(7);
  EXPECT_NO_THROW(s.check());
}

TEST(BackwardValidation, Inputs) {
  std::vector<BadCall> cases;
  // Each required input: not given, wrong dtype, wrong shape, null, misaligned.
  struct Input {
    const char* name;
    Tensor BackwardInputs::*field;
    DType other;
  };
  for (const Input& i : {Input{"x", &BackwardInputs::x, DType::f32}, Input{"w13", &BackwardInputs::w13, DType::f32},
                         Input{"w2", &BackwardInputs::w2, DType::e4m3}, Input{"w_gate", &BackwardInputs::w_gate, DType::i32},
                         Input{"router_logits", &BackwardInputs::router_logits, DType::bf16},
                         Input{"topk_ids", &BackwardInputs::topk_ids, DType::f32},
                         Input{"topk_weights", &BackwardInputs::topk_weights, DType::bf16},
                         Input{"sorted_ids", &BackwardInputs::sorted_ids, DType::f32},
                         Input{"block_expert", &BackwardInputs::block_expert, DType::bf16},
                         Input{"num_rows_padded", &BackwardInputs::num_rows_padded, DType::f32},
                         Input{"expert_counts", &BackwardInputs::expert_counts, DType::f32},
                         Input{"h", &BackwardInputs::h, DType::f32}, Input{"dy", &BackwardInputs::dy, DType::f32}}) {
    auto f = i.field;
    cases.push_back(bad(std::string(i.name) + " not given", [f](Step& s) { s.in.*f = Tensor{}; }, i.name));
    cases.push_back(bad(std::string(i.name) + " dtype", [f, d = i.other](Step& s) { (s.in.*f).dtype = d; }, i.name));
    cases.push_back(bad(std::string(i.name) + " one row more", [f](Step& s) {
      Tensor& t = s.in.*f;
      t.shape[0] += 1;
    }, i.name));
    cases.push_back(bad(std::string(i.name) + " rank", [f](Step& s) { (s.in.*f).rank += 1; }, i.name));
    cases.push_back(bad(std::string(i.name) + " null", [f](Step& s) { s.in.*f = with_null_data(s.in.*f); }, i.name));
    cases.push_back(bad(std::string(i.name) + " misaligned", [f](Step& s) { s.in.*f = misaligned(s.in.*f); }, i.name));
  }
  // The layout of another block_m (this plan's is 16: 2 rows per expert) is another size.
  cases.push_back(bad("sorted_ids of block_m 128", [](Step& s) {
    s.in.sorted_ids = with_shape(s.in.sorted_ids, {worst_case_rows(kT, kK, kE, 128)});
  }, "sorted_ids"));
  // Inputs the plan does not read are refused: the caller meant another plan.
  cases.push_back(bad("h with recompute", [](Step& s) { s.in.h = Tensor(fake_ptr(12), DType::bf16, {s.plan.max_rows(), 2 * kF}); },
                      "h", BackwardOptions{}));
  cases.push_back(bad("w_gate without a gate gradient", [](Step& s) { s.in.w_gate = Tensor(fake_ptr(4), DType::f32, {kE, kH}); },
                      "w_gate", logits_options()));
  // The optional gradient of the caller's losses on the logits: checked when given, gate only.
  cases.push_back(bad("d_logits_aux [T, k]", [](Step& s) { s.in.d_logits_aux = Tensor(fake_ptr(21), DType::f32, {kT, kK}); },
                      "d_logits_aux"));
  cases.push_back(bad("d_logits_aux bf16", [](Step& s) { s.in.d_logits_aux = Tensor(fake_ptr(21), DType::bf16, {kT, kE}); },
                      "d_logits_aux"));
  cases.push_back(bad("d_logits_aux with a logits gradient",
                      [](Step& s) { s.in.d_logits_aux = Tensor(fake_ptr(21), DType::f32, {kT, kE}); }, "d_logits_aux",
                      logits_options()));
  cases.push_back(bad("router_logits without a router gradient",
                      [](Step& s) { s.in.router_logits = Tensor(fake_ptr(5), DType::f32, {kT, kE}); }, "router_logits",
                      minimal_options()));
  expect_all_rejected(cases);
}

TEST(BackwardValidation, Outputs) {
  expect_all_rejected({
      bad("dx not given", [](Step& s) { s.grads.dx = Tensor{}; }, "dx"),
      bad("dx f32", [](Step& s) { s.grads.dx.dtype = DType::f32; }, "dx"),
      bad("dx misaligned", [](Step& s) { s.grads.dx = misaligned(s.grads.dx); }, "dx"),
      bad("dw13 bf16 in an f32 plan", [](Step& s) { s.grads.dw13.dtype = DType::bf16; }, "dw13"),
      bad("dw13 [E, F, H]", [](Step& s) { s.grads.dw13 = with_shape(s.grads.dw13, {kE, kF, kH}); }, "dw13"),
      bad("dw13 not given", [](Step& s) { s.grads.dw13 = Tensor{}; }, "dw13"),
      bad("dw2 [E, F, H]", [](Step& s) { s.grads.dw2 = with_shape(s.grads.dw2, {kE, kF, kH}); }, "dw2"),
      bad("dw2 null", [](Step& s) { s.grads.dw2 = with_null_data(s.grads.dw2); }, "dw2"),
      bad("d_topk_weights bf16", [](Step& s) { s.grads.d_topk_weights.dtype = DType::bf16; }, "d_topk_weights"),
      bad("d_topk_weights k+1", [](Step& s) { s.grads.d_topk_weights = with_shape(s.grads.d_topk_weights, {kT, kK + 1}); },
          "d_topk_weights"),
      bad("d_topk_weights not given without a router gradient", [](Step& s) { s.grads.d_topk_weights = Tensor{}; },
          "d_topk_weights", minimal_options()),
      bad("d_w_gate not given", [](Step& s) { s.grads.d_w_gate = Tensor{}; }, "d_w_gate"),
      bad("d_w_gate bf16 for an f32 w_gate", [](Step& s) { s.grads.d_w_gate.dtype = DType::bf16; }, "d_w_gate"),
      bad("d_router_logits not given", [](Step& s) { s.grads.d_router_logits = Tensor{}; }, "d_router_logits",
          logits_options()),
      bad("d_router_logits [T, k]", [](Step& s) { s.grads.d_router_logits = with_shape(s.grads.d_router_logits, {kT, kK}); },
          "d_router_logits", logits_options()),
      // Outputs the plan does not compute are refused.
      bad("dx with input_grad false", [](Step& s) { s.grads.dx = Tensor(fake_ptr(14), DType::bf16, {kT, kH}); }, "dx",
          minimal_options()),
      bad("dw2 with weight_grads false", [](Step& s) { s.grads.dw2 = Tensor(fake_ptr(16), DType::bf16, {kE, kH, kF}); },
          "dw2", minimal_options()),
      bad("d_router_logits with a gate gradient",
          [](Step& s) { s.grads.d_router_logits = Tensor(fake_ptr(18), DType::f32, {kT, kE}); }, "d_router_logits"),
      bad("d_w_gate with a logits gradient", [](Step& s) { s.grads.d_w_gate = Tensor(fake_ptr(19), DType::f32, {kE, kH}); },
          "d_w_gate", logits_options()),
  });
}

TEST(BackwardValidation, WorkspaceAndAliasing) {
  expect_all_rejected({
      bad("workspace null", [](Step& s) { s.workspace = nullptr; }, "workspace"),
      bad("workspace 16- but not 256-byte aligned", [](Step& s) { s.workspace = static_cast<char*>(s.workspace) + 16; },
          "workspace"),
      bad("workspace one byte short", [](Step& s) { s.bytes -= 1; }, "workspace_bytes"),
      // In place: dx over dy, d_topk_weights over topk_weights.
      bad("dx over dy", [](Step& s) { s.grads.dx.data = s.in.dy.data; }, "dx"),
      bad("d_topk_weights over topk_weights", [](Step& s) { s.grads.d_topk_weights.data = s.in.topk_weights.data; },
          "d_topk_weights"),
      // Two outputs sharing memory: the later one is named, with the earlier in the message.
      bad("dw2 inside dw13", [](Step& s) { s.grads.dw2.data = static_cast<char*>(s.grads.dw13.data) + 4096; }, "dw2"),
      bad("d_w_gate over dx", [](Step& s) { s.grads.d_w_gate.data = s.grads.dx.data; }, "d_w_gate"),
      bad("dx inside the workspace", [](Step& s) { s.grads.dx.data = static_cast<char*>(s.workspace) + 256; }, "dx"),
      // The backward's workspace laid over the forward's (which holds the layout it replays).
      bad("workspace over sorted_ids", [](Step& s) { s.workspace = static_cast<char*>(s.in.sorted_ids.data) - 256; },
          "workspace"),
      bad("workspace over h", [](Step& s) { s.workspace = s.in.h.data; }, "workspace"),
      bad("d_w_gate over d_logits_aux", [](Step& s) {
        s.in.d_logits_aux = Tensor(fake_ptr(21), DType::f32, {kT, kE});
        s.grads.d_w_gate.data = s.in.d_logits_aux.data;
      }, "d_w_gate"),
  });
  // Adjacent is not overlapping: dx ends exactly where dy begins.
  Step s;
  s.grads.dx.data = static_cast<char*>(s.in.dy.data) - s.grads.dx.bytes();
  EXPECT_NO_THROW(s.check());
  // Inputs may share memory with each other (they are only read).
  Step t;
  t.in.topk_weights.data = t.in.router_logits.data;
  EXPECT_NO_THROW(t.check());
}

}  // namespace
}  // namespace moekit::testing
