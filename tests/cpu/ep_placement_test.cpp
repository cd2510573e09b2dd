// ep_placement_test.cpp — the expert-parallel planner (plan_placement), the replica rule
// (route_assignment), the token split and the layouts of moekit/ep.hpp: pure host code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "cpu_test_util.hpp"
#include "ep/internal.hpp"
#include "moekit/ep.hpp"

namespace moekit::testing {
namespace {

using ep::Placement;
using ep::PlacementOptions;
using ep::ReplicaRule;
using EpPlacement = Seeded;
using EpLayout = Seeded;

enum class Load { none, uniform, skewed, one_expert };
const char* load_name(Load l) {
  return l == Load::none ? "none" : l == Load::uniform ? "uniform" : l == Load::skewed ? "skewed" : "one-expert";
}

// Zipf-like loads on a random order of the experts, or everything on one expert.
std::vector<double> make_load(Load kind, int64_t E, std::mt19937_64& rng) {
  std::vector<double> load;
  if (kind == Load::none) return load;
  load.assign(size_t(E), 100.0);
  if (kind == Load::skewed) {
    std::vector<int64_t> perm(static_cast<size_t>(E));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < E; ++i) load[size_t(perm[size_t(i)])] = std::floor(10000.0 / double(i + 1));
  } else if (kind == Load::one_expert) {
    std::fill(load.begin(), load.end(), 0.0);
    load[size_t(E / 2)] = 5000.0;
  }
  return load;
}

// Every invariant of a Placement, from its tables alone.
void expect_valid(const Placement& p, const PlacementOptions& o) {
  const int64_t E = o.experts, R = o.ranks, S = p.slots_per_rank;
  ASSERT_EQ(p.experts, E);
  ASSERT_EQ(p.ranks, R);
  ASSERT_GE(S, 1);
  if (o.slots_per_rank > 0) EXPECT_EQ(S, std::min(o.slots_per_rank, E));
  ASSERT_EQ(p.slot_expert.size(), size_t(R * S));
  ASSERT_EQ(p.replica_offsets.size(), size_t(E + 1));
  std::vector<int64_t> seen(static_cast<size_t>(E), 0);
  for (int64_t r = 0; r < R; ++r) {
    int32_t prev = -1;
    bool empty = false;
    for (int64_t l = 0; l < S; ++l) {
      const int32_t e = p.slot_expert[size_t(r * S + l)];
      if (e < 0) { empty = true; continue; }
      EXPECT_FALSE(empty) << "rank " << r << ": an expert after an empty slot";
      EXPECT_GT(e, prev) << "rank " << r << ": experts not strictly ascending";
      ASSERT_LT(e, E);
      prev = e, ++seen[size_t(e)];
    }
  }
  int64_t extra = 0;
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_GE(seen[size_t(e)], 1) << "expert " << e << " is nowhere";
    EXPECT_LE(seen[size_t(e)], R);
    EXPECT_EQ(p.copies(e), seen[size_t(e)]) << "expert " << e;
    for (int32_t i = p.replica_offsets[size_t(e)]; i < p.replica_offsets[size_t(e + 1)]; ++i) {
      EXPECT_EQ(p.slot_expert[size_t(p.replica_slots[size_t(i)])], e);
      if (i > p.replica_offsets[size_t(e)]) EXPECT_LT(p.replica_slots[size_t(i - 1)], p.replica_slots[size_t(i)]);
    }
    extra += seen[size_t(e)] - 1;
  }
  EXPECT_EQ(p.replicas(), extra);
  EXPECT_LE(p.replicas(), o.replicas);
  // rank_load is the loads split over copies: it sums to the total up to rounding of L/n (a few
  // ulps of the total per expert).
  const double total = o.expert_load.empty() ? double(E) : std::accumulate(o.expert_load.begin(), o.expert_load.end(), 0.0);
  ASSERT_EQ(p.rank_load.size(), size_t(R));
  EXPECT_NEAR(std::accumulate(p.rank_load.begin(), p.rank_load.end(), 0.0), total, 1e-12 * total * double(E));
}

