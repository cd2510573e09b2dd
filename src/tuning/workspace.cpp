// workspace.cpp — the forward's workspace layout (workspace.hpp) and its public entries,
// workspace_bytes and carve_workspace.
#include "tuning/workspace.hpp"

#include <cstdint>
#include <string>

#include "common/validate.hpp"

namespace moekit::detail {

Tensor Pieces::add(DType dtype, std::initializer_list<int64_t> shape, bool present) {
  if (!present) return Tensor();
  Tensor t;
  t.data = base_ != nullptr ? base_ + at_ : nullptr;  // sizing only: no pointer arithmetic on null
  t.dtype = dtype;
  for (int64_t d : shape) t.shape[t.rank++] = d;
  const int64_t bytes = checked_bytes(entry_, "plan", t);
  const int64_t padded = checked_add(entry_, "plan", "a workspace piece's bytes", bytes, kWorkspaceAlign - 1);
  at_ = checked_add(entry_, "plan", "the workspace's bytes", at_, padded / kWorkspaceAlign * kWorkspaceAlign);
  return t;
}

Workspace lay_out_workspace(const ForwardPlan& p, Pieces& pieces) {
  const MoeShape& s = p.shape;
  const int64_t tk = s.tokens * s.topk;
  Workspace ws;
  ws.router_logits = pieces.add(DType::f32, {s.tokens, s.experts});
  ws.topk_ids = pieces.add(DType::i32, {s.tokens, s.topk});
  ws.topk_weights = pieces.add(DType::f32, {s.tokens, s.topk});
  ws.sorted_ids = pieces.add(DType::i32, {p.max_rows()});
  ws.block_expert = pieces.add(DType::i32, {p.max_blocks()});
  ws.num_rows_padded = pieces.add(DType::i32, {1});
  ws.expert_counts = pieces.add(DType::i32, {s.experts});
  ws.status = pieces.add(DType::i32, {1});
  const bool fp8 = p.precision() == Precision::fp8;
  ws.act = pieces.add(fp8 ? DType::e4m3 : DType::bf16, {p.max_rows(), s.inter});
  ws.act_scale = pieces.add(DType::f32, {p.max_rows(), fp8_blocks(s.inter)}, fp8);
  ws.x_q = pieces.add(DType::e4m3, {s.tokens, s.hidden}, fp8);
  ws.x_scale = pieces.add(DType::f32, {s.tokens, fp8_blocks(s.hidden)}, fp8);
  ws.y_rows = pieces.add(DType::bf16, {tk, s.hidden});
  ws.y_partials = pieces.add(DType::f32, {int64_t(p.down_splits), tk, s.hidden}, p.down_splits > 1);
  ws.align_scratch = pieces.add(DType::i32, {int64_t(kAlignMaxCtas), s.experts + 1}, p.align == AlignKernel::grid);
  ws.gemm_counter = pieces.add(DType::i32, {1});
  return ws;
}

// The bytes of `plan`'s workspace, a size failing as `entry`'s.
static int64_t workspace_size(const ForwardPlan& plan, const char* entry) {
  Pieces sizes(nullptr, entry);
  lay_out_workspace(plan, sizes);
  return sizes.bytes();
}

Workspace carve_unchecked(const ForwardPlan& plan, void* base) {
  Pieces pieces(base, "carve_workspace");
  return lay_out_workspace(plan, pieces);
}

void expect_buffer(const char* entry, void* base, size_t bytes, int64_t need, const char* size_fn,
                   const char* base_arg, const char* bytes_arg) {
  if (base == nullptr) fail(entry, base_arg, "workspace pointer is null");
  if (reinterpret_cast<uintptr_t>(base) % kWorkspaceAlign != 0)
    fail(entry, base_arg, "workspace must be " + std::to_string(kWorkspaceAlign) + "-byte aligned");
  if (bytes < uint64_t(need))
    fail(entry, bytes_arg,
         "workspace of " + std::to_string(bytes) + " bytes is smaller than " + size_fn + "(plan) = " + std::to_string(need));
}

Workspace carve_named(const ForwardPlan& p, void* base, size_t bytes, const char* entry, const char* base_arg,
                      const char* bytes_arg) {
  // A plan edited after plan_forward could size the buffer wrongly: it is checked as the stages
  // check it, before its sizes are formed.
  expect_plan_sizes(p, entry);
  expect_buffer(entry, base, bytes, workspace_size(p, entry), "workspace_bytes", base_arg, bytes_arg);
  return carve_unchecked(p, base);
}

}  // namespace moekit::detail

namespace moekit {

size_t workspace_bytes(const ForwardPlan& plan) {
  detail::expect_plan_sizes(plan, "workspace_bytes");
  detail::Pieces sizes;
  detail::lay_out_workspace(plan, sizes);
  return size_t(sizes.bytes());
}

Workspace carve_workspace(const ForwardPlan& p, void* base, size_t bytes) {
  return detail::carve_named(p, base, bytes, "carve_workspace", "base", "bytes");
}

}  // namespace moekit
