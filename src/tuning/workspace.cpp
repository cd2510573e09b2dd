// workspace.cpp — the forward's workspace layout (workspace.hpp) and its public entries,
// workspace_bytes and carve_workspace.
#include "tuning/workspace.hpp"

#include <cstdint>
#include <string>

#include "common/validate.hpp"

namespace moekit::detail {

int64_t Piece::bytes() const {
  if (!present) return 0;
  int64_t n = dtype_bytes(dtype);
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

Tensor Piece::view(void* base) const {
  if (!present) return Tensor();
  Tensor t;
  t.data = static_cast<char*>(base) + offset;
  t.dtype = dtype;
  t.rank = rank;
  for (int i = 0; i < rank; ++i) t.shape[i] = shape[i];
  return t;
}

Piece Pieces::add(DType dtype, std::initializer_list<int64_t> shape, bool present) {
  Piece p;
  p.offset = at_;
  p.present = present;
  p.dtype = dtype;
  for (int64_t d : shape) p.shape[p.rank++] = d;
  at_ += (p.bytes() + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  return p;
}

WorkspaceLayout workspace_layout(const ForwardPlan& p) {
  const MoeShape& s = p.shape;
  const int64_t tk = s.tokens * s.topk;
  Pieces pieces;
  WorkspaceLayout l;
  l.router_logits = pieces.add(DType::f32, {s.tokens, s.experts});
  l.topk_ids = pieces.add(DType::i32, {s.tokens, s.topk});
  l.topk_weights = pieces.add(DType::f32, {s.tokens, s.topk});
  l.sorted_ids = pieces.add(DType::i32, {p.max_rows()});
  l.block_expert = pieces.add(DType::i32, {p.max_blocks()});
  l.num_rows_padded = pieces.add(DType::i32, {1});
  l.expert_counts = pieces.add(DType::i32, {s.experts});
  l.status = pieces.add(DType::i32, {1});
  l.act = pieces.add(DType::bf16, {p.max_rows(), s.inter});
  l.y_rows = pieces.add(DType::bf16, {tk, s.hidden});
  l.y_partials = pieces.add(DType::f32, {int64_t(p.down_splits), tk, s.hidden}, p.down_splits > 1);
  l.align_scratch = pieces.add(DType::i32, {int64_t(kAlignMaxCtas), s.experts + 1}, p.align == AlignKernel::grid);
  l.gemm_counter = pieces.add(DType::i32, {1});
  l.total = pieces.bytes();
  return l;
}

Workspace carve_unchecked(const ForwardPlan& plan, void* base) {
  const WorkspaceLayout l = workspace_layout(plan);
  Workspace ws;
  ws.router_logits = l.router_logits.view(base);
  ws.topk_ids = l.topk_ids.view(base);
  ws.topk_weights = l.topk_weights.view(base);
  ws.sorted_ids = l.sorted_ids.view(base);
  ws.block_expert = l.block_expert.view(base);
  ws.num_rows_padded = l.num_rows_padded.view(base);
  ws.expert_counts = l.expert_counts.view(base);
  ws.status = l.status.view(base);
  ws.act = l.act.view(base);
  ws.y_rows = l.y_rows.view(base);
  ws.y_partials = l.y_partials.view(base);
  ws.align_scratch = l.align_scratch.view(base);
  ws.gemm_counter = l.gemm_counter.view(base);
  return ws;
}

Workspace carve_named(const ForwardPlan& p, void* base, size_t bytes, const char* entry, const char* base_arg,
                      const char* bytes_arg) {
  const int64_t total = workspace_layout(p).total;
  if (base == nullptr) fail(entry, base_arg, "workspace pointer is null");
  if (reinterpret_cast<uintptr_t>(base) % kWorkspaceAlign != 0)
    fail(entry, base_arg, "workspace must be " + std::to_string(kWorkspaceAlign) + "-byte aligned");
  if (int64_t(bytes) < total)
    fail(entry, bytes_arg,
         "workspace of " + std::to_string(bytes) + " bytes is smaller than workspace_bytes(plan) = " +
             std::to_string(total));
  return carve_unchecked(p, base);
}

}  // namespace moekit::detail

namespace moekit {

size_t workspace_bytes(const ForwardPlan& plan) { return size_t(detail::workspace_layout(plan).total); }

Workspace carve_workspace(const ForwardPlan& p, void* base, size_t bytes) {
  return detail::carve_named(p, base, bytes, "carve_workspace", "base", "bytes");
}

}  // namespace moekit
