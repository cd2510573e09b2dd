// canon_test.cpp — the arithmetic the router/combine kernels and the CPU oracle share bit for bit
// (src/common/canon.hpp): exp, bf16 rounding, the 32-lane butterfly, the selection order.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/canon.hpp"
#include "cpu_test_util.hpp"

namespace moekit::testing {
namespace {

using CanonBf16 = Seeded;
using CanonTreeSum = Seeded;

// canon.hpp promises canon::exp within 2 ulp of exp; the reference is exp in double rounded
// once to float (correctly rounded but for double-rounding cases far below an ulp).
constexpr int64_t kExpMaxUlp = 2;

int64_t exp_error_ulp(float x) {
  return ulp_distance(canon::exp(x), float(std::exp(double(x))));
}

TEST(CanonExp, Within2UlpOverTheWholeRangeEvenlyInFloats) {
  // Every 61st float of [-87, 88]: ~36 M points, as dense near 0 as near the ends.
  int64_t worst = 0;
  float worst_x = 0.0f;
  for (int64_t o = ordered(-87.0f); o <= ordered(88.0f); o += 61) {
    const float x = from_ordered(o);
    const int64_t err = exp_error_ulp(x);
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, kExpMaxUlp) << "worst at x = " << worst_x;
}

TEST(CanonExp, Within2UlpOverTheWholeRangeEvenlyInValue) {
  // Steps of 2^-14 over [-87, 88] (every representable step of that size is exact in float).
  int64_t worst = 0;
  float worst_x = 0.0f;
  for (float x = -87.0f; x <= 88.0f; x += 0x1p-14f) {
    const int64_t err = exp_error_ulp(x);
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, kExpMaxUlp) << "worst at x = " << worst_x;
  EXPECT_LE(exp_error_ulp(-87.0f), kExpMaxUlp);
  EXPECT_LE(exp_error_ulp(88.0f), kExpMaxUlp);
}

TEST(CanonExp, ExactAndSpecialValues) {
  EXPECT_EQ(bits_of(canon::exp(0.0f)), bits_of(1.0f));
  EXPECT_EQ(bits_of(canon::exp(-0.0f)), bits_of(1.0f));
  EXPECT_TRUE(std::isnan(canon::exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(canon::exp(89.0f), std::numeric_limits<float>::infinity());  // above 88: +inf
  EXPECT_EQ(canon::exp(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(canon::exp(-88.0f), 0.0f);  // below -87: flushed to 0 (no subnormals)
  EXPECT_EQ(canon::exp(-std::numeric_limits<float>::infinity()), 0.0f);
  // Results stay normal floats at the low end of the range.
  EXPECT_EQ(std::fpclassify(canon::exp(-87.0f)), FP_NORMAL);
}

TEST(CanonSigmoid, HandValues) {
  EXPECT_EQ(canon::sigmoid(0.0f), 0.5f);  // 1 / (1 + exp(0)), every step exact
  for (float x : {-10.0f, -1.0f, 0.25f, 3.0f, 12.0f})
    EXPECT_NEAR(canon::sigmoid(x), 1.0 / (1.0 + std::exp(-double(x))), 1e-6) << "x = " << x;
}

// ---- bf16 -----------------------------------------------------------------------------------

TEST_F(CanonBf16, HandRoundingCases) {
  auto to = [](uint32_t u) { return canon::float_to_bf16_bits(float_of(u)); };
  EXPECT_EQ(to(0x3f800000u), 0x3f80);  // 1.0 is exact
  EXPECT_EQ(to(0x3f807fffu), 0x3f80);  // just below the halfway point: down
  EXPECT_EQ(to(0x3f808000u), 0x3f80);  // tie, 0x3f80 is even: down
  EXPECT_EQ(to(0x3f808001u), 0x3f81);  // just above the halfway point: up
  EXPECT_EQ(to(0x3f818000u), 0x3f82);  // tie, 0x3f81 is odd: up to the even 0x3f82
  EXPECT_EQ(to(0xbf808000u), 0xbf80);  // ties to even for negatives too
  EXPECT_EQ(to(0xbf818000u), 0xbf82);
  EXPECT_EQ(to(0x00008000u), 0x0000);  // subnormal tie: down to +0
  EXPECT_EQ(to(0x00018000u), 0x0002);  // subnormal tie: up to even
  EXPECT_EQ(to(0x80000000u), 0x8000);  // -0 keeps its sign
  EXPECT_EQ(to(0x7f800000u), 0x7f80);  // +inf
  EXPECT_EQ(to(0xff800000u), 0xff80);  // -inf
  EXPECT_EQ(to(0x7f7fffffu), 0x7f80);  // FLT_MAX rounds up to +inf (as IEEE RNE does)
  EXPECT_EQ(to(0x7f7f7fffu), 0x7f7f);  // below the halfway point to inf: largest finite bf16
  EXPECT_EQ(canon::bf16_bits_to_float(0x3f80), 1.0f);
  EXPECT_EQ(canon::bf16_bits_to_float(0xc0a0), -5.0f);
}

TEST_F(CanonBf16, NanStaysNan) {
  const uint16_t b_bits[] = {
      canon::float_to_bf16_bits(float_of(0x7fc00000u)),  // quiet NaN
      canon::float_to_bf16_bits(float_of(0x7f800001u)),  // NaN whose payload is in the low 16 bits
      canon::float_to_bf16_bits(float_of(0xff800001u)),
      canon::float_to_bf16_bits(float_of(0x7fffffffu)),  // would carry into the sign if rounded
      canon::float_to_bf16_bits(float_of(0xffffffffu))};
  for (uint16_t b : b_bits) EXPECT_TRUE(std::isnan(canon::bf16_bits_to_float(b))) << std::hex << b;
  EXPECT_EQ(canon::float_to_bf16_bits(float_of(0xff800001u)) & 0x8000, 0x8000);  // sign kept
}

TEST_F(CanonBf16, EveryBf16RoundTrips) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const float f = canon::bf16_bits_to_float(uint16_t(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(canon::float_to_bf16_bits(f), b) << std::hex << b;
  }
}

// The nearest bf16 of a finite float, ties to even, from the distances to the two neighbours
// (independent of canon's bit trick); beyond the largest finite bf16 the upper neighbour is inf,
// counted as 2^128 as IEEE rounding does.
uint16_t nearest_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0xffffu) == 0) return uint16_t(u >> 16);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // magnitude below and above
  const double mag = std::fabs(double(f));
  const double lo_mag = std::fabs(double(float_of(lo)));
  const double hi_mag = (hi & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128) : std::fabs(double(float_of(hi)));
  if (mag - lo_mag < hi_mag - mag) return uint16_t(lo >> 16);
  if (hi_mag - mag < mag - lo_mag) return uint16_t(hi >> 16);
  return ((lo >> 16) & 1u) == 0 ? uint16_t(lo >> 16) : uint16_t(hi >> 16);
}

TEST_F(CanonBf16, RandomFloatsRoundToNearestEven) {
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t u = any_bits(rng);
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // a quarter exact ties
    const float f = float_of(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(canon::float_to_bf16_bits(f), nearest_bf16(f)) << std::hex << "bits 0x" << u;
  }
}

// ---- the 32-lane butterfly ------------------------------------------------------------------

// Lane 0's view of the xor-16, 8, 4, 2, 1 shuffle reduction, written out level by level.
float butterfly_by_hand(const float (&v)[32]) {
  float a[16], b[8], c[4], d[2];
  for (int i = 0; i < 16; ++i) a[i] = v[i] + v[i + 16];
  for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
  for (int i = 0; i < 2; ++i) d[i] = c[i] + c[i + 2];
  return d[0] + d[1];
}

TEST_F(CanonTreeSum, EqualsTheButterflyBitwise) {
  for (int trial = 0; trial < 10000; ++trial) {
    float v[32];
    // Magnitudes spread over 2^-20..2^20 so that the summation order shows in the result.
    for (float& x : v) x = std::ldexp(uniform(-1.0f, 1.0f), int(uniform_int(-20, 20)));
    ASSERT_EQ(bits_of(canon::tree_sum32(v)), bits_of(butterfly_by_hand(v))) << "trial " << trial;
  }
}

TEST(CanonTreeSumHand, OrderIsTheButterflyNotSequential) {
  // Sequentially (2^24 + 1) rounds to 2^24 and the sum ends at 0; the butterfly pairs lane 0
  // with lane 16 first (2^24 - 2^24 = 0), so lane 1's 1 survives.
  float v[32] = {};
  v[0] = 0x1p24f;
  v[1] = 1.0f;
  v[16] = -0x1p24f;
  float sequential = 0.0f;
  for (float x : v) sequential += x;
  EXPECT_EQ(sequential, 0.0f);
  EXPECT_EQ(canon::tree_sum32(v), 1.0f);
}

TEST(CanonRanksBefore, HigherScoreThenLowerIdThenNanLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(canon::ranks_before(2.0f, 5, 1.0f, 0));   // higher score wins
  EXPECT_FALSE(canon::ranks_before(1.0f, 0, 2.0f, 5));
  EXPECT_TRUE(canon::ranks_before(1.0f, 3, 1.0f, 4));   // tie: lower id wins
  EXPECT_FALSE(canon::ranks_before(1.0f, 4, 1.0f, 3));
  EXPECT_TRUE(canon::ranks_before(-1e30f, 9, nan, 0));  // any number beats NaN
  EXPECT_FALSE(canon::ranks_before(nan, 0, -1e30f, 9));
  EXPECT_TRUE(canon::ranks_before(nan, 1, nan, 2));     // NaN vs NaN: lower id
  EXPECT_TRUE(canon::ranks_before(0.0f, 1, -0.0f, 2));  // +0 == -0: lower id
  EXPECT_FALSE(canon::ranks_before(-0.0f, 2, 0.0f, 1));
}

}  // namespace
}  // namespace moekit::testing
