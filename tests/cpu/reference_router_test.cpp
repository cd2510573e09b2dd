// reference_router_test.cpp — the CPU oracle of stage 1 (ref::route, ref::router_logits): hand
// cases for softmax/sigmoid, tie-break, bias, grouped top-k, NaN, and properties on random data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "common/canon.hpp"
#include "cpu_test_util.hpp"
#include "moekit/reference.hpp"

namespace moekit::testing {
namespace {

using RefRoute = Seeded;
using RefRouterLogits = Seeded;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Hand cases compare FP32 weights with double math: exp within 2 ulp, a handful of roundings.
constexpr double kHandTol = 1e-6;

std::vector<double> softmax_double(const std::vector<float>& l) {
  const double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp(double(l[i]) - m);
  for (double& v : p) v /= s;
  return p;
}
double sigmoid_double(float x) { return 1.0 / (1.0 + std::exp(-double(x))); }

ref::Routing route1(const std::vector<float>& logits, const std::vector<float>* bias, int64_t k,
                    const RouterOptions& opt = {}) {
  return ref::route(logits.data(), bias ? bias->data() : nullptr, 1, int64_t(logits.size()), k, opt);
}

TEST(RefRouteHand, SoftmaxTop2OfFour) {
  // Token 0: softmax of {1, 3, 2, 0.5}; the best two are expert 1 (e^0/S) and expert 2 (e^-1/S).
  // Token 1: experts 2 and 3 tie on the best score: the lower id comes first.
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, -1.0f, -1.0f, 4.0f, 4.0f};
  const ref::Routing r = ref::route(logits.data(), nullptr, 2, 4, 2, RouterOptions{});
  const double s0 = std::exp(-2.0) + 1.0 + std::exp(-1.0) + std::exp(-2.5);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 2, 3}));
  EXPECT_NEAR(r.weights[0], 1.0 / s0, kHandTol);
  EXPECT_NEAR(r.weights[1], std::exp(-1.0) / s0, kHandTol);
  const double s1 = 2.0 * std::exp(-5.0) + 2.0;
  EXPECT_NEAR(r.weights[2], 1.0 / s1, kHandTol);
  EXPECT_EQ(r.weights[2], r.weights[3]);  // equal logits, bitwise equal weights
}

TEST(RefRouteHand, TiesGoToTheLowerIdAndOutputIsBestFirst) {
  EXPECT_EQ(route1(std::vector<float>(8, 0.25f), nullptr, 3).ids, (std::vector<int32_t>{0, 1, 2}));
  for (float w : route1(std::vector<float>(8, 0.25f), nullptr, 3).weights) EXPECT_EQ(w, 0.125f);
  EXPECT_EQ(route1({0.5f, 2.0f, 2.0f, 1.0f, 2.0f}, nullptr, 3).ids, (std::vector<int32_t>{1, 2, 4}));
  const ref::Routing r = route1({0.1f, 0.9f, 0.5f, 0.7f}, nullptr, 4);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 2, 0}));
  EXPECT_TRUE(std::is_sorted(r.weights.rbegin(), r.weights.rend()));  // descending
}

TEST(RefRouteHand, SigmoidScoring) {
  RouterOptions opt;
  opt.scoring = Scoring::sigmoid;
  const std::vector<float> l = {-1.0f, 2.0f, 0.0f, 3.0f, -4.0f};
  const ref::Routing r = route1(l, nullptr, 3, opt);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1, 2}));
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.weights[j], sigmoid_double(l[r.ids[j]]), kHandTol);
  EXPECT_EQ(r.weights[2], 0.5f);  // sigmoid(0), exact
}

