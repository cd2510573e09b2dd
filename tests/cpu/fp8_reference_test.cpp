// fp8_reference_test.cpp — the FP8 oracle (moekit/reference.hpp, "FP8"): the e4m3 conversions
// against the CUDA header's host conversions (cuda_fp8.h), the quantization contract of a group
// and of a weight block on its edge cases (zero, tiny, huge, NaN, Inf, partial), calc_diff, and
// moe_tokens_fp8 against a direct double computation.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu_test_util.hpp"
#include "moekit/reference.hpp"

namespace moekit::testing {
namespace {

using ref::fp8;
using RefFp8 = Seeded;

fp8 cuda_to_e4m3(float f) { return fp8(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)); }
float cuda_e4m3_to_float(fp8 q) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3))); }
bool is_nan_code(fp8 q) { return (q & 0x7f) == 0x7f; }
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Compares to_e4m3 with the CUDA header on every float given; reports the count and the first.
struct ConversionCheck {
  int64_t checked = 0, mismatches = 0;
  float first = 0;
  void operator()(float f) {
    ++checked;
    if (ref::to_e4m3(f) != cuda_to_e4m3(f) && mismatches++ == 0) first = f;
  }
  void expect_clean() const {
    EXPECT_EQ(mismatches, 0) << "of " << checked << "; first at " << first << " (bits 0x" << std::hex << bits_of(first)
                             << "): ours 0x" << int(ref::to_e4m3(first)) << ", cuda_fp8.h 0x" << int(cuda_to_e4m3(first));
  }
};

