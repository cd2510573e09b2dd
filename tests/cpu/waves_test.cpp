// waves_test.cpp — the mma.sync expert GEMM's even-wave rule (src/gemm/mma_sync/waves.hpp) on the
// points measured on the H200: items = blocks x column tiles (x K-splits), grid = SMs x
// resident CTAs.
//
// Build and run: cmake --build build --target moekit_cpu_tests && ./build/tests/moekit_cpu_tests --gtest_filter='Waves*'
#include <gtest/gtest.h>

#include <cstdint>

#include "gemm/mma_sync/waves.hpp"

namespace moekit::kernels::gemm::mma_sync {
namespace {

// Every CTA that takes items gets `waves` of them (the last one possibly fewer), and all items are
// taken: the loop `for (i = cta; cta < s && i < items; i += s)` covers [0, items) once.
void expect_even(int64_t items, int64_t grid) {
  const int64_t s = wave_stride(items, grid);
  ASSERT_GE(s, 1);
  ASSERT_LE(s, grid) << "more CTAs than the grid";
  const int64_t waves = (items + grid - 1) / grid;
  EXPECT_EQ((items + s - 1) / s, waves) << "dealing evenly must not add a wave";
}

TEST(Waves, DealsEvenlyWhereTheLastWaveIdles) {
  // DeepSeek-V3 T=4 up: 29 blocks x 64 tiles on 264 CTAs: 7 full waves and 8 items.
  EXPECT_EQ(wave_stride(1856, 264), 232);
  // DeepSeek-V3 T=1 down: 8 x 112 = 896 on 264: 4 waves, 104 in the last.
  EXPECT_EQ(wave_stride(896, 264), 224);
  // Mixtral T=2 up: 3 experts x 448 tiles = 1344 on 264: 6 waves, 24 in the last.
  EXPECT_EQ(wave_stride(1344, 264), 224);
  // Mixtral T=8 down: 7 x 64 = 448 on 264: 2 waves, 184 in the last (30% idle over 2 waves).
  EXPECT_EQ(wave_stride(448, 264), 224);
  // Qwen3 T=16 up, 3-stage 16x64 tiles (3 CTAs an SM): 85 x 24 = 2040 on 396.
  EXPECT_EQ(wave_stride(2040, 396), 340);
  for (int64_t items : {1856, 896, 1344, 448, 2040, 1, 263, 265, 100000}) expect_even(items, items == 2040 ? 396 : 264);
}

TEST(Waves, KeepsTheWholeGridWhereTheLastWaveIsFullEnough) {
  EXPECT_EQ(wave_stride(5824, 264), 264);   // DeepSeek-V3 T=16 up: 16 in the 23rd wave, but 22 waves full
  EXPECT_EQ(wave_stride(3584, 264), 264);   // Mixtral T=16 up: 14 waves, 152 in the last
  EXPECT_EQ(wave_stride(512, 264), 264);    // Mixtral T=16 down: 248 of 264 in the second wave
  EXPECT_EQ(wave_stride(3248, 264), 264);   // DeepSeek-V3 T=4 down: 5.4% idle, under 6%
  EXPECT_EQ(wave_stride(3048, 396), 396);   // Qwen3 T=64 up: 8 waves, 276 in the last
  EXPECT_EQ(wave_stride(264, 264), 264);    // exactly one wave
  EXPECT_EQ(wave_stride(0, 264), 264);      // no items: every CTA exits at once
}

TEST(Waves, OneWaveUsesOneCtaPerItem) {
  // Fewer items than CTAs: one each, the rest exit (as without the rule).
  EXPECT_EQ(wave_stride(100, 264), 100);
  EXPECT_EQ(wave_stride(1, 264), 1);
}

}  // namespace
}  // namespace moekit::kernels::gemm::mma_sync