TEST(RefRouteHand, BiasSelectsButUnbiasedScoresWeigh) {
  // Softmax of {2, 1, 0, 0} is about {0.61, 0.22, 0.08, 0.08}; a bias of 0.6 on expert 2 makes
  // its selection score 0.68 > 0.61, so expert 2 is chosen, weighted by its unbiased 0.08.
  const std::vector<float> l = {2.0f, 1.0f, 0.0f, 0.0f};
  const std::vector<double> p = softmax_double(l);
  const std::vector<float> bias = {0.0f, 0.0f, 0.6f, 0.0f};
  EXPECT_EQ(route1(l, nullptr, 1).ids, (std::vector<int32_t>{0}));
  const ref::Routing r = route1(l, &bias, 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2}));
  EXPECT_NEAR(r.weights[0], p[2], kHandTol);

  // The output is ordered by the biased score; the weights then need not be descending.
  const std::vector<float> bias1 = {0.0f, 0.5f, 0.0f, 0.0f};
  const ref::Routing r2 = route1(l, &bias1, 2);
  EXPECT_EQ(r2.ids, (std::vector<int32_t>{1, 0}));
  EXPECT_NEAR(r2.weights[0], p[1], kHandTol);
  EXPECT_NEAR(r2.weights[1], p[0], kHandTol);

  // Sigmoid + bias (DeepSeek-V3): a negative bias removes the best expert.
  RouterOptions sig;
  sig.scoring = Scoring::sigmoid;
  const std::vector<float> l3 = {3.0f, 1.0f, 2.0f};
  const std::vector<float> bias3 = {-0.5f, 0.0f, 0.0f};
  const ref::Routing r3 = route1(l3, &bias3, 2, sig);
  EXPECT_EQ(r3.ids, (std::vector<int32_t>{2, 1}));
  EXPECT_NEAR(r3.weights[0], sigmoid_double(2.0f), kHandTol);
  EXPECT_NEAR(r3.weights[1], sigmoid_double(1.0f), kHandTol);
}

// Scores per expert for the grouped case: 4 groups of 4 experts.
//   group 0: 0.95 0.05 0.05 0.05   max 0.95, top-2 sum 1.00
//   group 1: 0.80 0.80 0.10 0.10   max 0.80, top-2 sum 1.60
//   group 2: 0.90 0.20 0.10 0.10   max 0.90, top-2 sum 1.10
//   group 3: 0.70 0.70 0.70 0.10   max 0.70, top-2 sum 1.40
// Logits are their inverse sigmoids, so sigmoid scoring gives those scores back.
std::vector<float> grouped_logits() {
  const double p[16] = {0.95, 0.05, 0.05, 0.05, 0.80, 0.80, 0.10, 0.10,
                        0.90, 0.20, 0.10, 0.10, 0.70, 0.70, 0.70, 0.10};
  std::vector<float> l(16);
  for (int e = 0; e < 16; ++e) l[e] = float(std::log(p[e] / (1.0 - p[e])));
  return l;
}

TEST(RefRouteHand, GroupedTopkWithoutBiasKeepsTheGroupsWithTheBestMax) {
  RouterOptions opt;
  opt.scoring = Scoring::sigmoid;
  opt.n_group = 4;
  opt.topk_group = 2;
  const std::vector<float> l = grouped_logits();
  // Group max keeps groups 0 (0.95) and 2 (0.90); the 0.80s of group 1 are not eligible.
  const ref::Routing r = route1(l, nullptr, 4, opt);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 8, 9, 10}));  // 10 and 11 tie at 0.10: lower id
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(r.weights[j], sigmoid_double(l[r.ids[j]]), kHandTol);
  // k = all experts of the kept groups: exactly groups 0 and 2, nothing else.
  const ref::Routing all = route1(l, nullptr, 8, opt);
  EXPECT_EQ(std::set<int32_t>(all.ids.begin(), all.ids.end()),
            (std::set<int32_t>{0, 1, 2, 3, 8, 9, 10, 11}));
}