bool same(const Placement& a, const Placement& b) {
  return a.slots_per_rank == b.slots_per_rank && a.slot_expert == b.slot_expert &&
         a.replica_offsets == b.replica_offsets && a.replica_slots == b.replica_slots && a.rank_load == b.rank_load;
}

double peak(const Placement& p) { return *std::max_element(p.rank_load.begin(), p.rank_load.end()); }

TEST_F(EpPlacement, InvariantsAcrossRanksExpertsLoadsAndReplicas) {
  for (int64_t R : {1, 2, 4, 8})
    for (int64_t E : {8, 64, 256})
      for (Load kind : {Load::none, Load::uniform, Load::skewed, Load::one_expert})
        for (bool replicas : {false, true}) {
          if (replicas && (kind == Load::none || R == 1)) continue;  // replicas need loads and a second rank
          for (int64_t slots : {int64_t(0), (E + R - 1) / R + (replicas ? 2 : 0), E}) {
            SCOPED_TRACE(::testing::Message() << "R=" << R << " E=" << E << " load=" << load_name(kind)
                                              << " replicas=" << replicas << " slots=" << slots);
            PlacementOptions o;
            o.experts = E, o.ranks = R, o.slots_per_rank = slots;
            o.expert_load = make_load(kind, E, rng);
            if (replicas) o.replicas = std::min({E / 4 + 1, E * (R - 1), (slots ? slots * R : E + E / 4 + 1) - E});
            const Placement p = ep::plan_placement(o);
            expect_valid(p, o);
            EXPECT_TRUE(same(p, ep::plan_placement(o))) << "not deterministic";
            if (replicas) {  // a replica never raises the peak
              PlacementOptions none = o;
              none.replicas = 0;
              EXPECT_LE(peak(p), peak(ep::plan_placement(none)));
            }
          }
        }
}

TEST(EpPlacementHand, NoLoadsGivesContiguousBlocks) {
  const Placement p = ep::plan_placement({.experts = 10, .ranks = 4});
  EXPECT_EQ(p.slots_per_rank, 3);
  EXPECT_EQ(p.slot_expert, (std::vector<int32_t>{0, 1, -1, 2, 3, 4, 5, 6, -1, 7, 8, 9}));
  EXPECT_EQ(p.rank_load, (std::vector<double>{2, 3, 2, 3}));
  EXPECT_EQ(p.local_experts(1), 3);
  EXPECT_EQ(p.replicas(), 0);
}

TEST(EpPlacementHand, LargestShareFirstOnTheLeastLoadedRankWithAFreeSlot) {
  // Order e0 (10), e3 (8), e1 (1), e2 (1): e0 -> r0, e3 -> r1, e1 -> r1 (8 < 10), e2 -> r0 (r1 full).
  PlacementOptions o{.experts = 4, .ranks = 2, .slots_per_rank = 2, .expert_load = {10, 1, 1, 8}};
  Placement p = ep::plan_placement(o);
  EXPECT_EQ(p.slot_expert, (std::vector<int32_t>{0, 2, 1, 3}));
  EXPECT_EQ(p.rank_load, (std::vector<double>{11, 9}));
  // With 3 slots and one copy allowed: without the copy e2 joins r1 (9 < 10), peak 10. The copy
  // would go to e0 (largest load per copy), but e0 on both ranks puts e3's 8 beside one half:
  // peak 13, so the planner keeps the plan without it.
  o.slots_per_rank = 3, o.replicas = 1;
  p = ep::plan_placement(o);
  EXPECT_EQ(p.replicas(), 0);
  EXPECT_EQ(p.slot_expert, (std::vector<int32_t>{0, -1, -1, 1, 2, 3}));
  EXPECT_EQ(p.rank_load, (std::vector<double>{10, 10}));
}

