// workspace.hpp — how a device buffer is laid out as the intermediate tensors of a step: a list of
// 256-byte aligned pieces, each declared once with its dtype and shape. The same list run over no
// buffer gives the size (a pure host function: workspace_bytes), over a buffer the views into it.
// The forward's workspace (ForwardPlan -> Workspace) is laid out here; EpLayer lays out its own
// buffers with the same Pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "moekit/moe.hpp"

namespace moekit::detail {

inline constexpr int64_t kWorkspaceAlign = 256;  // every piece starts on a 256-byte boundary

class Pieces {
 public:
  // Pieces of the buffer at `base` (null: only sizes are wanted, the views are not used). A size
  // that does not fit 64 bits fails as `entry`'s argument 'plan' (validated plans never do).
  explicit Pieces(void* base = nullptr, const char* entry = "workspace_bytes")
      : base_(static_cast<char*>(base)), entry_(entry) {}
  // The next piece: `shape` elements of `dtype`, 256-byte aligned; an absent piece takes no bytes
  // and views as Tensor{}. Its bytes and the running total are checked for overflow.
  Tensor add(DType dtype, std::initializer_list<int64_t> shape, bool present = true);
  int64_t bytes() const { return at_; }

 private:
  char* base_;
  const char* entry_;
  int64_t at_ = 0;
};

// The forward's workspace of `plan`, laid out over `pieces` (one piece per Workspace tensor).
Workspace lay_out_workspace(const ForwardPlan& plan, Pieces& pieces);
// The views of a buffer already checked to hold workspace_bytes(plan), 256-byte aligned.
Workspace carve_unchecked(const ForwardPlan& plan, void* base);
// The checks of a caller's workspace buffer before it is carved: not null, 256-byte aligned, at
// least `need` bytes (what `size_fn`, the public sizing function, returns), named as the caller's
// arguments `base_arg` / `bytes_arg`.
void expect_buffer(const char* entry, void* base, size_t bytes, int64_t need, const char* size_fn,
                   const char* base_arg, const char* bytes_arg);
// carve_workspace with the buffer's errors under the caller's argument names (the whole-layer
// entries take `workspace` / `workspace_bytes`).
Workspace carve_named(const ForwardPlan& plan, void* base, size_t bytes, const char* entry, const char* base_arg,
                      const char* bytes_arg);

}  // namespace moekit::detail