TEST(RefRouteHand, GroupedTopkWithBiasKeepsTheGroupsWithTheBestTop2Sum) {
  RouterOptions opt;
  opt.scoring = Scoring::sigmoid;
  opt.n_group = 4;
  opt.topk_group = 2;
  const std::vector<float> l = grouped_logits();
  // A zero bias changes no score but switches the group score to the top-2 sum: groups 1 (1.6)
  // and 3 (1.4) are kept, so the globally best expert 0 is never chosen.
  const std::vector<float> zero(16, 0.0f);
  const ref::Routing r = route1(l, &zero, 4, opt);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 5, 12, 13}));
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(r.weights[j], sigmoid_double(l[r.ids[j]]), kHandTol);

  // A bias of +0.65 on expert 9 (score 0.2, selection score 0.85) lifts group 2 to
  // 0.9 + 0.85 = 1.75, past group 3's 1.4: groups 1 and 2 are kept. Selection order 8 (0.9),
  // 9 (0.85), 4 and 5 (0.8); expert 9 is weighted by its unbiased 0.2.
  std::vector<float> bias(16, 0.0f);
  bias[9] = 0.65f;
  const ref::Routing rb = route1(l, &bias, 4, opt);
  EXPECT_EQ(rb.ids, (std::vector<int32_t>{8, 9, 4, 5}));
  EXPECT_NEAR(rb.weights[1], sigmoid_double(l[9]), kHandTol);  // about 0.2, not 0.85
}

TEST(RefRouteHand, GroupedSoftmaxWithoutBias) {
  // Softmax is monotone in the logits, so group selection matches the sigmoid case above.
  RouterOptions opt;
  opt.n_group = 4;
  opt.topk_group = 2;
  const std::vector<float> l = grouped_logits();
  const std::vector<double> p = softmax_double(l);
  const ref::Routing r = route1(l, nullptr, 3, opt);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 8, 9}));
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.weights[j], p[r.ids[j]], kHandTol);
}

TEST(RefRouteHand, NanScoresRankLast) {
  RouterOptions sig;
  sig.scoring = Scoring::sigmoid;
  const std::vector<float> l = {kNaN, 1.0f, kNaN, 2.0f, kNaN, -1.0f, kNaN, kNaN};
  EXPECT_EQ(route1(l, nullptr, 4, sig).ids, (std::vector<int32_t>{3, 1, 5, 0}));
  EXPECT_EQ(route1(l, nullptr, 8, sig).ids, (std::vector<int32_t>{3, 1, 5, 0, 2, 4, 6, 7}));
  EXPECT_EQ(route1(std::vector<float>(8, kNaN), nullptr, 4, sig).ids, (std::vector<int32_t>{0, 1, 2, 3}));
  // Softmax: one NaN logit makes the row's sum, hence every score, NaN (as in every framework);
  // k distinct ids in range are still returned.
  const ref::Routing r = route1(l, nullptr, 4);
  EXPECT_EQ(std::set<int32_t>(r.ids.begin(), r.ids.end()).size(), 4u);
  for (int32_t id : r.ids) EXPECT_TRUE(id >= 0 && id < 8) << id;
  for (float w : r.weights) EXPECT_TRUE(std::isnan(w));
  // ... written as one NaN, 0x7fc00000 (canon::weight_out): NaN payloads differ between the host
  // and the GPU, and the GPU kernels are compared with this oracle bit for bit.
  for (float w : r.weights) {
    uint32_t bits = 0;
    std::memcpy(&bits, &w, 4);
    EXPECT_EQ(bits, 0x7fc00000u);
  }
  EXPECT_EQ(canon::float_to_bits(canon::weight_out(-kNaN)), 0x7fc00000u);
  EXPECT_EQ(canon::float_to_bits(canon::weight_out(-0.0f)), 0x80000000u);  // numbers pass unchanged
}

TEST_F(RefRoute, RenormalizeDividesByTheSumOfTheK) {
  const int64_t T = 32, E = 64, k = 8;
  std::vector<float> l(T * E);
  for (float& v : l) v = uniform(-4.0f, 4.0f);
  for (Scoring scoring : {Scoring::softmax, Scoring::sigmoid}) {
    RouterOptions plain, renorm;
    plain.scoring = renorm.scoring = scoring;
    renorm.renormalize = true;
    const ref::Routing a = ref::route(l.data(), nullptr, T, E, k, plain);
    const ref::Routing b = ref::route(l.data(), nullptr, T, E, k, renorm);
    EXPECT_EQ(a.ids, b.ids);
    for (int64_t t = 0; t < T; ++t) {
      float s = 0.0f, s_renorm = 0.0f;
      for (int64_t j = 0; j < k; ++j) s += a.weights[t * k + j];
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_EQ(b.weights[t * k + j], a.weights[t * k + j] / s);  // bitwise: one FP32 division
        s_renorm += b.weights[t * k + j];
      }
      // k quotients and k sums, each rounded once (half an ulp of 1): within k ulp of 1.
      EXPECT_NEAR(s_renorm, 1.0f, k * std::numeric_limits<float>::epsilon());
    }
  }
}

