// fast_div_test.cpp — dev::FastDivU32 (src/common/fast_div.hpp), the division the weight-gradient
// kernel's producer does once a stage (id / topk): equal to n / d wherever it promises to be.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "common/fast_div.hpp"

namespace moekit::testing {
namespace {

TEST(FastDivU32, EveryDividendBelow2To16ForEveryTopK) {
  for (uint32_t d = 1; d <= 64; ++d) {
    const dev::FastDivU32 f(d);
    for (uint32_t n = 0; n < (1u << 16); ++n) ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
  }
}

TEST(FastDivU32, AroundMultiplesAndTheTopOfTheRange) {
  std::mt19937_64 rng(17);
  const uint32_t top = (1u << 31) - 1;
  for (int i = 0; i < 4000; ++i) {
    const uint32_t d = i < 2000 ? uint32_t(1 + i) : uint32_t(1 + rng() % top);
    const dev::FastDivU32 f(d);
    // n = q·d - 1, q·d, q·d + 1 for the largest q and for random ones, and the largest n
    for (uint32_t q : {top / d, uint32_t(rng() % (top / d + 1)), 1u}) {
      const uint64_t base = uint64_t(q) * d;
      for (int64_t delta = -1; delta <= 1; ++delta) {
        const int64_t n = int64_t(base) + delta;
        if (n < 0 || n > int64_t(top)) continue;
        ASSERT_EQ(f.div(uint32_t(n)), uint32_t(n) / d) << n << " / " << d;
      }
    }
    ASSERT_EQ(f.div(top), top / d) << d;
  }
}

TEST(FastDivU32, DefaultIsDivisionByOne) {
  const dev::FastDivU32 f;
  EXPECT_EQ(f.div(0), 0u);
  EXPECT_EQ(f.div((1u << 31) - 1), (1u << 31) - 1);
}

}  // namespace
}  // namespace moekit::testing
