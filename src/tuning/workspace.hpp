// workspace.hpp — how a device buffer is laid out as the intermediate tensors of a step: a list of
// 256-byte aligned pieces, each declared once with its dtype and shape, from which both the
// buffer's size (a pure host function: workspace_bytes) and the views into it are derived. The
// forward's workspace (ForwardPlan -> Workspace) is laid out here; EpLayer lays out its own
// buffers with the same Pieces.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "moekit/moe.hpp"

namespace moekit::detail {

inline constexpr int64_t kWorkspaceAlign = 256;  // every piece starts on a 256-byte boundary

struct Piece {
  int64_t offset = 0;
  bool present = false;  // an absent piece takes no bytes and views as Tensor{}
  DType dtype = DType::i32;
  int rank = 0;
  int64_t shape[Tensor::kMaxRank] = {0, 0, 0, 0};
  int64_t bytes() const;
  Tensor view(void* base) const;  // the piece in a buffer starting at `base`
};

class Pieces {
 public:
  // The next piece, of `shape` elements of `dtype` (absent when !present).
  Piece add(DType dtype, std::initializer_list<int64_t> shape, bool present = true);
  int64_t bytes() const { return at_; }

 private:
  int64_t at_ = 0;
};

// The forward's workspace: one piece per Workspace tensor, in this order.
struct WorkspaceLayout {
  Piece router_logits, topk_ids, topk_weights, sorted_ids, block_expert, num_rows_padded, expert_counts, status, act,
      y_rows, y_partials, align_scratch, gemm_counter;
  int64_t total = 0;
};
WorkspaceLayout workspace_layout(const ForwardPlan& plan);

// The views of a buffer already checked to hold workspace_bytes(plan), 256-byte aligned.
Workspace carve_unchecked(const ForwardPlan& plan, void* base);
// carve_workspace with the buffer's errors under the caller's argument names (the whole-layer
// entries take `workspace` / `workspace_bytes`).
Workspace carve_named(const ForwardPlan& plan, void* base, size_t bytes, const char* entry, const char* base_arg,
                      const char* bytes_arg);

}  // namespace moekit::detail