TEST_F(RefRoute, RoutedScalingFactorMultipliesTheFinalWeights) {
  const int64_t T = 16, E = 32, k = 4;
  std::vector<float> l(T * E);
  for (float& v : l) v = uniform(-4.0f, 4.0f);
  for (bool renormalize : {false, true}) {
    RouterOptions base, scaled;
    base.renormalize = scaled.renormalize = renormalize;
    scaled.routed_scaling_factor = 2.5f;
    const ref::Routing a = ref::route(l.data(), nullptr, T, E, k, base);
    const ref::Routing b = ref::route(l.data(), nullptr, T, E, k, scaled);
    EXPECT_EQ(a.ids, b.ids);
    for (size_t i = 0; i < a.weights.size(); ++i) ASSERT_EQ(b.weights[i], a.weights[i] * 2.5f) << i;
  }
}

// The ids of one token are k distinct experts in [0, E), ranked best first, and no expert left
// out ranks before the last one chosen.
void expect_topk(const std::vector<double>& choice, const int32_t* ids, int64_t k, double tol) {
  const int64_t E = int64_t(choice.size());
  std::set<int32_t> seen;
  for (int64_t j = 0; j < k; ++j) {
    ASSERT_TRUE(ids[j] >= 0 && ids[j] < E) << "id " << ids[j];
    ASSERT_TRUE(seen.insert(ids[j]).second) << "id " << ids[j] << " twice";
    if (j > 0) {
      ASSERT_LE(choice[ids[j]], choice[ids[j - 1]] + tol) << "slot " << j;
    }
  }
  const double last = choice[ids[k - 1]];
  for (int32_t e = 0; e < E; ++e)
    if (!seen.count(e)) {
      ASSERT_LE(choice[e], last + tol) << "expert " << e << " left out";
    }
}

TEST_F(RefRoute, RandomTokensGetTheirTopK) {
  for (int64_t E : {8, 64, 256, 512})
    for (int64_t k : {int64_t(1), int64_t(2), std::min<int64_t>(8, E), std::min<int64_t>(16, E)})
      for (Scoring scoring : {Scoring::softmax, Scoring::sigmoid})
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "E=" << E << " k=" << k << " sigmoid=" << int(scoring)
                                            << " bias=" << with_bias);
          const int64_t T = 16;
          std::vector<float> l(T * E), bias(E);
          for (float& v : l) v = uniform(-6.0f, 6.0f);
          for (float& v : bias) v = uniform(-0.05f, 0.05f);
          RouterOptions opt;
          opt.scoring = scoring;
          const ref::Routing r = ref::route(l.data(), with_bias ? bias.data() : nullptr, T, E, k, opt);
          for (int64_t t = 0; t < T; ++t) {
            const std::vector<float> lt(l.begin() + t * E, l.begin() + (t + 1) * E);
            std::vector<double> score(E), choice(E);
            if (scoring == Scoring::softmax) score = softmax_double(lt);
            for (int64_t e = 0; e < E; ++e) {
              if (scoring == Scoring::sigmoid) score[e] = sigmoid_double(lt[e]);
              choice[e] = score[e] + (with_bias ? bias[e] : 0.0);
            }
            // FP32 scores against double: exp within 2 ulp, l - max rounded (|l - max| <= 12:
            // 4 ulp of the result), the softmax sum over E/32 + 5 roundings (21 for E 512): about
            // 30 ulp, 2e-6 relative; 1e-5 leaves room. Relative for the weights (floored at 1e-3),
            // absolute for the ranking (scores <= 1, biases small).
            const double tol = 1e-5;
            ASSERT_NO_FATAL_FAILURE(expect_topk(choice, r.ids.data() + t * k, k, tol)) << "token " << t;
            for (int64_t j = 0; j < k; ++j) {
              const int32_t e = r.ids[t * k + j];
              ASSERT_NEAR(r.weights[t * k + j], score[e], tol * std::max(score[e], 1e-3));
              // Sigmoid weights are canon::sigmoid of the logit, bit for bit.
              if (scoring == Scoring::sigmoid) {
                ASSERT_EQ(r.weights[t * k + j], canon::sigmoid(lt[e]));
              }
            }
          }
        }
}

