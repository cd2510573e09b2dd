// reference_misc_test.cpp — the CPU oracle of stage 5 (ref::combine), the naive expert FFN
// (ref::expert_act, expert_down_row, moe_tokens) the GEMMs are measured against, and
// ref::rel_norm_error.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu_test_util.hpp"
#include "moekit/reference.hpp"

namespace moekit::testing {
namespace {

using RefCombine = Seeded;
using RefExperts = Seeded;
using ref::bf16;

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ref::to_bf16(v[i]);
  return out;
}

TEST(RefCombineHand, SumsInSlotOrderInFp32ThenRoundsOnce) {
  // H 8; column 0 of each token shows one rule, the other columns are simple sums.
  //  token 0 (k 3): 2^24 + 1 + (-2^24) in slot order: 2^24 + 1 rounds to 2^24 (tie to even),
  //                 so the sum is 0, though any other order gives 1.
  //  token 1: 1 + 2^-8 is exact in FP32 and a bf16 tie: rounds to the even 1.0.
  //  token 2: 1 + 1.5*2^-8 is exact in FP32, 0.75 bf16 ulp above 1: rounds up to 1 + 2^-7.
  const int64_t T = 3, k = 3, H = 8;
  std::vector<float> rows(T * k * H, 0.0f);
  auto at = [&](int64_t t, int64_t j, int64_t h) -> float& { return rows[(t * k + j) * H + h]; };
  at(0, 0, 0) = 0x1p24f, at(0, 1, 0) = 1.0f, at(0, 2, 0) = -0x1p24f;
  at(1, 0, 0) = 1.0f, at(1, 2, 0) = 0x1p-8f;
  at(2, 1, 0) = 1.0f, at(2, 2, 0) = 1.5f * 0x1p-8f;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 1; h < H; ++h)
      for (int64_t j = 0; j < k; ++j) at(t, j, h) = float(h * (j + 1) - t);
  const std::vector<bf16> y = ref::combine(to_bf16(rows).data(), T, k, H);
  EXPECT_EQ(y[0 * H], ref::to_bf16(0.0f));
  EXPECT_EQ(y[1 * H], ref::to_bf16(1.0f));
  EXPECT_EQ(y[2 * H], ref::to_bf16(1.0f + 0x1p-7f));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 1; h < H; ++h) EXPECT_EQ(ref::to_float(y[t * H + h]), float(6 * h - 3 * t));
}

TEST(RefCombineHand, Top2) {
  // k 2: y = bf16(a + b); 3 + 0.5 = 3.5 exact; 256 + 1 = 257 is a bf16 tie: to the even 256.
  const std::vector<float> rows = {3.0f, 256.0f, 0, 0, 0, 0, 0, 0, 0.5f, 1.0f, 0, 0, 0, 0, 0, 0};
  const std::vector<bf16> y = ref::combine(to_bf16(rows).data(), 1, 2, 8);
  EXPECT_EQ(ref::to_float(y[0]), 3.5f);
  EXPECT_EQ(ref::to_float(y[1]), 256.0f);
}

TEST_F(RefCombine, EqualsASlotOrderSumBitwise) {
  for (int64_t k : {1, 2, 8, 16}) {
    const int64_t T = 9, H = 64;
    std::vector<bf16> rows(T * k * H);
    for (bf16& v : rows) v = ref::to_bf16(std::ldexp(uniform(-1.0f, 1.0f), int(uniform_int(-8, 8))));
    const std::vector<bf16> y = ref::combine(rows.data(), T, k, H);
    ASSERT_EQ(y.size(), size_t(T * H));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float s = 0.0f;
        for (int64_t j = 0; j < k; ++j) s += ref::to_float(rows[(t * k + j) * H + h]);
        ASSERT_EQ(y[t * H + h], ref::to_bf16(s)) << "k " << k << " t " << t << " h " << h;
      }
  }
  EXPECT_TRUE(ref::combine(nullptr, 0, 4, 64).empty());
}

// ---- expert FFN -----------------------------------------------------------------------------

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// A layer whose output has a closed form (H 8, F 8, E 2, k 1; weights 0, ±1, small integers):
//  expert 0: gate row f = (f - 4) at h 0, up row f = 1 at h 1, w2 = identity
//            -> y[h] = w * silu(x0 * (h - 4)) * x1
//  expert 1: gate row f = 1 at h f, up row f = 2 at h f, w2[h][f] = -1 where f = 7 - h
//            -> y[h] = -w * 2 * x[7-h] * silu(x[7-h])
struct TinyLayer {
  static constexpr int64_t H = 8, F = 8, E = 2;
  std::vector<bf16> w13 = std::vector<bf16>(E * 2 * F * H, ref::to_bf16(0.0f));
  std::vector<bf16> w2 = std::vector<bf16>(E * H * F, ref::to_bf16(0.0f));
  TinyLayer() {
    auto set13 = [&](int64_t e, int64_t row, int64_t h, float v) { w13[(e * 2 * F + row) * H + h] = ref::to_bf16(v); };
    auto set2 = [&](int64_t e, int64_t h, int64_t f, float v) { w2[(e * H + h) * F + f] = ref::to_bf16(v); };
    for (int64_t f = 0; f < F; ++f) {
      set13(0, f, 0, float(f - 4));
      set13(0, F + f, 1, 1.0f);
      set2(0, f, f, 1.0f);
      set13(1, f, f, 1.0f);
      set13(1, F + f, f, 2.0f);
      set2(1, 7 - f, f, -1.0f);
    }
  }
};

