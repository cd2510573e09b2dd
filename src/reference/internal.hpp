// internal.hpp — what the oracle's translation units share (not part of the public oracle).
#pragma once

#include <cmath>

namespace moekit::ref::internal {

// SiLU in double: the expert FFN's gate in every oracle (bf16: reference.cpp, FP8: fp8.cpp).
inline double silu(double v) { return v / (1.0 + std::exp(-v)); }
inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
// d silu / dv = σ(v)·(1 + v·(1 − σ(v))): the backward's gate gradient (backward.cpp).
inline double silu_grad(double v) {
  const double s = sigmoid(v);
  return s * (1.0 + v * (1.0 - s));
}

}  // namespace moekit::ref::internal
