// validate.hpp — the argument checks of the backward pass (moekit/backward.hpp), run before
// anything touches the GPU. Each failure throws moekit::Error as
// "moekit::<entry>: argument '<name>': ..." (common/validate.hpp), naming the field of
// BackwardInputs or BackwardGrads ('x', 'sorted_ids', 'dw13', ...), 'options.<field>' of the plan's
// options, 'opt.<field>' of the router's, or 'workspace' / 'workspace_bytes'. The backward's GPU
// entry (docs/design.md, "Backward": the next step) calls check_backward first, then its stages'
// unchecked launchers.
#pragma once

#include <cstddef>

#include "moekit/backward.hpp"

namespace moekit::detail {

// Every argument of the backward entry, in this order: the plan (expect_backward_plan,
// tuning/backward_planner.hpp); the router's options (when the
// plan computes a router gradient); the inputs (dtype, shape, 16-byte alignment; those the plan
// does not read are refused, as a sign the caller meant another plan); the outputs (required when
// the plan computes them, refused when it does not); the workspace buffer (null, 256-byte
// alignment, size); and that no output overlaps another output, an input or the workspace, and
// the workspace no input (the forward's workspace, which holds the layout, must outlive the
// backward: the backward's is another buffer). Returns the workspace's views.
BackwardWorkspace check_backward(const BackwardPlan& plan, const BackwardInputs& in, const RouterOptions& opt,
                                 const BackwardGrads& grads, void* workspace, size_t workspace_bytes,
                                 const char* entry);

}  // namespace moekit::detail