TEST(EpPlacementHand, AHotExpertIsCopiedToEveryRankAndItsLoadSplitEvenly) {
  for (int64_t R : {2, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << "R=" << R);
    std::vector<double> load(64, 0.0);
    load[5] = 800;
    const Placement p = ep::plan_placement({.experts = 64, .ranks = R, .replicas = R - 1, .expert_load = load});
    EXPECT_EQ(p.copies(5), R);
    EXPECT_EQ(p.replicas(), R - 1);
    for (double l : p.rank_load) EXPECT_EQ(l, 800.0 / double(R));
    // A larger budget adds nothing: idle experts get no copies, e5 has one per rank already.
    const Placement q = ep::plan_placement({.experts = 64, .ranks = R, .replicas = 30, .expert_load = load});
    EXPECT_EQ(q.replicas(), R - 1);
  }
}

TEST_F(EpPlacement, WithoutSlotPressurePeakIsWithinListSchedulingBound) {
  // Greedy on the least-loaded rank: peak <= total/R + the largest load (no copies, S = E).
  for (int64_t R : {2, 4, 8})
    for (int64_t E : {8, 64, 256}) {
      const std::vector<double> load = make_load(Load::skewed, E, rng);
      const Placement p = ep::plan_placement({.experts = E, .ranks = R, .slots_per_rank = E, .expert_load = load});
      const double total = std::accumulate(load.begin(), load.end(), 0.0);
      EXPECT_LE(peak(p), total / double(R) + *std::max_element(load.begin(), load.end())) << "R=" << R << " E=" << E;
    }
}

TEST(EpPlacementHand, PackingMovesAnExpertWhenOnlyRanksHoldingTheCopyHaveRoom) {
  // Copies phase 1 never produces (e0 split three ways although e1 is far hotter) leave the last
  // copy of e0 with free room only on r0, which holds e0 already: e2 moves from the full r1 to
  // r0, and e0's copy takes its place. Singles go e1 -> r0, e2 -> r1, e3 -> r2, e4 -> r1,
  // e5 -> r2, e6 -> r1 (full); e0's copies -> r2, r0, then the move.
  const std::vector<std::vector<int32_t>> held =
      ep::internal::pack({1.5, 100, 1, 1, 1, 1, 1}, {3, 1, 1, 1, 1, 1, 1}, 3, 3);
  EXPECT_EQ(held, (std::vector<std::vector<int32_t>>{{1, 0, 2}, {4, 6, 0}, {3, 5, 0}}));
}

TEST(EpPlacementHand, SlotsForMemory) {
  EXPECT_EQ(ep::slots_for_memory(100, 30), 3);
  EXPECT_EQ(ep::slots_for_memory(0, 30), 0);
  // More slots than experts are taken as E: a rank holds an expert at most once.
  EXPECT_EQ(ep::plan_placement({.experts = 8, .ranks = 2, .slots_per_rank = 100}).slots_per_rank, 8);
}

TEST(EpPlacementHand, ReplicaRules) {
  std::vector<double> load(8, 1.0);
  load[3] = 1000;
  PlacementOptions o{.experts = 8, .ranks = 4, .replicas = 3, .expert_load = load};
  const Placement p = ep::plan_placement(o);
  ASSERT_EQ(p.copies(3), 4);
  // token_modulo: replica t mod 4, whatever the home rank: every rank serves a quarter.
  for (int64_t t = 0; t < 16; ++t)
    EXPECT_EQ(ep::route_assignment(p, t, 3, 0), p.replica_slots[size_t(p.replica_offsets[3] + t % 4)]);
  o.rule = ReplicaRule::prefer_home;
  const Placement h = ep::plan_placement(o);
  for (int64_t home = 0; home < 4; ++home)
    for (int64_t t = 0; t < 8; ++t) EXPECT_EQ(ep::route_assignment(h, t, 3, home) / h.slots_per_rank, home);
  // An expert with one copy goes to that copy under either rule.
  for (int32_t e = 0; e < 8; ++e)
    if (p.copies(e) == 1)
      EXPECT_EQ(ep::route_assignment(h, 7, e, 2), h.replica_slots[size_t(h.replica_offsets[size_t(e)])]);
}

