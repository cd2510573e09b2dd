// backward_fd.hpp — what the CPU tests of the backward oracle share (backward_*reference_test.cpp):
// Richardson-extrapolated central differences, steps that are exact in bf16, random layers on a
// coarse grid, and the comparison of a gradient with its finite differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_test_util.hpp"
#include "moekit/reference.hpp"

namespace moekit::testing {

using ref::bf16;

// dL/dv by Richardson's extrapolation of two central differences, D(s) = (L(v+s) − L(v−s)) / 2s:
// R = (4·D(h) − D(2h)) / 3 = L'(v) − h⁴·L⁽⁵⁾(ξ)/30, plus the rounding of L, about 4ε·|L|/h.
// set(v') puts v' in place (and must hold it exactly); set(v) restores it.
template <class Set, class Loss>
double richardson(double v, double h, Set&& set, Loss&& loss) {
  auto at = [&](double step) {
    set(v + step);
    return loss();
  };
  const double d1 = (at(h) - at(-h)) / (2 * h);
  const double d2 = (at(2 * h) - at(-2 * h)) / (4 * h);
  set(v);
  return (4 * d1 - d2) / 3;
}

// The steps of the bf16 inputs: inputs are multiples of 2^-5 in (-1, 1) and steps ±2^-8, ±2^-7,
// so every perturbed value is a multiple of 2^-8 below 1 in magnitude: 8 significant bits, exact
// in bf16 (bf16_setter checks it).
inline constexpr double kBf16Step = 0x1p-8;
inline auto bf16_setter(bf16& slot) {
  return [&slot](double v) {
    slot = ref::to_bf16(float(v));
    if (double(ref::to_float(slot)) != v) throw std::logic_error("finite-difference step not exact in bf16");
  };
}

// The bound on |oracle − finite difference| for x and the gate rows of w13, derived: Richardson's
// remainder is h⁴/30·|L⁽⁵⁾| with h = 2^-8 (h⁴/30 = 7.8e-12). Along one x or gate-weight element,
// L is a sum over at most T·k = 16 assignments (the tests' layers) and F = 8 units of
// w·c_f·silu(g_f)·u_f, with |w| <= 1, g_f and u_f affine in the element (slopes |x|, |W| < 1),
// |u_f| < H = 16, c_f = dy·W2_e[:, f] so |c_f| < 16, and |silu⁽ⁿ⁾| <= 1.1 for n <= 5:
// |L⁽⁵⁾| <= 128·16·1.1·(16 + 5) ≈ 4.7e4, a remainder <= 3.7e-7 (measured: 1e-10; the worst case
// needs every |u| and |c| at its maximum). The rounding of L (|L| < 1e3) adds 4ε·|L|/h < 3e-10.
// The up rows of w13, w2 and the routing weights enter L linearly (or, for up rows, through u
// alone), so their differences are exact up to that rounding. A wrong term of the math (a missing
// silu', w, or a transposed W; silu' off by 1%) is off by > 1e-3.
inline constexpr double kFdTol = 4e-7;

// Each analytic gradient within `tol` of its finite difference; the first few misses are named.
inline ::testing::AssertionResult close_to_fd(const std::string& what, const std::vector<double>& grad,
                                              const std::vector<double>& fd, double tol) {
  if (grad.size() != fd.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  int64_t misses = 0;
  std::string first;
  for (size_t i = 0; i < grad.size(); ++i)
    if (!(std::fabs(grad[i] - fd[i]) <= tol) && misses++ < 4)
      first += "\n  " + what + "[" + std::to_string(i) + "]: oracle " + std::to_string(grad[i]) + ", finite difference " +
               std::to_string(fd[i]);
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << misses << " of " << grad.size() << " beyond " << tol << first;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// A layer's tensors (shapes: moekit/moe.hpp) and the incoming gradient dy [T, H].
struct Layer {
  MoeShape s;
  std::vector<bf16> x, w13, w2, dy;
  std::vector<int32_t> ids;    // [T, k]
  std::vector<float> weights;  // [T, k]
};

class BackwardTest : public Seeded {
 protected:
  // A multiple of 2^-5 in (-1, 1): exact in bf16 and in FP32, with room for kBf16Step.
  double grid() { return double(uniform_int(-31, 31)) / 32; }
  bf16 grid_bf16() { return ref::to_bf16(float(grid())); }
  std::vector<bf16> grid_bf16s(int64_t n) {
    std::vector<bf16> v(static_cast<size_t>(n));
    for (bf16& b : v) b = grid_bf16();
    return v;
  }
  // k distinct experts per token, weights multiples of 2^-5 in (0, 1].
  Layer random_layer(const MoeShape& s) {
    Layer l{s, grid_bf16s(s.tokens * s.hidden), grid_bf16s(s.experts * 2 * s.inter * s.hidden),
            grid_bf16s(s.experts * s.hidden * s.inter), grid_bf16s(s.tokens * s.hidden), {}, {}};
    std::vector<int32_t> perm(static_cast<size_t>(s.experts));
    for (int64_t t = 0; t < s.tokens; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < s.topk; ++j) {
        l.ids.push_back(perm[size_t(j)]);
        l.weights.push_back(float(uniform_int(1, 32)) / 32);
      }
    }
    return l;
  }
};

// Σ_t ⟨dy_t, y_t⟩ with y from the forward oracle (ref::moe_tokens, every token): the loss whose
// gradients ref::moe_backward returns.
inline double layer_loss(const Layer& l) {
  std::vector<int64_t> all(static_cast<size_t>(l.s.tokens));
  std::iota(all.begin(), all.end(), int64_t(0));
  const std::vector<double> y =
      ref::moe_tokens(l.s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(), l.weights.data(), all);
  double loss = 0;
  for (size_t i = 0; i < y.size(); ++i) loss += double(ref::to_float(l.dy[i])) * y[i];
  return loss;
}

// The finite differences of layer_loss over every element of one bf16 tensor of the layer.
inline std::vector<double> fd_over(Layer& l, std::vector<bf16>& tensor) {
  std::vector<double> fd(tensor.size());
  for (size_t i = 0; i < tensor.size(); ++i)
    fd[i] = richardson(double(ref::to_float(tensor[i])), kBf16Step, bf16_setter(tensor[i]), [&] { return layer_loss(l); });
  return fd;
}

}  // namespace moekit::testing