TEST_F(RefRoute, RandomDeepSeekGroupedRoutingStaysInTheBestGroups) {
  // DeepSeek-V3: E 256, 8 groups, 4 kept, k 8, sigmoid + bias. The kept groups, recomputed here
  // by sorting, are the 4 with the largest top-2 sum of biased scores (FP32, as the oracle adds).
  const int64_t T = 64, E = 256, k = 8, G = 8, gs = E / G;
  RouterOptions opt;
  opt.scoring = Scoring::sigmoid;
  opt.n_group = G;
  opt.topk_group = 4;
  std::vector<float> l(T * E), bias(E);
  for (float& v : l) v = uniform(-4.0f, 4.0f);
  for (float& v : bias) v = uniform(-0.5f, 0.5f);
  const ref::Routing r = ref::route(l.data(), bias.data(), T, E, k, opt);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> choice(E);
    for (int64_t e = 0; e < E; ++e) choice[e] = canon::sigmoid(l[t * E + e]) + bias[e];
    std::vector<std::pair<float, int>> group_score;
    for (int g = 0; g < G; ++g) {
      std::vector<float> c(choice.begin() + g * gs, choice.begin() + (g + 1) * gs);
      std::sort(c.rbegin(), c.rend());
      group_score.push_back({c[0] + c[1], g});
    }
    std::sort(group_score.begin(), group_score.end(),
              [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    std::set<int> kept;
    for (int i = 0; i < opt.topk_group; ++i) kept.insert(group_score[i].second);
    std::vector<int> eligible;
    for (int e = 0; e < E; ++e)
      if (kept.count(e / gs)) eligible.push_back(e);
    std::sort(eligible.begin(), eligible.end(), [&](int a, int b) {
      return canon::ranks_before(choice[a], a, choice[b], b);
    });
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(r.ids[t * k + j], eligible[j]) << "token " << t << " slot " << j;
      ASSERT_EQ(r.weights[t * k + j], canon::sigmoid(l[t * E + eligible[j]]));
    }
  }
}

// ---- router logits --------------------------------------------------------------------------

TEST_F(RefRouterLogits, MatchDoubleDotProducts) {
  const int64_t T = 6, E = 24;
  for (int64_t H : {8, 264, 4096})  // one chunk; 33 chunks (lane 0 takes two); 512 chunks
    for (DType w_dtype : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(::testing::Message() << "H=" << H << " w_gate " << dtype_name(w_dtype));
      std::vector<ref::bf16> x(T * H), w_bf16(E * H);
      std::vector<float> w_f32(E * H);
      for (auto& v : x) v = ref::to_bf16(uniform(-2.0f, 2.0f));
      for (auto& v : w_bf16) v = ref::to_bf16(uniform(-0.1f, 0.1f));
      for (auto& v : w_f32) v = uniform(-0.1f, 0.1f);
      const void* w = w_dtype == DType::bf16 ? static_cast<const void*>(w_bf16.data()) : w_f32.data();
      const std::vector<float> logits = ref::router_logits(x.data(), w, w_dtype, T, H, E);
      ASSERT_EQ(logits.size(), size_t(T * E));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e) {
          double dot = 0, abs_dot = 0;
          for (int64_t h = 0; h < H; ++h) {
            const double wv = w_dtype == DType::bf16 ? ref::to_float(w_bf16[e * H + h]) : w_f32[e * H + h];
            dot += ref::to_float(x[t * H + h]) * wv;
            abs_dot += std::fabs(ref::to_float(x[t * H + h]) * wv);
          }
          // FMA chains of H/256 chunks per lane, then 5 butterfly adds: error <= (H/32 + 5) eps
          // of sum|x*w|, under 1e-5 of it for H <= 4096 (relative to |dot| would fail on
          // cancellation).
          ASSERT_NEAR(logits[t * E + e], dot, 1e-5 * abs_dot) << "t " << t << " e " << e;
        }
    }
}

