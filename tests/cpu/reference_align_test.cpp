// reference_align_test.cpp — the CPU oracle of stage 2 (ref::align): the expert-sorted,
// block_m-padded layout the GEMMs tile, on hand cases, adversarial counts and random routings.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cpu_test_util.hpp"
#include "moekit/reference.hpp"

namespace moekit::testing {
namespace {

using RefAlign = Seeded;

int64_t max_blocks_of(int64_t T, int64_t k, int64_t E, int64_t block_m) {
  return worst_case_rows(T, k, E, block_m) / block_m;
}

ref::Aligned align(const std::vector<int32_t>& ids, int64_t T, int64_t k, int64_t E, int64_t block_m) {
  return ref::align(ids.data(), T, k, E, block_m, max_blocks_of(T, k, E, block_m));
}

// Every property of the layout, derived from the ids alone: expert segments in expert order,
// each holding its assignments in ascending order then the sentinel T*k up to a multiple of
// block_m; block_expert naming each block's expert and -1 after; ids outside [0, E) skipped.
void expect_layout(const std::vector<int32_t>& ids, int64_t T, int64_t k, int64_t E,
                   int64_t block_m, const ref::Aligned& out) {
  const int64_t n = T * k, max_blocks = max_blocks_of(T, k, E, block_m);
  std::vector<std::vector<int32_t>> of_expert(E);
  bool out_of_range = false;
  for (int64_t a = 0; a < n; ++a) {
    if (ids[a] < 0 || ids[a] >= E) out_of_range = true;
    else of_expert[ids[a]].push_back(int32_t(a));
  }
  EXPECT_EQ(out.status, out_of_range ? kStatusExpertIdOutOfRange : 0);
  ASSERT_EQ(out.expert_counts.size(), size_t(E));
  ASSERT_EQ(out.block_expert.size(), size_t(max_blocks));
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t count = int64_t(of_expert[e].size());
    const int64_t padded = (count + block_m - 1) / block_m * block_m;
    ASSERT_EQ(out.expert_counts[e], count) << "expert " << e;
    ASSERT_LE(row + padded, int64_t(out.sorted_ids.size())) << "expert " << e;
    for (int64_t i = 0; i < padded; ++i)
      ASSERT_EQ(out.sorted_ids[row + i], i < count ? of_expert[e][i] : int32_t(n))
          << "expert " << e << " row " << row + i;
    for (int64_t b = row / block_m; b < (row + padded) / block_m; ++b)
      ASSERT_EQ(out.block_expert[b], e) << "block " << b;
    row += padded;
  }
  EXPECT_EQ(out.num_rows_padded, row);
  EXPECT_EQ(out.sorted_ids.size(), size_t(row));
  EXPECT_LE(row, max_blocks * block_m);  // the plan's worst case always holds the layout
  for (int64_t b = row / block_m; b < max_blocks; ++b) ASSERT_EQ(out.block_expert[b], -1) << "block " << b;
}

TEST(RefAlignHand, WorkedExample) {
  // T 4, k 2, E 5, block_m 4. Assignments a = t*k + j: 0->2 1->0 2->1 3->2 4->2 5->4 6->0 7->2.
  // Counts {2, 1, 4, 0, 1}: padded {4, 4, 4, 0, 4}, 16 rows; sentinel T*k = 8. Worst case
  // 8 + 5*3 = 23 rows -> 24 -> 6 blocks; the last two unused.
  const std::vector<int32_t> ids = {2, 0, 1, 2, 2, 4, 0, 2};
  const ref::Aligned out = align(ids, 4, 2, 5, 4);
  EXPECT_EQ(out.sorted_ids, (std::vector<int32_t>{1, 6, 8, 8,  // expert 0
                                                  2, 8, 8, 8,  // expert 1
                                                  0, 3, 4, 7,  // expert 2: exactly one block
                                                  5, 8, 8, 8}));  // expert 4 (3 is empty)
  EXPECT_EQ(out.block_expert, (std::vector<int32_t>{0, 1, 2, 4, -1, -1}));
  EXPECT_EQ(out.num_rows_padded, 16);
  EXPECT_EQ(out.expert_counts, (std::vector<int32_t>{2, 1, 4, 0, 1}));
  EXPECT_EQ(out.status, 0);
  expect_layout(ids, 4, 2, 5, 4, out);
}

TEST_F(RefAlign, CountsZeroOneBlockAndBlockPlusOne) {
  // Expert 0: 0 rows, 1: 1, 2: block_m, 3: block_m + 1 -> padded 0, bm, bm, 2*bm. k = 1.
  for (int64_t bm : {4, 16, 64, 128}) {
    SCOPED_TRACE(::testing::Message() << "block_m " << bm);
    std::vector<int32_t> ids = {1};
    ids.insert(ids.end(), size_t(bm), 2);
    ids.insert(ids.end(), size_t(bm + 1), 3);
    std::shuffle(ids.begin(), ids.end(), rng);
    const int64_t T = int64_t(ids.size());
    const ref::Aligned out = align(ids, T, 1, 4, bm);
    EXPECT_EQ(out.expert_counts, (std::vector<int32_t>{0, 1, int32_t(bm), int32_t(bm + 1)}));
    EXPECT_EQ(out.num_rows_padded, 4 * bm);
    EXPECT_EQ(out.block_expert[0], 1);
    EXPECT_EQ(out.block_expert[1], 2);
    EXPECT_EQ(out.block_expert[2], 3);
    EXPECT_EQ(out.block_expert[3], 3);
    EXPECT_EQ(out.block_expert[4], -1);
    // Expert 1's block: its one assignment, then bm - 1 sentinels.
    EXPECT_EQ(std::count(out.sorted_ids.begin(), out.sorted_ids.begin() + bm, int32_t(T)), bm - 1);
    expect_layout(ids, T, 1, 4, bm, out);
  }
}

TEST(RefAlignHand, AllTokensOnOneExpert) {
  // 100 tokens, k 1, all on expert 5 of 8: 100 rows padded to 112 = 7 blocks of 16.
  const std::vector<int32_t> ids(100, 5);
  const ref::Aligned out = align(ids, 100, 1, 8, 16);
  EXPECT_EQ(out.num_rows_padded, 112);
  for (int32_t r = 0; r < 100; ++r) ASSERT_EQ(out.sorted_ids[r], r);
  for (int32_t r = 100; r < 112; ++r) ASSERT_EQ(out.sorted_ids[r], 100);
  for (int b = 0; b < 7; ++b) EXPECT_EQ(out.block_expert[b], 5);
  for (size_t b = 7; b < out.block_expert.size(); ++b) EXPECT_EQ(out.block_expert[b], -1);
  EXPECT_EQ(out.expert_counts, (std::vector<int32_t>{0, 0, 0, 0, 0, 100, 0, 0}));
  expect_layout(ids, 100, 1, 8, 16, out);
}

TEST(RefAlignHand, OutOfRangeIdsAreSkippedAndFlagged) {
  // T 3, k 2, E 4: assignments 1 (-1) and 4 (E) are skipped; the sentinel stays T*k = 6.
  const std::vector<int32_t> ids = {0, -1, 3, 0, 4, 3};
  const ref::Aligned out = align(ids, 3, 2, 4, 4);
  EXPECT_EQ(out.status, kStatusExpertIdOutOfRange);
  EXPECT_EQ(out.expert_counts, (std::vector<int32_t>{2, 0, 0, 2}));
  EXPECT_EQ(out.sorted_ids, (std::vector<int32_t>{0, 3, 6, 6, 2, 5, 6, 6}));
  EXPECT_EQ(out.num_rows_padded, 8);
  expect_layout(ids, 3, 2, 4, 4, out);
  // Large and very negative ids too.
  const std::vector<int32_t> wild = {INT32_MIN, INT32_MAX, 1, 1000};
  const ref::Aligned w = align(wild, 4, 1, 4, 4);
  EXPECT_EQ(w.status, kStatusExpertIdOutOfRange);
  EXPECT_EQ(w.sorted_ids, (std::vector<int32_t>{2, 4, 4, 4}));
}

TEST(RefAlignHand, NoTokens) {
  const ref::Aligned out = ref::align(nullptr, 0, 8, 16, 16, max_blocks_of(0, 8, 16, 16));
  EXPECT_EQ(out.num_rows_padded, 0);
  EXPECT_TRUE(out.sorted_ids.empty());
  EXPECT_EQ(out.expert_counts, std::vector<int32_t>(16, 0));
  EXPECT_EQ(out.block_expert, std::vector<int32_t>(size_t(max_blocks_of(0, 8, 16, 16)), -1));
  EXPECT_EQ(out.status, 0);
}

// k distinct experts per token; skewed routings send most tokens to a few low-id experts
// (probability ~ 1/(e+1)^2), leaving many experts empty.
std::vector<int32_t> random_routing(std::mt19937_64& rng, int64_t T, int64_t k, int64_t E, bool skewed) {
  std::vector<double> p(E);
  for (int64_t e = 0; e < E; ++e) p[e] = skewed ? 1.0 / double((e + 1) * (e + 1)) : 1.0;
  std::discrete_distribution<int32_t> pick(p.begin(), p.end());
  std::vector<int32_t> ids(T * k);
  for (int64_t t = 0; t < T; ++t) {
    if (k == E) {  // every expert once, in random order
      std::iota(ids.begin() + t * k, ids.begin() + (t + 1) * k, 0);
      std::shuffle(ids.begin() + t * k, ids.begin() + (t + 1) * k, rng);
      continue;
    }
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      do e = pick(rng);
      while (std::find(ids.begin() + t * k, ids.begin() + t * k + j, e) != ids.begin() + t * k + j);
      ids[t * k + j] = e;
    }
  }
  return ids;
}

