// sm90_limits.hpp — the Hopper limits that kernels' compile-time checks and the planner share.
#pragma once

#include <cstdint>

namespace moekit {

// Shared memory a block may opt into on every sm_90 part (H100 SXM/PCIe/NVL, H200, H800, H20:
// 227 KB). Every kernel's shared-memory layout is checked against it when it compiles; plans made
// without a device (plan_forward_with) size the router's kernels by it, plan_forward by the
// device's own value.
inline constexpr int64_t kSm90SmemPerBlockOptin = 227 * 1024;

}  // namespace moekit
