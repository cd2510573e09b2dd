// validate.cpp — the backward's argument checks (backward/validate.hpp): the plan, the inputs the
// forward kept, the gradients to write, the workspace, and that no output aliases anything.
#include "backward/validate.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/validate.hpp"
#include "tuning/backward_planner.hpp"

namespace moekit::detail {

namespace {

// A tensor the plan reads or writes exactly when `used`: checked as expect_tensor when used,
// refused when given otherwise (`unused` says why the plan does not take it).
void expect_when(const char* entry, const char* arg, bool used, const Tensor& t, DType dtype,
                 std::initializer_list<int64_t> shape, const char* unused) {
  if (used) {
    expect_tensor(entry, arg, t, dtype, shape);
  } else if (t.given()) {
    fail(entry, arg, std::string("is not taken by this plan (") + unused + "): leave it empty, or plan for it");
  }
}

void add_span(std::vector<Span>& spans, const char* name, const Tensor& t) {
  if (t.given() && t.bytes() > 0) spans.push_back(span_of(name, t));
}

}  // namespace

BackwardWorkspace check_backward(const BackwardPlan& p, const BackwardInputs& in, const RouterOptions& opt,
                                 const BackwardGrads& g, void* workspace, size_t workspace_bytes, const char* entry) {
  expect_backward_plan(p, entry);
  const MoeShape& s = p.shape;
  const BackwardOptions& o = p.options;
  const int64_t T = s.tokens, H = s.hidden, F = s.inter, E = s.experts, k = s.topk;
  const bool gate = o.router == RouterGrad::gate, logits = o.router == RouterGrad::logits;
  if (o.router != RouterGrad::none && opt.scoring != Scoring::softmax && opt.scoring != Scoring::sigmoid)
    fail(entry, "opt.scoring", "must be Scoring::softmax or ::sigmoid, got " + std::to_string(int(opt.scoring)));

  // What the forward had and kept.
  expect_tensor(entry, "x", in.x, DType::bf16, {T, H});
  expect_tensor(entry, "w13", in.w13, DType::bf16, {E, 2 * F, H});
  expect_tensor(entry, "w2", in.w2, DType::bf16, {E, H, F});
  if (gate && in.w_gate.given() && in.w_gate.dtype != DType::bf16 && in.w_gate.dtype != DType::f32)
    fail(entry, "w_gate", std::string("expected dtype bf16 or f32, got ") + dtype_name(in.w_gate.dtype));
  expect_when(entry, "w_gate", gate, in.w_gate, in.w_gate.dtype, {E, H}, "options.router is not 'gate'");
  expect_when(entry, "router_logits", o.router != RouterGrad::none, in.router_logits, DType::f32, {T, E},
              "options.router is 'none'");
  expect_tensor(entry, "topk_ids", in.topk_ids, DType::i32, {T, k});
  expect_tensor(entry, "topk_weights", in.topk_weights, DType::f32, {T, k});
  expect_tensor(entry, "sorted_ids", in.sorted_ids, DType::i32, {p.max_rows()});
  expect_tensor(entry, "block_expert", in.block_expert, DType::i32, {p.max_blocks()});
  expect_tensor(entry, "num_rows_padded", in.num_rows_padded, DType::i32, {1});
  expect_tensor(entry, "expert_counts", in.expert_counts, DType::i32, {E});
  expect_when(entry, "h", o.saved == SavedActivations::h, in.h, DType::bf16, {p.max_rows(), 2 * F},
              "options.saved is 'recompute': the backward recomputes h");
  expect_tensor(entry, "dy", in.dy, DType::bf16, {T, H});
  if (gate) expect_optional(entry, "d_logits_aux", in.d_logits_aux, DType::f32, {T, E});
  else expect_when(entry, "d_logits_aux", false, in.d_logits_aux, DType::f32, {T, E}, "options.router is not 'gate'");

  // What the plan writes.
  expect_when(entry, "dx", o.input_grad, g.dx, DType::bf16, {T, H}, "options.input_grad is false");
  expect_when(entry, "dw13", o.weight_grads, g.dw13, o.weight_grad_dtype, {E, 2 * F, H}, "options.weight_grads is false");
  expect_when(entry, "dw2", o.weight_grads, g.dw2, o.weight_grad_dtype, {E, H, F}, "options.weight_grads is false");
  if (o.router == RouterGrad::none || g.d_topk_weights.given())
    expect_tensor(entry, "d_topk_weights", g.d_topk_weights, DType::f32, {T, k});
  expect_when(entry, "d_router_logits", logits, g.d_router_logits, DType::f32, {T, E}, "options.router is not 'logits'");
  expect_when(entry, "d_w_gate", gate, g.d_w_gate, in.w_gate.dtype, {E, H}, "options.router is not 'gate'");

  const BackwardWorkspace ws = carve_backward_named(p, workspace, workspace_bytes, entry, "workspace", "workspace_bytes");

  // Nothing the backward writes may alias what it reads or another output.
  std::vector<Span> inputs, outputs;
  add_span(inputs, "x", in.x), add_span(inputs, "w13", in.w13), add_span(inputs, "w2", in.w2);
  add_span(inputs, "w_gate", in.w_gate), add_span(inputs, "router_logits", in.router_logits);
  add_span(inputs, "topk_ids", in.topk_ids), add_span(inputs, "topk_weights", in.topk_weights);
  add_span(inputs, "sorted_ids", in.sorted_ids), add_span(inputs, "block_expert", in.block_expert);
  add_span(inputs, "num_rows_padded", in.num_rows_padded), add_span(inputs, "expert_counts", in.expert_counts);
  add_span(inputs, "h", in.h), add_span(inputs, "dy", in.dy), add_span(inputs, "d_logits_aux", in.d_logits_aux);
  add_span(outputs, "dx", g.dx), add_span(outputs, "dw13", g.dw13), add_span(outputs, "dw2", g.dw2);
  add_span(outputs, "d_topk_weights", g.d_topk_weights), add_span(outputs, "d_router_logits", g.d_router_logits);
  add_span(outputs, "d_w_gate", g.d_w_gate);
  Pieces sizes;
  lay_out_backward_workspace(p, sizes);
  const Span wspan = span_of("workspace", workspace, size_t(sizes.bytes()));
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (overlap(outputs[i], outputs[j]))
        fail(entry, outputs[i].name, std::string("overlaps output '") + outputs[j].name + "': outputs need buffers of their own");
    for (const Span& x : inputs)
      if (overlap(outputs[i], x))
        fail(entry, outputs[i].name, std::string("overlaps input '") + x.name + "': the backward does not write in place");
    if (overlap(outputs[i], wspan))
      fail(entry, outputs[i].name, "overlaps the workspace");
  }
  for (const Span& x : inputs)
    if (overlap(wspan, x))
      fail(entry, "workspace", std::string("overlaps input '") + x.name +
                                   "': keep the forward's workspace (it holds the layout) and give the backward a buffer of its own");
  return ws;
}

}  // namespace moekit::detail
