// internal.hpp — what the oracle's translation units share (not part of the public oracle).
#pragma once

#include <cmath>

namespace moekit::ref::internal {

// SiLU in double: the expert FFN's gate in every oracle (bf16: reference.cpp, FP8: fp8.cpp).
inline double silu(double v) { return v / (1.0 + std::exp(-v)); }

}  // namespace moekit::ref::internal