TEST(RefExpertsHand, TinyLayerHasItsClosedForm) {
  const TinyLayer L;
  const int64_t H = TinyLayer::H;
  const std::vector<float> xf = {2, 3, 0, 0, 0, 0, 0, 0,     // token 0 -> expert 0, w 1
                                 1, -1, 2, 0, 3, -2, 1, 1,   // token 1 -> expert 1, w 0.5
                                 -1, 2, 5, 5, 5, 5, 5, 5};   // token 2 -> expert 0, w 0.25
  const std::vector<bf16> x = to_bf16(xf);
  const std::vector<int32_t> ids = {0, 1, 0};
  const std::vector<float> w = {1.0f, 0.5f, 0.25f};
  const MoeShape shape{3, H, TinyLayer::F, TinyLayer::E, 1};
  const std::vector<double> y = ref::moe_tokens(shape, x.data(), L.w13.data(), L.w2.data(), ids.data(),
                                                w.data(), {0, 1, 2});
  ASSERT_EQ(y.size(), size_t(3 * H));
  for (int64_t h = 0; h < H; ++h) {
    const double x1 = xf[8 + 7 - h];
    const double want[3] = {1.0 * silu(2.0 * double(h - 4)) * 3.0,  //
                            -0.5 * 2.0 * x1 * silu(x1),              //
                            0.25 * silu(-1.0 * double(h - 4)) * 2.0};
    for (int t = 0; t < 3; ++t)
      EXPECT_NEAR(y[t * H + h], want[t], 1e-12 * (1.0 + std::fabs(want[t]))) << "t " << t << " h " << h;
  }
  // A subset, in the order asked for.
  const std::vector<double> y20 = ref::moe_tokens(shape, x.data(), L.w13.data(), L.w2.data(), ids.data(),
                                                  w.data(), {2, 0});
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_EQ(y20[h], y[2 * H + h]);
    EXPECT_EQ(y20[H + h], y[h]);
  }
  // expert_act alone: token 1 through expert 1 gives act[f] = silu(x_f) * 2 x_f.
  const std::vector<double> act = ref::expert_act(x.data() + H, L.w13.data() + 2 * TinyLayer::F * H, H, TinyLayer::F);
  for (int64_t f = 0; f < TinyLayer::F; ++f)
    EXPECT_NEAR(act[f], silu(xf[8 + f]) * 2.0 * xf[8 + f], 1e-12);
}

TEST_F(RefExperts, ActAndDownRowComposeToMoeTokens) {
  // expert_down_row takes the activation rounded to bf16 (as the GPU stores it); moe_tokens keeps
  // it in double. With every input positive there is no cancellation, so each output differs by
  // at most the bf16 rounding of the activations: relative 2^-8 (plus 2^-24 for rounding the
  // double to float first).
  const int64_t T = 5, H = 64, F = 32, E = 4, k = 2;
  const MoeShape shape{T, H, F, E, k};
  std::vector<bf16> x(T * H), w13(E * 2 * F * H), w2(E * H * F);
  for (bf16& v : x) v = ref::to_bf16(uniform(0.0f, 1.0f));
  for (bf16& v : w13) v = ref::to_bf16(uniform(0.0f, 0.1f));
  for (bf16& v : w2) v = ref::to_bf16(uniform(0.0f, 1.0f));
  std::vector<int32_t> ids(T * k);
  std::vector<float> w(T * k);
  for (int64_t t = 0; t < T; ++t) {
    ids[t * k] = int32_t(uniform_int(0, E - 1));
    ids[t * k + 1] = int32_t((ids[t * k] + uniform_int(1, E - 1)) % E);
    w[t * k] = uniform(0.1f, 1.0f);
    w[t * k + 1] = uniform(0.1f, 1.0f);
  }
  std::vector<int64_t> all(T);
  for (int64_t t = 0; t < T; ++t) all[t] = t;
  const std::vector<double> y = ref::moe_tokens(shape, x.data(), w13.data(), w2.data(), ids.data(), w.data(), all);
  const double bound = 0x1p-8 + 0x1p-24;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> sum(H, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      const std::vector<double> act = ref::expert_act(x.data() + t * H, w13.data() + e * 2 * F * H, H, F);
      std::vector<bf16> act_bf16(F);
      for (int64_t f = 0; f < F; ++f) act_bf16[f] = ref::to_bf16(float(act[f]));
      const std::vector<double> part = ref::expert_down_row(act_bf16.data(), w2.data() + e * H * F, w[t * k + j], H, F);
      for (int64_t h = 0; h < H; ++h) sum[h] += part[h];
    }
    for (int64_t h = 0; h < H; ++h)
      ASSERT_NEAR(sum[h], y[t * H + h], bound * y[t * H + h]) << "t " << t << " h " << h;
  }
}

// ---- rel_norm_error -------------------------------------------------------------------------

TEST(RefRelNormError, Basics) {
  const std::vector<double> b = {1.0, 2.0, 5.0};
  EXPECT_EQ(ref::rel_norm_error(b, b), 0.0);
  EXPECT_DOUBLE_EQ(ref::rel_norm_error({1.0, 2.0, 3.0}, b), std::sqrt(4.0 / 30.0));
  EXPECT_DOUBLE_EQ(ref::rel_norm_error({3.0, 4.0}, {0.0, 0.0}), 5.0);  // zero reference: absolute
  EXPECT_EQ(ref::rel_norm_error({}, {}), 0.0);
  EXPECT_EQ(ref::rel_norm_error({1.0, std::nan(""), 5.0}, b), std::numeric_limits<double>::infinity());
  EXPECT_EQ(ref::rel_norm_error({1.0, INFINITY, 5.0}, b), std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace moekit::testing