TEST(RefFp8Conversion, E4m3ToFloatOnAll256CodesMatchesCudaHeader) {
  for (int c = 0; c < 256; ++c) {
    const fp8 q = fp8(c);
    const float ours = ref::e4m3_to_float(q), theirs = cuda_e4m3_to_float(q);
    if (is_nan_code(q)) {
      EXPECT_TRUE(std::isnan(ours) && std::isnan(theirs)) << "code " << c;
      continue;
    }
    EXPECT_EQ(bits_of(ours), bits_of(theirs)) << "code " << c;  // -0 for 0x80 included
    EXPECT_EQ(ref::to_e4m3(ours), q) << "code " << c;            // exact values round-trip
  }
  EXPECT_EQ(ref::e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(ref::e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(ref::e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(ref::e4m3_to_float(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(ref::e4m3_to_float(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(ref::kFp8Max, 448.0f);
}

TEST(RefFp8Conversion, ToE4m3AroundEveryE4m3ValueMatchesCudaHeader) {
  // Between each pair of neighbouring magnitudes (0 and the smallest subnormal included, 448 and
  // 480 — the NaN pattern's value — on top): both ends, the midpoint (the ties, to even), 8 floats
  // either side of each, and 64 evenly spaced points; both signs.
  ConversionCheck check;
  std::vector<float> mags;
  for (int c = 0; c <= 0x7e; ++c) mags.push_back(ref::e4m3_to_float(fp8(c)));
  mags.push_back(480.0f);
  for (size_t i = 0; i + 1 < mags.size(); ++i) {
    const float lo = mags[i], hi = mags[i + 1], mid = lo + (hi - lo) / 2;  // exact
    for (float anchor : {lo, mid, hi})
      for (int64_t d = -8; d <= 8; ++d) {
        const float f = from_ordered(ordered(anchor) + d);
        check(f), check(-f);
      }
    for (int s = 1; s < 64; ++s) check(lo + (hi - lo) * float(s) / 64), check(-(lo + (hi - lo) * float(s) / 64));
  }
  check.expect_clean();
  EXPECT_EQ(ref::to_e4m3(0x1p-10f), 0x00);           // half the smallest subnormal: a tie, to even 0
  EXPECT_EQ(ref::to_e4m3(from_ordered(ordered(0x1p-10f) + 1)), 0x01);
  EXPECT_EQ(ref::to_e4m3(464.0f), 0x7e);             // the tie between 448 and 480: to even 448
  EXPECT_EQ(ref::to_e4m3(-0.0f), 0x80);
}

TEST(RefFp8Conversion, ToE4m3OnSpecialsSaturationAndFloatSubnormalsMatchesCudaHeader) {
  ConversionCheck check;
  for (float f : {0.0f, -0.0f, kInf, -kInf, kNaN, -kNaN, std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), 464.0f, -464.0f,
                  465.0f, 1e30f})
    check(f);
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu, 0xffffffffu}) check(float_of(u));  // NaNs
  // Every float subnormal and every float from 448 up to FLT_MAX, in steps.
  for (uint32_t u = 0; u < 0x00800000u; u += 97) check(float_of(u)), check(float_of(u | 0x80000000u));
  for (int64_t o = ordered(448.0f); o <= ordered(std::numeric_limits<float>::max()); o += 4099)
    check(from_ordered(o)), check(-from_ordered(o));
  check.expect_clean();
  EXPECT_EQ(ref::to_e4m3(kInf), 0x7e);
  EXPECT_EQ(ref::to_e4m3(-kInf), 0xfe);
  EXPECT_EQ(ref::to_e4m3(kNaN), 0x7f);
  EXPECT_EQ(ref::to_e4m3(-kNaN), 0x7f);
}

TEST_F(RefFp8, ToE4m3OnAnEvenSweepAndRandomBitPatternsMatchesCudaHeader) {
  ConversionCheck check;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 127) check(float_of(uint32_t(u)));  // ~34 M, every binade
  for (int i = 0; i < 3000000; ++i) check(float_of(uint32_t(rng())));
  for (int i = 0; i < 1000000; ++i) check(uniform(-500.0f, 500.0f));  // the finite range, densely
  check.expect_clean();
}

// ---- quantize_group -------------------------------------------------------------------------

// The dequantized group is within half an e4m3 step of v: 2^-4 relative in the normal range,
// 2^-10 · scale below it (subnormal steps are 2^-9 · scale).
void expect_dequantizes_close(const std::vector<float>& v, const std::vector<fp8>& q, float scale) {
  for (size_t i = 0; i < v.size(); ++i) {
    const double d = double(ref::e4m3_to_float(q[i])) * scale;
    EXPECT_LE(std::fabs(d - v[i]), std::max(0x1p-4 * std::fabs(v[i]), 0x1p-10 * scale) * (1 + 1e-6)) << "i " << i;
  }
}

TEST_F(RefFp8, GroupOfRandomValuesMapsItsAmaxTo448AndDequantizesClose) {
  for (int rep = 0; rep < 200; ++rep) {
    const int64_t n = uniform_int(1, 128);
    const int e = int(uniform_int(-60, 60));
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = std::ldexp(uniform(-1.0f, 1.0f), e);
    std::vector<fp8> q(size_t(n) + 4, 0x5a);  // bytes past n must stay
    const float scale = ref::quantize_group(v.data(), n, q.data());
    float amax = 0;
    size_t at = 0;
    for (size_t i = 0; i < v.size(); ++i)
      if (std::fabs(v[i]) > amax) amax = std::fabs(v[i]), at = i;
    const float a = std::max(amax, ref::kFp8AmaxFloor);
    ASSERT_EQ(scale, a / 448.0f);
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(q[i], ref::to_e4m3(v[i] * (448.0f / a))) << "i " << i;
    EXPECT_EQ(q[at] & 0x7f, 0x7e);  // |amax| · (448 / amax) rounds to 448
    for (size_t i = size_t(n); i < q.size(); ++i) EXPECT_EQ(q[i], 0x5a);
    q.resize(size_t(n));
    expect_dequantizes_close(v, q, scale);
  }
}

TEST(RefFp8Group, ZeroGroupGivesZerosAndTheFloorScale) {
  std::vector<float> v(128, 0.0f);
  for (size_t i = 1; i < v.size(); i += 2) v[i] = -0.0f;
  std::vector<fp8> q(128, 0x5a);
  EXPECT_EQ(ref::quantize_group(v.data(), 128, q.data()), 0x1p-100f / 448.0f);
  for (size_t i = 0; i < q.size(); ++i) EXPECT_EQ(q[i], i % 2 ? 0x80 : 0x00) << "i " << i;  // ±0 keep their sign
}

TEST(RefFp8Group, TinyGroupQuantizesAsIfItsAmaxWereTheFloor) {
  // amax 2^-101 < 2^-100: inv = 448 · 2^100, so 2^-101 -> 224 and 2^-104 -> 28 (both exact).
  const std::vector<float> v = {0x1p-101f, -0x1p-104f, 0.0f, 0x1p-140f};
  std::vector<fp8> q(4);
  EXPECT_EQ(ref::quantize_group(v.data(), 4, q.data()), 0x1p-100f / 448.0f);
  EXPECT_EQ(ref::e4m3_to_float(q[0]), 224.0f);
  EXPECT_EQ(ref::e4m3_to_float(q[1]), -28.0f);
  EXPECT_EQ(q[2], 0x00);
  EXPECT_EQ(q[3], 0x00);  // 2^-140 · 448 · 2^100 ≈ 4e-10: below half the smallest subnormal
}

TEST(RefFp8Group, HugeGroupKeepsFiniteScales) {
  const float fmax = std::numeric_limits<float>::max(), bf16_max = ref::to_float(0x7f7f);
  for (float big : {fmax, bf16_max}) {
    const std::vector<float> v = {-big, big / 2, 1.0f, big / 448};
    std::vector<fp8> q(4);
    const float scale = ref::quantize_group(v.data(), 4, q.data());
    EXPECT_TRUE(std::isfinite(scale)) << big;
    EXPECT_EQ(scale, big / 448.0f);
    EXPECT_EQ(q[0], 0xfe);
    EXPECT_EQ(ref::e4m3_to_float(q[1]), 224.0f);
    EXPECT_EQ(q[2], 0x00);  // 1 is far below this group's smallest step
    EXPECT_EQ(ref::e4m3_to_float(q[3]), 1.0f);
  }
}

TEST(RefFp8Group, NaNMakesTheScaleAndEveryByteNaN) {
  std::vector<float> v(128, 1.0f);
  v[37] = kNaN;
  std::vector<fp8> q(128);
  const float scale = ref::quantize_group(v.data(), 128, q.data());
  EXPECT_EQ(bits_of(scale), 0x7fffffffu);  // the GPU's NaN (src/common/fp8.cuh: max.NaN, div.rn)
  for (fp8 b : q) EXPECT_EQ(b, 0x7f);
  v[37] = -kNaN;
  EXPECT_EQ(bits_of(ref::quantize_group(v.data(), 128, q.data())), 0x7fffffffu);
}

TEST(RefFp8Group, InfMakesTheScaleInfAndTheOtherBytesZero) {
  for (float inf : {kInf, -kInf}) {
    const std::vector<float> v = {3.0f, inf, -2.0f, 0.0f, 448.0f};
    std::vector<fp8> q(5);
    EXPECT_EQ(ref::quantize_group(v.data(), 5, q.data()), kInf);  // inv = 448 / Inf = 0
    EXPECT_EQ(q[1], 0x7f);                                         // Inf · 0 = NaN
    EXPECT_EQ(q[0], 0x00);
    EXPECT_EQ(q[2], 0x80);  // -2 · 0 = -0
    EXPECT_EQ(q[3], 0x00);
    EXPECT_EQ(q[4], 0x00);
  }
}

// ---- quantize_tokens, quantize_weight_blocks ------------------------------------------------

TEST_F(RefFp8, TokensAreGroupsOf128ColumnsWithAPartialLastGroup) {
  const int64_t T = 3, H = 336, G = 3;  // groups of 128, 128, 80
  std::vector<ref::bf16> x(size_t(T * H));
  for (auto& b : x) b = ref::to_bf16(std::ldexp(uniform(-1.0f, 1.0f), int(uniform_int(-10, 10))));
  x[size_t(1 * H + 300)] = ref::to_bf16(kNaN);  // poisons row 1's last group only
  std::vector<fp8> q(size_t(T * H));
  std::vector<float> scale(size_t(T * G));
  ref::quantize_tokens(x.data(), T, H, q.data(), scale.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t c0 = g * 128, n = std::min<int64_t>(128, H - c0);
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = ref::to_float(x[size_t(t * H + c0 + i)]);
      std::vector<fp8> want(static_cast<size_t>(n));
      EXPECT_EQ(bits_of(scale[size_t(t * G + g)]), bits_of(ref::quantize_group(v.data(), n, want.data())));
      EXPECT_EQ(std::vector<fp8>(q.begin() + t * H + c0, q.begin() + t * H + c0 + n), want) << t << " " << g;
    }
  EXPECT_TRUE(std::isnan(scale[1 * G + 2]));
  EXPECT_FALSE(std::isnan(scale[1 * G + 1]));
}

TEST_F(RefFp8, WeightBlocksAre128x128WithPartialEdgesEachItsOwnAmax) {
  // 2 projections of [200, 336]: blocks of 128 and 72 rows by 128, 128 and 80 columns. Block
  // (p, rb, cb) holds values in [-1, 1] and one element of magnitude amax = 2^(p + rb + cb).
  const int64_t P = 2, R = 200, C = 336, RB = 2, CB = 3;
  std::vector<float> w(size_t(P * R * C));
  auto amax_of = [](int64_t p, int64_t rb, int64_t cb) { return std::ldexp(1.0f, int(p * 5 + rb * 3 + cb) + 1); };
  for (int64_t p = 0; p < P; ++p)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) w[size_t((p * R + r) * C + c)] = uniform(-1.0f, 1.0f);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t rb = 0; rb < RB; ++rb)
      for (int64_t cb = 0; cb < CB; ++cb) {  // the block's last element (a partial block's true edge)
        const int64_t r = std::min(R, (rb + 1) * 128) - 1, c = std::min(C, (cb + 1) * 128) - 1;
        w[size_t((p * R + r) * C + c)] = -amax_of(p, rb, cb);
      }
  w[size_t((1 * R + 150) * C + 20)] = kInf;  // block (1, 1, 0)
  w[size_t((0 * R + 5) * C + 300)] = kNaN;   // block (0, 0, 2)
  std::vector<fp8> q(w.size());
  std::vector<float> scale(size_t(P * RB * CB));
  ref::quantize_weight_blocks(w.data(), P, R, C, q.data(), scale.data());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t rb = 0; rb < RB; ++rb)
      for (int64_t cb = 0; cb < CB; ++cb) {
        SCOPED_TRACE("block " + std::to_string(p) + "," + std::to_string(rb) + "," + std::to_string(cb));
        const float s = scale[size_t((p * RB + rb) * CB + cb)];
        const bool inf = p == 1 && rb == 1 && cb == 0, nan = p == 0 && rb == 0 && cb == 2;
        if (nan) EXPECT_EQ(bits_of(s), 0x7fffffffu);
        else EXPECT_EQ(s, inf ? kInf : amax_of(p, rb, cb) / 448.0f);
        const float inv = nan ? kNaN : inf ? 0.0f : 448.0f / amax_of(p, rb, cb);
        for (int64_t r = rb * 128; r < std::min(R, rb * 128 + 128); ++r)
          for (int64_t c = cb * 128; c < std::min(C, cb * 128 + 128); ++c) {
            const size_t i = size_t((p * R + r) * C + c);
            ASSERT_EQ(q[i], ref::to_e4m3(w[i] * inv)) << "r " << r << " c " << c;
          }
      }
}