TEST(EpPlacementHand, SplitTokens) {
  EXPECT_EQ(ep::split_tokens(10, 4), (std::vector<int64_t>{0, 3, 6, 8, 10}));
  EXPECT_EQ(ep::split_tokens(2, 4), (std::vector<int64_t>{0, 1, 2, 2, 2}));
  EXPECT_EQ(ep::split_tokens(0, 3), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(EpPlacementHand, BadArgumentsAreNamed) {
  auto plan = [](PlacementOptions o) { return [o] { ep::plan_placement(o); }; };
  const Placement p = ep::plan_placement({.experts = 8, .ranks = 2});
  Placement broken = p;
  broken.replica_slots[0] = 7;  // slot 7 holds expert 7, not expert 0
  const std::vector<int32_t> ids{0, 9};
  expect_all_rejected({
      {"E = 0", plan({.experts = 0, .ranks = 2}), "options.experts"},
      {"E > kMaxExperts", plan({.experts = kMaxExperts + 1, .ranks = 2}), "options.experts"},
      {"R = 0", plan({.experts = 8, .ranks = 0}), "options.ranks"},
      {"slots < 0", plan({.experts = 8, .ranks = 2, .slots_per_rank = -1}), "options.slots_per_rank"},
      {"R*S < E", plan({.experts = 8, .ranks = 2, .slots_per_rank = 3}), "options.slots_per_rank"},
      {"replicas < 0", plan({.experts = 8, .ranks = 2, .replicas = -1, .expert_load = std::vector<double>(8, 1)}), "options.replicas"},
      {"replicas > E*(R-1)", plan({.experts = 8, .ranks = 2, .replicas = 9, .expert_load = std::vector<double>(8, 1)}), "options.replicas"},
      {"replicas > free slots", plan({.experts = 8, .ranks = 2, .slots_per_rank = 5, .replicas = 3, .expert_load = std::vector<double>(8, 1)}), "options.replicas"},
      {"replicas without loads", plan({.experts = 8, .ranks = 2, .replicas = 1}), "options.expert_load"},
      {"loads of the wrong size", plan({.experts = 8, .ranks = 2, .expert_load = std::vector<double>(7, 1)}), "options.expert_load"},
      {"a negative load", plan({.experts = 2, .ranks = 2, .expert_load = {1, -1}}), "options.expert_load"},
      {"a NaN load", plan({.experts = 2, .ranks = 2, .expert_load = {1, std::nan("")}}), "options.expert_load"},
      {"unknown rule", plan({.experts = 2, .ranks = 2, .rule = ReplicaRule(7)}), "options.rule"},
      {"slots_for_memory 0 bytes/expert", [] { ep::slots_for_memory(10, 0); }, "bytes_per_expert"},
      {"slots_for_memory negative", [] { ep::slots_for_memory(-1, 10); }, "free_bytes"},
      {"route: expert out of range", [&] { ep::route_assignment(p, 0, 8, 0); }, "expert"},
      {"route: negative token", [&] { ep::route_assignment(p, -1, 0, 0); }, "token"},
      {"route: home rank out of range", [&] { ep::route_assignment(p, 0, 0, 2); }, "home_rank"},
      {"route: inconsistent placement", [&] { ep::route_assignment(broken, 0, 0, 0); }, "placement"},
      {"split: negative tokens", [] { ep::split_tokens(-1, 2); }, "tokens"},
      {"split: no ranks", [] { ep::split_tokens(4, 0); }, "ranks"},
      {"dispatch: id out of range", [&] { ep::plan_dispatch(p, ids.data(), 1, 2, 0, 0); }, "topk_ids"},
      {"dispatch: null ids", [&] { ep::plan_dispatch(p, nullptr, 1, 2, 0, 0); }, "topk_ids"},
      {"dispatch: rank out of range", [&] { ep::plan_dispatch(p, ids.data(), 0, 2, 0, 2); }, "rank"},
      {"dispatch: topk 0", [&] { ep::plan_dispatch(p, ids.data(), 1, 0, 0, 0); }, "topk"},
      {"dispatch: negative tokens", [&] { ep::plan_dispatch(p, ids.data(), -1, 2, 0, 0); }, "tokens"},
      {"dispatch: negative token_offset", [&] { ep::plan_dispatch(p, ids.data(), 1, 1, -1, 0); }, "token_offset"},
      {"receive: counts of the wrong size", [&] { ep::plan_receive(p, 0, std::vector<int32_t>(7, 0)); }, "counts"},
      {"receive: negative count", [&] { ep::plan_receive(p, 0, {0, 0, 0, -1, 0, 0, 0, 0}); }, "counts"},
      {"receive: rank out of range", [&] { ep::plan_receive(p, 5, std::vector<int32_t>(8, 0)); }, "rank"},
      {"decode: capacity 0", [&] { ep::decode_geometry(p, 0); }, "capacity"},
      {"decode: capacity past int32 rows", [&] { ep::decode_geometry(p, int64_t(1) << 31); }, "capacity"},
      {"receive: negative message capacity", [&] { ep::plan_receive(p, 0, std::vector<int32_t>(size_t(p.num_slots()), 0), -1); }, "message_capacity"},
      {"no-overflow capacity: topk 0", [&] { ep::no_overflow_capacity(p, 4, 0); }, "topk"},
      {"decode: layout of another placement",
       [&] { ep::plan_decode_dispatch(ep::DecodeGeometry{4, 4, 1}, ep::plan_dispatch(p, ids.data(), 0, 2, 0, 0)); }, "layout"},
  });
  // Rows for an empty slot: rank 0 of a 10-expert, 4-rank plan has slots {0, 1, -1}.
  const Placement q = ep::plan_placement({.experts = 10, .ranks = 4});
  std::vector<int32_t> counts(12, 0);
  counts[2] = 1;
  EXPECT_TRUE(throws_naming([&] { ep::plan_receive(q, 0, counts); }, "counts"));
}

// ---- layouts ------------------------------------------------------------------------------

TEST_F(EpLayout, DispatchIsAStableSortByDestinationThenLocalExpert) {
  std::vector<double> load(64);
  for (double& l : load) l = double(uniform_int(0, 100));
  const Placement p = ep::plan_placement({.experts = 64, .ranks = 4, .replicas = 8, .expert_load = load});
  const int64_t T = 123, k = 6, t0 = 1000, rank = 2;
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  for (int32_t& e : ids) e = int32_t(uniform_int(0, 63));
  const ep::DispatchLayout d = ep::plan_dispatch(p, ids.data(), T, k, t0, rank);
  const int64_t S = p.slots_per_rank;
  ASSERT_EQ(d.send_assignment.size(), size_t(T * k));
  std::vector<int32_t> counts(size_t(p.num_slots()), 0);
  for (int64_t a = 0; a < T * k; ++a) {
    EXPECT_EQ(d.slot[size_t(a)], ep::route_assignment(p, t0 + a / k, ids[size_t(a)], rank));
    ++counts[size_t(d.slot[size_t(a)])];
  }
  EXPECT_EQ(d.slot_counts, counts);
  for (int64_t i = 1; i < T * k; ++i) {  // (slot, assignment) strictly increasing: grouped, stable
    const int32_t a = d.send_assignment[size_t(i - 1)], b = d.send_assignment[size_t(i)];
    EXPECT_TRUE(d.slot[size_t(a)] < d.slot[size_t(b)] || (d.slot[size_t(a)] == d.slot[size_t(b)] && a < b)) << "row " << i;
  }
  for (int64_t r = 0; r < p.ranks; ++r) {
    EXPECT_EQ(d.send_offsets[size_t(r)], std::accumulate(counts.begin(), counts.begin() + r * S, int64_t(0)));
    for (int64_t i = d.send_offsets[size_t(r)]; i < d.send_offsets[size_t(r + 1)]; ++i)
      EXPECT_EQ(d.slot[size_t(d.send_assignment[size_t(i)])] / S, r);
  }
}

TEST(EpLayoutHand, ReceiveGroupsByLocalExpertThenSourceFromCountsAlone) {
  const Placement p = ep::plan_placement({.experts = 4, .ranks = 2});  // r0 {0, 1}, r1 {2, 3}
  // counts[s][l]: source 0 sends 2 rows to l0 and 1 to l1; source 1 sends 3 to l1.
  const ep::ReceiveLayout r = ep::plan_receive(p, 1, {2, 1, 0, 3});
  EXPECT_EQ(r.recv_offsets, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(r.expert_offsets, (std::vector<int64_t>{0, 2, 6}));
  EXPECT_EQ(r.grouped_rows, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // counts {1, 2, 3, 0}: rows s0:l0 [0], s0:l1 [1, 2], s1:l0 [3, 4, 5]; l0 first takes 0 then 3..5.
  const ep::ReceiveLayout q = ep::plan_receive(p, 0, {1, 2, 3, 0});
  EXPECT_EQ(q.grouped_rows, (std::vector<int64_t>{0, 3, 4, 5, 1, 2}));
  EXPECT_EQ(q.expert_offsets, (std::vector<int64_t>{0, 4, 6}));
}

TEST(EpLayoutHand, DecodeKeepsTheFirstCapacityRowsOfEveryDestinationAndCountsTheRest) {
  const Placement p = ep::plan_placement({.experts = 4, .ranks = 2});  // r0 {0, 1}, r1 {2, 3}
  const ep::DecodeGeometry g = ep::decode_geometry(p, 3);
  EXPECT_EQ(g.message_rows(), 3);
  EXPECT_EQ(g.buffer_rows(), 6);
  EXPECT_EQ(g.row(1, 2), 5);
  // Five tokens, k = 1: four to expert 3 (rank 1, l 1), one to expert 0 (rank 0: row 0).
  const std::vector<int32_t> ids{3, 3, 0, 3, 3};
  const ep::DecodeDispatch d = ep::plan_decode_dispatch(g, ep::plan_dispatch(p, ids.data(), 5, 1, 0, 0));
  EXPECT_EQ(d.send_row, (std::vector<int64_t>{3, 4, 0, 5, -1}));
  EXPECT_EQ(d.sent_counts, (std::vector<int32_t>{1, 0, 0, 3}));
  EXPECT_EQ(d.overflow, 1);
  // Two experts on rank 1: expert 2 first in the send order, so expert 3's last row overflows.
  const std::vector<int32_t> mixed{3, 2, 3, 2};
  const ep::DecodeDispatch m = ep::plan_decode_dispatch(g, ep::plan_dispatch(p, mixed.data(), 4, 1, 0, 0));
  EXPECT_EQ(m.send_row, (std::vector<int64_t>{5, 3, -1, 4}));
  EXPECT_EQ(m.sent_counts, (std::vector<int32_t>{0, 0, 2, 1}));
  EXPECT_EQ(m.overflow, 1);
  // A source never overflows at no_overflow_capacity: T * min(k, S).
  EXPECT_EQ(ep::no_overflow_capacity(p, 5, 1), 5);
  EXPECT_EQ(ep::no_overflow_capacity(p, 5, 4), 10);
  EXPECT_EQ(ep::no_overflow_capacity(p, 0, 2), 1);
}

TEST(EpLayoutHand, DecodeReceiveChunksStartAtFixedOffsets) {
  const Placement p = ep::plan_placement({.experts = 4, .ranks = 2});
  // Capacity 4: source 0 sends {1, 2}, source 1 sends {3, 0}: chunks at rows 0 and 4.
  const ep::ReceiveLayout r = ep::plan_receive(p, 0, {1, 2, 3, 0}, 4);
  EXPECT_EQ(r.recv_offsets, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(r.grouped_rows, (std::vector<int64_t>{0, 4, 5, 6, 1, 2}));
  EXPECT_EQ(r.expert_offsets, (std::vector<int64_t>{0, 4, 6}));
  EXPECT_THROW(ep::plan_receive(p, 0, {1, 2, 3, 2}, 4), Error);  // source 1: 5 rows > 4
}

}  // namespace
}  // namespace moekit::testing