TEST_F(RefAlign, RandomRoutingsKeepEveryLayoutProperty) {
  struct Case { int64_t T, k, E; };
  for (Case c : {Case{1, 1, 8}, Case{1, 8, 256}, Case{7, 2, 8}, Case{64, 8, 128}, Case{333, 8, 256},
                 Case{1000, 2, 8}, Case{50, 16, 512}, Case{20, 8, 8}})
    for (int64_t bm : {16, 64, 128})
      for (bool skewed : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "T=" << c.T << " k=" << c.k << " E=" << c.E
                                          << " block_m=" << bm << " skewed=" << skewed);
        const std::vector<int32_t> ids = random_routing(rng, c.T, c.k, c.E, skewed);
        ASSERT_NO_FATAL_FAILURE(expect_layout(ids, c.T, c.k, c.E, bm, align(ids, c.T, c.k, c.E, bm)));
      }
}

TEST_F(RefAlign, RandomIdsWithSomeOutOfRange) {
  const int64_t T = 200, k = 4, E = 32;
  std::vector<int32_t> ids(T * k);
  for (int32_t& e : ids) e = int32_t(uniform_int(-3, E + 2));  // ids need not be distinct here
  expect_layout(ids, T, k, E, 16, align(ids, T, k, E, 16));
}

}  // namespace
}  // namespace moekit::testing