// ---- calc_diff ------------------------------------------------------------------------------

TEST(RefFp8CalcDiff, ZeroWhenEqualAndKnownValues) {
  const std::vector<double> a = {1.5, -2.0, 3.25, 1e-3};
  EXPECT_EQ(ref::calc_diff(a, a), 0.0);
  EXPECT_EQ(ref::calc_diff({0.0, 0.0}, {0.0, 0.0}), 0.0);  // both zero: equal
  EXPECT_EQ(ref::calc_diff({1.0, 0.0}, {0.0, 1.0}), 1.0);  // orthogonal
  EXPECT_EQ(ref::calc_diff({1.0}, {-1.0}), 2.0);           // opposite
  EXPECT_DOUBLE_EQ(ref::calc_diff({1.0, 1.0}, {1.0, 0.0}), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(ref::calc_diff({3.0}, {4.0}), 1.0 - 24.0 / 25.0);
  EXPECT_TRUE(std::isnan(ref::calc_diff({1.0, std::nan("")}, {1.0, 1.0})));
  EXPECT_THROW(ref::calc_diff({1.0}, {1.0, 2.0}), Error);
}

// ---- moe_tokens_fp8 -------------------------------------------------------------------------

double silu(double v) { return v / (1.0 + std::exp(-v)); }

TEST(RefFp8Experts, OneExpertWithAClosedForm) {
  // H = F = 16, E = k = 1. x = 1.0 · 0.5; gate row f = 2.0 at h = f (block scale 1), up row f =
  // 2.0 at h = f (its own block scale 0.25), w2 = identity · 2. So g = 1, u = 0.25 and every act is
  // silu(1) / 4: one group whose amax is each value, quantized to 448 · (act / 448) — exact but for
  // the scale's float rounding (2^-24) — and y[h] = weight · 2 · silu(1) / 4.
  const int64_t H = 16, F = 16;
  const std::vector<fp8> x_q(H, 0x38);
  const std::vector<float> x_scale = {0.5f}, w13_scale = {1.0f, 0.25f}, w2_scale = {2.0f};
  std::vector<fp8> w13(2 * F * H, 0x00), w2(H * F, 0x00);
  for (int64_t f = 0; f < F; ++f) w13[f * H + f] = w13[(F + f) * H + f] = 0x40, w2[f * F + f] = 0x38;
  const ref::Fp8Experts w{w13.data(), w13_scale.data(), w2.data(), w2_scale.data()};
  const std::vector<int32_t> ids = {0};
  const std::vector<float> weight = {0.75f};
  const std::vector<double> y = ref::moe_tokens_fp8(MoeShape{1, H, F, 1, 1}, x_q.data(), x_scale.data(), w, ids.data(),
                                                    weight.data(), {0});
  ASSERT_EQ(y.size(), size_t(H));
  for (int64_t h = 0; h < H; ++h) EXPECT_NEAR(y[h], 0.75 * 2 * silu(1.0) / 4, 1e-6) << "h " << h;
}

TEST_F(RefFp8, ExpertsEqualADirectDoubleComputation) {
  // H = F = 144: a partial second block in every dimension, and w13's up half keeps its own block
  // rows (2 of gate's, then 2 of up's). Random codes (no NaN) and power-of-two scales.
  const int64_t T = 3, H = 144, F = 144, E = 3, k = 2, hb = 2, fb = 2;
  auto codes = [&](size_t n) {
    std::vector<fp8> v(n);
    for (fp8& c : v) c = fp8(uniform_int(0, 0x7e) | (uniform_int(0, 1) << 7));
    return v;
  };
  auto scales = [&](size_t n, int lo, int hi) {
    std::vector<float> v(n);
    for (float& s : v) s = std::ldexp(1.0f, int(uniform_int(lo, hi)));
    return v;
  };
  const std::vector<fp8> x_q = codes(T * H), w13 = codes(E * 2 * F * H), w2 = codes(E * H * F);
  const std::vector<float> x_scale = scales(T * hb, -8, -4), s13 = scales(E * 2 * fb * hb, -10, -7),
                           s2 = scales(E * hb * fb, -10, -7);
  const std::vector<int32_t> ids = {0, 2, 1, 0, 2, 1};
  const std::vector<float> weight = {0.5f, 0.25f, 1.0f, 0.125f, 0.75f, 0.375f};
  const ref::Fp8Experts w{w13.data(), s13.data(), w2.data(), s2.data()};
  const std::vector<double> y = ref::moe_tokens_fp8(MoeShape{T, H, F, E, k}, x_q.data(), x_scale.data(), w, ids.data(),
                                                    weight.data(), {2, 0, 1});
  auto deq = [](fp8 q, float s) { return double(ref::e4m3_to_float(q)) * s; };
  for (int64_t i = 0; i < T; ++i) {
    const int64_t t = (i + 2) % T;  // the order asked for
    std::vector<double> want(H, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      std::vector<float> act(F);
      for (int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          const double xv = deq(x_q[t * H + h], x_scale[t * hb + h / 128]);
          g += deq(w13[(e * 2 * F + f) * H + h], s13[(e * 2 * fb + f / 128) * hb + h / 128]) * xv;
          u += deq(w13[(e * 2 * F + F + f) * H + h], s13[(e * 2 * fb + fb + f / 128) * hb + h / 128]) * xv;
        }
        act[f] = float(silu(g) * u);
      }
      std::vector<fp8> act_q(F);
      const float sc[2] = {ref::quantize_group(act.data(), 128, act_q.data()),
                           ref::quantize_group(act.data() + 128, F - 128, act_q.data() + 128)};
      for (int64_t h = 0; h < H; ++h) {
        double acc = 0;
        for (int64_t f = 0; f < F; ++f)
          acc += deq(w2[(e * H + h) * F + f], s2[(e * hb + h / 128) * fb + f / 128]) * deq(act_q[f], sc[f / 128]);
        want[h] += double(weight[t * k + j]) * acc;
      }
    }
    for (int64_t h = 0; h < H; ++h)
      ASSERT_NEAR(y[i * H + h], want[h], 1e-12 * (1 + std::fabs(want[h]))) << "token " << t << " h " << h;
  }
}

}  // namespace
}  // namespace moekit::testing
