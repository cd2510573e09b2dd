// validate.hpp — argument checks at the public boundary. Each failure throws moekit::Error with
// "<entry>: argument '<name>': expected ..., got ..." so the caller knows what to fix. The public
// entries run them once, then call the stages' unchecked internal launchers (<stage>/launch.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "moekit/moe.hpp"

namespace moekit::detail {

[[noreturn]] void fail(const char* entry, const char* arg, const std::string& what);

// Products and sums of shape values, checked before they are formed: a·b (a + b) of non-negative
// operands, or fail(entry, arg, "<what> = a·b does not fit 64 bits") — a wrapped product would
// pass a shape comparison or size a buffer too small. Validators bound each value first, so these
// are the backstop for values no bound covers (a tensor's own dims, a plan edited by hand).
int64_t checked_mul(const char* entry, const char* arg, const char* what, int64_t a, int64_t b);
int64_t checked_add(const char* entry, const char* arg, const char* what, int64_t a, int64_t b);
// The bytes of `t` (every dim >= 0, the product checked), or fail(entry, arg, ...).
int64_t checked_bytes(const char* entry, const char* arg, const Tensor& t);

// A given tensor of this dtype and exactly this shape, with a non-null, 16-byte aligned pointer
// (the kernels move 16-byte vectors). An empty shape (numel 0) may have a null pointer.
void expect_tensor(const char* entry, const char* arg, const Tensor& t, DType dtype,
                   std::initializer_list<int64_t> shape);
// Same, but the argument may be absent (Tensor{}); returns whether it was given.
bool expect_optional(const char* entry, const char* arg, const Tensor& t, DType dtype,
                     std::initializer_list<int64_t> shape);
// T >= 0, H and F positive multiples of 8 up to kMaxHidden / kMaxInter, E in [1, kMaxExperts], k in
// [1, min(kMaxTopk, E)], and the worst-case layout within kMaxLayoutRows (int32 sorted_ids). Each
// bound is checked before any product of the values is formed; errors state the bound.
void expect_shape(const MoeShape& s, const char* entry);
// What a precision adds to the shape: fp8 rows of e4m3 are 16-byte vectors, so H and F are
// multiples of 16.
void expect_shape_precision(const MoeShape& s, Precision precision, const char* entry);
void expect_workspace(const ForwardPlan& plan, const Workspace& ws, const char* entry);
// An expert weight [E, rows, cols] of the plan's precision: bf16 without a scale, or e4m3 with its
// block scales [E, scale rows, ceil(cols/128)] f32 (w13: 2·ceil(F/128) scale rows for 2F rows —
// gate and up blocked apart; w2: ceil(H/128)).
void expect_expert_weights(const char* entry, const ForwardPlan& plan, const char* w_arg, const Tensor& w,
                           const char* scale_arg, const Tensor& scale, int64_t rows, int64_t cols, int64_t scale_rows);
// The plan's choices can run its shape: its configs agree on block_m, split-K is in range, and its
// router's and align's kernels can take the shape (a plan made for another shape and edited after
// plan_forward is refused: "plan again").
void expect_plan(const ForwardPlan& plan, const char* entry);
// What sizing a plan's workspace needs of it (workspace_bytes, carve_workspace): a valid shape,
// block_m >= 1 and down_splits >= 1. Less than expect_plan, so a plan edited after planning can
// still be sized and handed to an entry, which refuses it by name.
void expect_plan_sizes(const ForwardPlan& plan, const char* entry);
// moekit's kernels are built for sm_90a: the device must be a Hopper.
void expect_hopper(const DeviceInfo& device, const char* entry);

// A named byte range [begin, end) of memory, for the checks that one buffer does not alias
// another; of tensors already validated (their byte counts fit). An absent or empty tensor's span
// is empty, and an empty span overlaps nothing.
struct Span {
  const char* name;
  uintptr_t begin, end;
};
Span span_of(const char* name, const Tensor& t);
Span span_of(const char* name, const void* base, size_t bytes);
bool overlap(const Span& a, const Span& b);
// The training forward's h (plan.save_h): [max_rows, 2F] bf16, sharing no byte with `others`;
// refused ('h') when the plan does not save it.
void expect_saved_h(const char* entry, const ForwardPlan& plan, const Tensor& h, const std::vector<Span>& others);

// The opt-in load counter (moe.hpp, "Load statistics"): absent, or [E] i64 with a non-null,
// 8-byte aligned pointer (its elements are added to one at a time: no 16-byte vectors), sharing
// no byte with `others` — every buffer the entry reads or writes, since the counter is added to
// while they are in use. Every failure names 'expert_load'. Returns whether it was given.
bool expect_expert_load(const char* entry, const Tensor& expert_load, int64_t experts,
                        const std::vector<Span>& others);

}  // namespace moekit::detail
