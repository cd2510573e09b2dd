// validate.hpp — argument checks at the public boundary. Each failure throws moekit::Error with
// "<entry>: argument '<name>': expected ..., got ..." so the caller knows what to fix.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "moekit/moe.hpp"

namespace moekit::detail {

[[noreturn]] void fail(const char* entry, const char* arg, const std::string& what);

// A given tensor of this dtype and exactly this shape, with a non-null, 16-byte aligned pointer
// (the kernels move 16-byte vectors). An empty shape (numel 0) may have a null pointer.
void expect_tensor(const char* entry, const char* arg, const Tensor& t, DType dtype,
                   std::initializer_list<int64_t> shape);
// Same, but the argument may be absent (Tensor{}); returns whether it was given.
bool expect_optional(const char* entry, const char* arg, const Tensor& t, DType dtype,
                     std::initializer_list<int64_t> shape);
void expect_shape(const MoeShape& s, const char* entry);
void expect_workspace(const ForwardPlan& plan, const Workspace& ws, const char* entry);
// carve_workspace with the buffer's errors under the caller's argument names (the whole-layer
// entries take `workspace` / `workspace_bytes`).
Workspace carve_named(const ForwardPlan& plan, void* base, size_t bytes, const char* entry,
                      const char* base_arg, const char* bytes_arg);
// The plan still fits its shape (a plan edited after plan_forward would size buffers wrongly).
void expect_plan(const ForwardPlan& plan, const char* entry);

}  // namespace moekit::detail
