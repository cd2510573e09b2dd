// backward_reference_test.cpp — the CPU oracle of the experts' backward (ref::moe_backward): every
// gradient against finite differences of the forward oracle (ref::moe_tokens), the adversarial
// routings (empty experts, every token on one expert, ids outside [0, E)) and the listed-token
// contract. The router's oracle is tested in backward_router_reference_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backward_fd.hpp"

namespace moekit::testing {
namespace {

using RefMoeBackward = BackwardTest;

void expect_matches_fd(Layer& l) {
  const ref::MoeGrads g = ref::moe_backward(l.s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                            l.weights.data(), l.dy.data());
  ASSERT_EQ(g.dx.size(), l.x.size());
  ASSERT_EQ(g.dw13.size(), l.w13.size());
  ASSERT_EQ(g.dw2.size(), l.w2.size());
  ASSERT_EQ(g.d_topk_weights.size(), l.weights.size());
  EXPECT_TRUE(close_to_fd("dx", g.dx, fd_over(l, l.x), kFdTol));
  EXPECT_TRUE(close_to_fd("dw13", g.dw13, fd_over(l, l.w13), kFdTol));
  EXPECT_TRUE(close_to_fd("dw2", g.dw2, fd_over(l, l.w2), kFdTol));
  std::vector<double> fd_w(l.weights.size());
  for (size_t i = 0; i < l.weights.size(); ++i) {
    float& slot = l.weights[i];
    fd_w[i] = richardson(double(slot), kBf16Step, [&](double v) { slot = float(v); }, [&] { return layer_loss(l); });
  }
  EXPECT_TRUE(close_to_fd("d_topk_weights", g.d_topk_weights, fd_w, kFdTol));
  // The gradients are not vanishingly small next to the bound (the check would be empty).
  EXPECT_GT(max_abs(g.dx), 1e3 * kFdTol);
  EXPECT_GT(max_abs(g.dw13), 1e3 * kFdTol);
  EXPECT_GT(max_abs(g.d_topk_weights), 1e3 * kFdTol);
}

TEST_F(RefMoeBackward, MatchesFiniteDifferencesOfTheForwardOracle) {
  Layer l = random_layer(MoeShape{5, 16, 8, 4, 2});
  expect_matches_fd(l);
}

TEST_F(RefMoeBackward, AllTokensOnOneExpert) {
  // k 1, every token on expert 2: the other experts have no rows and get exact zeros; expert 2's
  // gradients still match the finite differences.
  Layer l = random_layer(MoeShape{5, 16, 8, 4, 1});
  for (int32_t& e : l.ids) e = 2;
  expect_matches_fd(l);
  const ref::MoeGrads g = ref::moe_backward(l.s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                            l.weights.data(), l.dy.data());
  const int64_t F = l.s.inter, H = l.s.hidden;
  for (int64_t e : {0, 1, 3}) {
    for (int64_t i = 0; i < 2 * F * H; ++i) ASSERT_EQ(g.dw13[size_t(e * 2 * F * H + i)], 0.0) << "expert " << e;
    for (int64_t i = 0; i < H * F; ++i) ASSERT_EQ(g.dw2[size_t(e * H * F + i)], 0.0) << "expert " << e;
  }
}

TEST_F(RefMoeBackward, EmptyExpertsGetExactZeros) {
  // k 2, every token on experts 1 and 3 (in either slot order): experts 0 and 2 are empty.
  Layer l = random_layer(MoeShape{5, 16, 8, 4, 2});
  for (int64_t t = 0; t < l.s.tokens; ++t) {
    l.ids[size_t(2 * t)] = t % 2 ? 1 : 3;
    l.ids[size_t(2 * t + 1)] = t % 2 ? 3 : 1;
  }
  expect_matches_fd(l);
  const ref::MoeGrads g = ref::moe_backward(l.s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                            l.weights.data(), l.dy.data());
  const int64_t F = l.s.inter, H = l.s.hidden;
  for (int64_t e : {0, 2}) {
    for (int64_t i = 0; i < 2 * F * H; ++i) ASSERT_EQ(g.dw13[size_t(e * 2 * F * H + i)], 0.0) << "expert " << e;
    for (int64_t i = 0; i < H * F; ++i) ASSERT_EQ(g.dw2[size_t(e * H * F + i)], 0.0) << "expert " << e;
  }
  for (int64_t e : {1, 3}) {
    double norm = 0;
    for (int64_t i = 0; i < H * F; ++i) norm += std::fabs(g.dw2[size_t(e * H * F + i)]);
    EXPECT_GT(norm, 0.0) << "expert " << e;
  }
}

TEST_F(RefMoeBackward, WithoutWeightGradsDxAndTopkWeightsAreBitwiseTheSame) {
  const MoeShape s{6, 16, 8, 4, 2};
  Layer l = random_layer(s);
  const std::vector<int64_t> list = {5, 0, 3};
  const ref::MoeGrads with = ref::moe_backward(s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                               l.weights.data(), l.dy.data(), list);
  const ref::MoeGrads without = ref::moe_backward(s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                                  l.weights.data(), l.dy.data(), list, /*weight_grads=*/false);
  EXPECT_TRUE(without.dw13.empty() && without.dw2.empty());
  EXPECT_EQ(without.dx, with.dx);
  EXPECT_EQ(without.d_topk_weights, with.d_topk_weights);
}

TEST_F(RefMoeBackward, ListedTokensAreRowsOfTheWholeAndDwIsTheirsAlone) {
  const MoeShape s{6, 16, 8, 4, 2};
  Layer l = random_layer(s);
  const ref::MoeGrads all = ref::moe_backward(s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                              l.weights.data(), l.dy.data());
  const std::vector<int64_t> list = {4, 1};
  const ref::MoeGrads some = ref::moe_backward(s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                               l.weights.data(), l.dy.data(), list);
  ASSERT_EQ(some.dx.size(), list.size() * size_t(s.hidden));
  ASSERT_EQ(some.d_topk_weights.size(), list.size() * size_t(s.topk));
  // A token's rows are computed alone, the same operations in the same order: bitwise equal.
  for (size_t i = 0; i < list.size(); ++i) {
    for (int64_t c = 0; c < s.hidden; ++c)
      EXPECT_EQ(some.dx[i * size_t(s.hidden) + size_t(c)], all.dx[size_t(list[i] * s.hidden + c)]);
    for (int64_t j = 0; j < s.topk; ++j)
      EXPECT_EQ(some.d_topk_weights[i * size_t(s.topk) + size_t(j)], all.d_topk_weights[size_t(list[i] * s.topk + j)]);
  }
  // dW of the list is the whole layer's dW with dy zero outside it. The other tokens then add
  // exact zeros (their D, dh and dy are 0), and each expert sums at most one term per listed token,
  // two terms whose sum does not depend on their order: bitwise equal.
  Layer masked = l;
  for (int64_t t = 0; t < s.tokens; ++t)
    if (t != 4 && t != 1)
      for (int64_t c = 0; c < s.hidden; ++c) masked.dy[size_t(t * s.hidden + c)] = ref::to_bf16(0.0f);
  const ref::MoeGrads zeroed = ref::moe_backward(s, masked.x.data(), masked.w13.data(), masked.w2.data(),
                                                 masked.ids.data(), masked.weights.data(), masked.dy.data());
  EXPECT_EQ(some.dw13, zeroed.dw13);
  EXPECT_EQ(some.dw2, zeroed.dw2);
  // No token listed: empty rows, zero dW.
  const ref::MoeGrads none = ref::moe_backward(s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                               l.weights.data(), l.dy.data(), {});
  EXPECT_TRUE(none.dx.empty());
  EXPECT_EQ(none.dw2, std::vector<double>(size_t(s.experts * s.hidden * s.inter), 0.0));
}

TEST_F(RefMoeBackward, AnIdOutsideTheExpertsHasNoGradient) {
  // Align skips such an assignment (no row, kStatusExpertIdOutOfRange): slot 1 of tokens 0 and 2
  // (ids E and -1) then contributes nothing, and the layer's gradients are those of its slot 0
  // alone (a k = 1 layer), bitwise.
  const MoeShape s{3, 16, 8, 4, 2};
  Layer l = random_layer(s);
  l.ids[1] = int32_t(s.experts);
  l.ids[5] = -1;
  const ref::MoeGrads g = ref::moe_backward(s, l.x.data(), l.w13.data(), l.w2.data(), l.ids.data(),
                                            l.weights.data(), l.dy.data());
  EXPECT_EQ(g.d_topk_weights[1], 0.0);
  EXPECT_EQ(g.d_topk_weights[5], 0.0);
  EXPECT_NE(g.d_topk_weights[3], 0.0);
  // Token 0 alone, through slot 0 alone.
  const MoeShape one{1, 16, 8, 4, 1};
  Layer l0 = l;
  l0.s = one;
  l0.ids = {l.ids[0]};
  l0.weights = {l.weights[0]};
  const ref::MoeGrads g0 = ref::moe_backward(one, l0.x.data(), l0.w13.data(), l0.w2.data(), l0.ids.data(),
                                             l0.weights.data(), l0.dy.data());
  for (int64_t c = 0; c < s.hidden; ++c) EXPECT_EQ(g.dx[size_t(c)], g0.dx[size_t(c)]);
  EXPECT_EQ(g.d_topk_weights[0], g0.d_topk_weights[0]);
}

TEST(RefMoeBackwardHand, OneUnitHasItsClosedForm) {
  // H 8, F 8, E 1, k 1, only gate row 0 = e_0 and up row 0 = e_1 nonzero, w2[:, 0] = e_2: with x
  // = (a, b, ...), g = a, u = b, act = silu(a)·b, y_2 = w·act; dy = e_2: D = (1, 0, ...), so
  // dw = silu(a)·b, dg = w·b·silu'(a), du = w·silu(a), dx = (dg, du, 0, ...),
  // dW13[0][0] = dg·a, dW13[0][1] = dg·b (gate row), dW13[F][*] = du·x, dW2[2][0] = w·act.
  const int64_t H = 8, F = 8;
  const MoeShape s{1, H, F, 1, 1};
  std::vector<bf16> x(H, ref::to_bf16(0.0f)), w13(2 * F * H, ref::to_bf16(0.0f)), w2(H * F, ref::to_bf16(0.0f)),
      dy(H, ref::to_bf16(0.0f));
  const double a = 1.5, b = -0.75, w = 0.5;
  x[0] = ref::to_bf16(float(a)), x[1] = ref::to_bf16(float(b)), x[3] = ref::to_bf16(2.0f);
  w13[0 * H + 0] = ref::to_bf16(1.0f), w13[F * H + 1] = ref::to_bf16(1.0f), w2[2 * F + 0] = ref::to_bf16(1.0f);
  dy[2] = ref::to_bf16(1.0f);
  const int32_t id = 0;
  const float wf = float(w);
  const ref::MoeGrads g = ref::moe_backward(s, x.data(), w13.data(), w2.data(), &id, &wf, dy.data());
  const double sig = 1.0 / (1.0 + std::exp(-a)), silu = a * sig, dsilu = sig * (1 + a * (1 - sig));
  const double dg = w * b * dsilu, du = w * silu, tol = 1e-15;
  EXPECT_NEAR(g.d_topk_weights[0], silu * b, tol);
  EXPECT_NEAR(g.dx[0], dg, tol);
  EXPECT_NEAR(g.dx[1], du, tol);
  for (int64_t c = 2; c < H; ++c) EXPECT_EQ(g.dx[size_t(c)], 0.0);
  EXPECT_NEAR(g.dw13[0 * H + 0], dg * a, tol);
  EXPECT_NEAR(g.dw13[0 * H + 1], dg * b, tol);
  EXPECT_NEAR(g.dw13[0 * H + 3], dg * 2.0, tol);
  EXPECT_NEAR(g.dw13[F * H + 0], du * a, tol);
  EXPECT_NEAR(g.dw13[F * H + 3], du * 2.0, tol);
  EXPECT_EQ(g.dw13[1 * H + 0], 0.0);  // unit 1: D_1 = 0 (w2[:, 1] = 0), so dg_1 = du_1 = 0
  EXPECT_NEAR(g.dw2[2 * F + 0], w * silu * b, tol);
  EXPECT_EQ(g.dw2[0 * F + 0], 0.0);  // dy_0 = 0
}

}  // namespace
}  // namespace moekit::testing
