// backward_workspace.cpp — the backward's workspace layout (tuning/backward_planner.hpp) over the
// forward's Pieces, and its public entries backward_workspace_bytes and carve_backward_workspace.
// Every size is 64-bit: dx_rows alone is T·k·H·2 bytes, past 4 GiB in a large prefill.
#include <cstdint>

#include "common/validate.hpp"
#include "tuning/backward_planner.hpp"

namespace moekit::detail {

BackwardWorkspace lay_out_backward_workspace(const BackwardPlan& p, Pieces& pieces) {
  const MoeShape& s = p.shape;
  const BackwardOptions& o = p.options;
  const int64_t tk = s.tokens * s.topk, rows = p.max_rows(), F = s.inter, H = s.hidden, E = s.experts;
  const bool gate = o.router == RouterGrad::gate;
  BackwardWorkspace ws;
  ws.h = pieces.add(DType::bf16, {rows, 2 * F}, o.saved == SavedActivations::recompute);
  ws.dh = pieces.add(DType::bf16, {rows, 2 * F}, o.input_grad || o.weight_grads);
  ws.act_w = pieces.add(DType::bf16, {rows, F}, o.weight_grads);
  ws.dw_partials = pieces.add(DType::f32, {p.d_col_tiles(), tk});
  ws.d_topk_weights = pieces.add(DType::f32, {s.tokens, s.topk});
  ws.dx_rows = pieces.add(DType::bf16, {tk, H}, o.input_grad && p.dx_splits == 1);
  ws.dx_partials = pieces.add(DType::f32, {int64_t(p.dx_splits), tk, H}, o.input_grad && p.dx_splits > 1);
  ws.d_logits = pieces.add(DType::bf16, {s.tokens, 2 * p.experts_padded()}, gate);
  ws.gate_partials = pieces.add(DType::f32, {int64_t(p.gate_splits), E, H}, gate && p.gate_splits > 1);
  ws.expert_row_start = pieces.add(DType::i32, {E + 1}, o.weight_grads);
  const bool dw_split = o.weight_grads && p.dw_splits > 1;
  ws.dw13_partials = pieces.add(DType::f32, {int64_t(p.dw_splits), E, 2 * F, H}, dw_split);
  ws.dw2_partials = pieces.add(DType::f32, {int64_t(p.dw_splits), E, H, F}, dw_split);
  ws.gemm_counter = pieces.add(DType::i32, {1});
  return ws;
}

BackwardWorkspace carve_backward_named(const BackwardPlan& p, void* base, size_t bytes, const char* entry,
                                       const char* base_arg, const char* bytes_arg) {
  expect_backward_plan(p, entry);
  Pieces sizes(nullptr, entry);
  lay_out_backward_workspace(p, sizes);
  expect_buffer(entry, base, bytes, sizes.bytes(), "backward_workspace_bytes", base_arg, bytes_arg);
  Pieces pieces(base, entry);
  return lay_out_backward_workspace(p, pieces);
}

}  // namespace moekit::detail

namespace moekit {

size_t backward_workspace_bytes(const BackwardPlan& plan) {
  detail::expect_backward_plan(plan, "backward_workspace_bytes");
  detail::Pieces sizes(nullptr, "backward_workspace_bytes");
  detail::lay_out_backward_workspace(plan, sizes);
  return size_t(sizes.bytes());
}

BackwardWorkspace carve_backward_workspace(const BackwardPlan& plan, void* base, size_t bytes) {
  return detail::carve_backward_named(plan, base, bytes, "carve_backward_workspace", "base", "bytes");
}

}  // namespace moekit