TEST(RefRouterLogitsHand, SmallIntegersAreExact) {
  // x = 1..16, w_gate row e = e everywhere (bf16) / alternating signs (f32): exact integer dots.
  const int64_t H = 16, E = 3;
  std::vector<ref::bf16> x(H), w_bf16(E * H);
  std::vector<float> w_f32(E * H);
  for (int64_t h = 0; h < H; ++h) x[h] = ref::to_bf16(float(h + 1));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < H; ++h) {
      w_bf16[e * H + h] = ref::to_bf16(float(e));
      w_f32[e * H + h] = h % 2 ? -float(e) : float(e);
    }
  EXPECT_EQ(ref::router_logits(x.data(), w_bf16.data(), DType::bf16, 1, H, E),
            (std::vector<float>{0.0f, 136.0f, 272.0f}));  // e * (1 + ... + 16)
  EXPECT_EQ(ref::router_logits(x.data(), w_f32.data(), DType::f32, 1, H, E),
            (std::vector<float>{0.0f, -8.0f, -16.0f}));  // e * (1 - 2 + 3 - ... - 16)
}

TEST(RefRouterLogitsHand, FollowTheKernelsFmaAndButterflyOrder) {
  // The GPU must match these bit for bit, so the order is part of the contract (canon.hpp).
  const int64_t H = 264;  // 33 chunks of 8: lane 0 takes chunks 0 and 32
  std::vector<ref::bf16> x(H, ref::to_bf16(0.0f));
  std::vector<float> w(H, 0.0f);
  // FMA accumulation: acc = -(1 + 2^-7 + 2^-23), then fma((1 + 2^-7), (1 + 2^-23), acc) is
  // exactly 2^-30; a rounded product first would give 0.
  x[0] = ref::to_bf16(1.0f), w[0] = -(1.0f + 0x1p-7f + 0x1p-23f);
  x[1] = ref::to_bf16(1.0f + 0x1p-7f), w[1] = 1.0f + 0x1p-23f;
  EXPECT_EQ(ref::router_logits(x.data(), w.data(), DType::f32, 1, H, 1)[0], 0x1p-30f);
  // Butterfly: lanes 0 and 16 (chunks 0 and 16) meet first and cancel, so lane 1's 1 survives;
  // a sum in h order would absorb the 1 into 2^24 and end at 0.
  std::fill(x.begin(), x.end(), ref::to_bf16(0.0f));
  std::fill(w.begin(), w.end(), 1.0f);
  x[0] = ref::to_bf16(0x1p24f), x[8] = ref::to_bf16(1.0f), x[16 * 8] = ref::to_bf16(-0x1p24f);
  EXPECT_EQ(ref::router_logits(x.data(), w.data(), DType::f32, 1, H, 1)[0], 1.0f);
  // Chunk 32 wraps around to lane 0 (no lane of its own): its 1 is absorbed into chunk 0's
  // 2^24 before lane 16's -2^24 cancels that, so the sum is 0.
  std::fill(x.begin(), x.end(), ref::to_bf16(0.0f));
  x[0] = ref::to_bf16(0x1p24f), x[32 * 8] = ref::to_bf16(1.0f), x[16 * 8] = ref::to_bf16(-0x1p24f);
  EXPECT_EQ(ref::router_logits(x.data(), w.data(), DType::f32, 1, H, 1)[0], 0.0f);
}

}  // namespace
}  // namespace moekit::testing
