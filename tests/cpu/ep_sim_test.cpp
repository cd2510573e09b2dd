// ep_sim_test.cpp — R expert-parallel ranks simulated on the CPU (tests/support/ep_sim.hpp): every
// assignment delivered exactly once to its planned rank and back to its (token, slot), the
// combined output bitwise the single-rank one, decode's overflow counted exactly, and the
// checker itself shown to catch each kind of fault.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "cpu_test_util.hpp"
#include "moekit/reference.hpp"
#include "support/ep_sim.hpp"

namespace moekit::testing {
namespace {

using ep::bf16;
using ep::Placement;
using EpSim = Seeded;

enum class Routing { uniform, skewed, one_expert };
const char* routing_name(Routing r) {
  return r == Routing::uniform ? "uniform" : r == Routing::skewed ? "skewed" : "one-expert";
}

struct Problem {
  int64_t T = 0, H = 0, E = 0, k = 0;
  std::vector<bf16> x;          // [T, H]
  std::vector<int32_t> ids;     // [T, k]
  std::vector<float> weights;   // [T, k]
  ep::SimInput input() const { return {x.data(), ids.data(), weights.data(), T, k, H}; }
  std::vector<double> histogram() const {
    std::vector<double> h(static_cast<size_t>(E), 0.0);
    for (int32_t e : ids) h[size_t(e)] += 1;
    return h;
  }
};

// Uniform and skewed draw k distinct experts per token (as the router does), skewed with
// probability ~ 1/(rank+1) over a random order; one_expert sends every slot of every token to
// the same expert (duplicates within a token: the adversarial case for decode's capacity).
Problem make_problem(Routing kind, int64_t T, int64_t E, int64_t k, int64_t H, std::mt19937_64& rng) {
  Problem p{T, H, E, k};
  std::uniform_real_distribution<float> xs(-2.0f, 2.0f), ws(0.05f, 1.0f);
  p.x.resize(size_t(T * H));
  for (bf16& v : p.x) v = ref::to_bf16(xs(rng));
  p.weights.resize(size_t(T * k));
  for (float& w : p.weights) w = ws(rng);
  std::vector<int32_t> perm(static_cast<size_t>(E));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<double> zipf(static_cast<size_t>(E));
  for (int64_t i = 0; i < E; ++i) zipf[size_t(i)] = 1.0 / double(i + 1);
  std::discrete_distribution<int32_t> skew(zipf.begin(), zipf.end());
  p.ids.resize(size_t(T * k));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> row;
    while (int64_t(row.size()) < k) {
      int32_t e = kind == Routing::one_expert ? int32_t(E - 1)
                  : kind == Routing::skewed   ? perm[size_t(skew(rng))]
                                              : int32_t(std::uniform_int_distribution<int64_t>(0, E - 1)(rng));
      if (kind == Routing::one_expert || std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    std::copy(row.begin(), row.end(), p.ids.begin() + t * k);
  }
  return p;
}

// The stand-in expert: affine in x with an expert-dependent scale and offset, times the weight.
// Any change of expert, token row or weight changes the result.
ep::ExpertRowFn stand_in(int64_t H) {
  return [H](int32_t e, const bf16* x, float w, bf16* y) {
    const float scale = 1.0f + 0.0625f * float(e % 16), offset = 0.001953125f * float(e);
    for (int64_t h = 0; h < H; ++h) y[h] = ref::to_bf16(w * (ref::to_float(x[h]) * scale + offset - 0.25f * float(h % 4)));
  };
}

// Rows each source sends each destination rank, in send order (slot, then ascending assignment),
// counted here from route_assignment alone; the largest is the decode capacity with no overflow,
// and the rows past `capacity` in each (source, destination) are the ones decode must report.
struct MessageLoads {
  int64_t max_rows = 0;
  std::vector<int64_t> beyond(int64_t capacity) const {
    std::vector<int64_t> out;
    for (const auto& [key, list] : rows)
      for (size_t i = size_t(capacity); i < list.size(); ++i) out.push_back(list[i]);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> rows;  // (source, destination) -> assignments
};
MessageLoads message_loads(const Placement& p, const Problem& pb) {
  std::map<std::pair<int64_t, int32_t>, std::vector<int64_t>> by_slot;  // (source, slot): ascending a
  const std::vector<int64_t> split = ep::split_tokens(pb.T, p.ranks);
  for (int64_t r = 0; r < p.ranks; ++r)
    for (int64_t a = split[size_t(r)] * pb.k; a < split[size_t(r + 1)] * pb.k; ++a)
      by_slot[{r, ep::route_assignment(p, a / pb.k, pb.ids[size_t(a)], r)}].push_back(a);
  MessageLoads m;
  for (const auto& [key, list] : by_slot) {  // slots ascending within a source: the send order
    auto& msg = m.rows[{key.first, key.second / p.slots_per_rank}];
    msg.insert(msg.end(), list.begin(), list.end());
    m.max_rows = std::max(m.max_rows, int64_t(msg.size()));
  }
  return m;
}

void expect_round_trip(const Placement& p, const Problem& pb, const ep::SimOptions& opt,
                       const std::vector<int64_t>& expect_overflowed) {
  const ep::SimResult res = ep::simulate(p, pb.input(), stand_in(pb.H), opt);
  EXPECT_TRUE(res.check.ok()) << res.check.first;
  EXPECT_EQ(res.log.overflowed, expect_overflowed);
  EXPECT_EQ(res.overflow, int64_t(expect_overflowed.size()));
  EXPECT_EQ(res.check.delivered + res.overflow, pb.T * pb.k);
  EXPECT_EQ(std::accumulate(res.rows_sent.begin(), res.rows_sent.end(), int64_t(0)), res.check.delivered);
  // Rows first: a result swapped between two slots of one token may leave the sum unchanged.
  EXPECT_TRUE(res.y_rows == ep::single_rank_rows(pb.input(), stand_in(pb.H), expect_overflowed))
      << "an assignment's result differs from the single-rank one, or landed at another row";
  const std::vector<bf16> want = ep::single_rank(pb.input(), stand_in(pb.H), expect_overflowed);
  ASSERT_EQ(res.y.size(), want.size());
  EXPECT_TRUE(res.y == want) << "combined output differs from the single-rank computation";
}

TEST_F(EpSim, RoundTripMatchesOneRankBitwiseForEveryShape) {
  const int64_t H = 16;
  for (int64_t R : {1, 2, 4, 8})
    for (int64_t E : {8, 64, 256})
      for (Routing kind : {Routing::uniform, Routing::skewed, Routing::one_expert})
        for (int replicas = 0; replicas < 3; ++replicas) {  // 0: off; 1: token_modulo; 2: prefer_home
          if (replicas && R == 1) continue;
          const int64_t k = E == 8 ? 2 : 8, T = 29 * R + 3;  // slices differ in size by one
          SCOPED_TRACE(::testing::Message() << "R=" << R << " E=" << E << " routing=" << routing_name(kind)
                                            << " replicas=" << replicas);
          const Problem pb = make_problem(kind, T, E, k, H, rng);
          ep::PlacementOptions o{.experts = E, .ranks = R};
          if (replicas) {
            o.expert_load = pb.histogram();
            o.replicas = std::min(E / 4 + 1, E * (R - 1));
            o.rule = replicas == 1 ? ep::ReplicaRule::token_modulo : ep::ReplicaRule::prefer_home;
          }
          const Placement p = ep::plan_placement(o);
          const MessageLoads loads = message_loads(p, pb);
          {
            SCOPED_TRACE("prefill");
            expect_round_trip(p, pb, {ep::Exchange::prefill}, {});
          }
          {
            SCOPED_TRACE("decode, capacity = the largest message");
            expect_round_trip(p, pb, {ep::Exchange::decode, loads.max_rows}, {});
          }
          if (loads.max_rows > 1) {
            SCOPED_TRACE("decode, overflow");
            const int64_t cap = loads.max_rows / 2;
            expect_round_trip(p, pb, {ep::Exchange::decode, cap}, loads.beyond(cap));
          }
        }
}

TEST_F(EpSim, AHotExpertOnEveryRankIsServedAtHomeUnderPreferHome) {
  const int64_t R = 4, E = 64, T = 64, k = 8;
  const Problem pb = make_problem(Routing::one_expert, T, E, k, 16, rng);
  const Placement p = ep::plan_placement({.experts = E, .ranks = R, .replicas = R - 1,
                                          .expert_load = pb.histogram(), .rule = ep::ReplicaRule::prefer_home});
  ASSERT_EQ(p.copies(E - 1), R);
  const ep::SimResult res = ep::simulate(p, pb.input(), stand_in(16), {});
  EXPECT_TRUE(res.check.ok()) << res.check.first;
  for (int64_t s = 0; s < R; ++s)
    for (int64_t d = 0; d < R; ++d)
      EXPECT_EQ(res.rows_sent[size_t(s * R + d)], s == d ? T / R * k : 0) << "s=" << s << " d=" << d;
  // token_modulo spreads the same tokens over all ranks instead: T*k/R rows each.
  Placement m = p;
  m.rule = ep::ReplicaRule::token_modulo;
  const ep::SimResult spread = ep::simulate(m, pb.input(), stand_in(16), {});
  EXPECT_TRUE(spread.check.ok()) << spread.check.first;
  for (int64_t d = 0; d < R; ++d) {
    int64_t got = 0;
    for (int64_t s = 0; s < R; ++s) got += spread.rows_sent[size_t(s * R + d)];
    EXPECT_EQ(got, T * k / R) << "d=" << d;
  }
}

TEST_F(EpSim, EmptyAndTinyInputs) {
  const Placement p = ep::plan_placement({.experts = 8, .ranks = 4});
  for (int64_t T : {0, 1, 3}) {  // T < R: some ranks own no tokens
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const Problem pb = make_problem(Routing::uniform, T, 8, 2, 8, rng);
    expect_round_trip(p, pb, {ep::Exchange::prefill}, {});
    // At most one token per rank: no_overflow_capacity's promise is min(k, S) = 2 rows.
    expect_round_trip(p, pb, {ep::Exchange::decode, ep::no_overflow_capacity(p, 1, 2)}, {});
  }
}

TEST_F(EpSim, SameInputsSameEverything) {
  const Problem pb = make_problem(Routing::skewed, 200, 64, 8, 16, rng);
  const Placement p = ep::plan_placement({.experts = 64, .ranks = 8, .replicas = 8, .expert_load = pb.histogram()});
  for (ep::SimOptions opt : {ep::SimOptions{ep::Exchange::prefill}, ep::SimOptions{ep::Exchange::decode, 3}}) {
    const ep::SimResult a = ep::simulate(p, pb.input(), stand_in(16), opt);
    const ep::SimResult b = ep::simulate(p, pb.input(), stand_in(16), opt);
    EXPECT_TRUE(a.y == b.y);
    EXPECT_TRUE(a.y_rows == b.y_rows);
    EXPECT_EQ(a.rows_sent, b.rows_sent);
    EXPECT_EQ(a.log.returned, b.log.returned);
    EXPECT_EQ(a.log.overflowed, b.log.overflowed);
    ASSERT_EQ(a.log.processed.size(), b.log.processed.size());
    for (size_t i = 0; i < a.log.processed.size(); ++i) {
      EXPECT_EQ(a.log.processed[i].assignment, b.log.processed[i].assignment);
      EXPECT_EQ(a.log.processed[i].rank, b.log.processed[i].rank);
    }
  }
}

TEST_F(EpSim, TheCheckerCatchesEachKindOfFault) {
  const Problem pb = make_problem(Routing::uniform, 40, 64, 4, 8, rng);
  const Placement p = ep::plan_placement({.experts = 64, .ranks = 4});
  const ep::SimResult res = ep::simulate(p, pb.input(), stand_in(8), {});
  ASSERT_TRUE(res.check.ok()) << res.check.first;
  ASSERT_EQ(res.check.delivered, 160);
  auto check = [&](const ep::DeliveryLog& log) { return ep::check_delivery(p, pb.ids.data(), pb.T, pb.k, log); };
  {
    ep::DeliveryLog log = res.log;
    log.processed.push_back(log.processed[7]);
    EXPECT_EQ(check(log).duplicated, 1);
  }
  {
    ep::DeliveryLog log = res.log;
    const int64_t a = log.processed[3].assignment;
    log.processed.erase(log.processed.begin() + 3);
    const ep::DeliveryCheck c = check(log);
    EXPECT_EQ(c.missing, 1);
    EXPECT_EQ(c.misreturned, 1) << "row " << a << " got a result although its assignment never ran";
  }
  {
    ep::DeliveryLog log = res.log;
    log.processed[5].expert = (log.processed[5].expert + 1) % 64;
    EXPECT_EQ(check(log).misrouted, 1);
    log = res.log;
    log.processed[5].rank = (log.processed[5].rank + 1) % 4;
    EXPECT_EQ(check(log).misrouted, 1);
  }
  {
    ep::DeliveryLog log = res.log;
    std::swap(log.returned[10], log.returned[11]);
    EXPECT_EQ(check(log).misreturned, 2);
  }
  {
    ep::DeliveryLog log = res.log;
    log.processed.push_back({-1, 0, 0});
    EXPECT_EQ(check(log).spurious, 1);
  }
  {
    ep::DeliveryLog log = res.log;
    log.overflowed.push_back(12);  // reported as overflow, yet it ran
    EXPECT_EQ(check(log).duplicated, 1);
  }
}

TEST(EpSimHand, BadArgumentsAreNamed) {
  const Placement p = ep::plan_placement({.experts = 8, .ranks = 2});
  const std::vector<bf16> x(16, 0);
  const std::vector<int32_t> ids{0, 1};
  const std::vector<float> w{1, 1};
  const ep::SimInput in{x.data(), ids.data(), w.data(), 1, 2, 16};
  auto with = [&](auto edit) { ep::SimInput i = in; edit(i); return i; };
  const ep::ExpertRowFn fn = stand_in(16);
  Placement broken = p;
  broken.replica_offsets.pop_back();
  expect_all_rejected({
      {"negative tokens", [&] { ep::simulate(p, with([](auto& i) { i.tokens = -1; }), fn, {}); }, "in.tokens"},
      {"topk 0", [&] { ep::simulate(p, with([](auto& i) { i.topk = 0; }), fn, {}); }, "in.topk"},
      {"hidden 0", [&] { ep::simulate(p, with([](auto& i) { i.hidden = 0; }), fn, {}); }, "in.hidden"},
      {"null x", [&] { ep::simulate(p, with([](auto& i) { i.x = nullptr; }), fn, {}); }, "in.x"},
      {"null ids", [&] { ep::simulate(p, with([](auto& i) { i.topk_ids = nullptr; }), fn, {}); }, "in.topk_ids"},
      {"null weights", [&] { ep::simulate(p, with([](auto& i) { i.topk_weights = nullptr; }), fn, {}); }, "in.topk_weights"},
      {"no expert function", [&] { ep::simulate(p, in, nullptr, {}); }, "expert"},
      {"decode without capacity", [&] { ep::simulate(p, in, fn, {ep::Exchange::decode, 0}); }, "options.capacity"},
      {"unknown exchange", [&] { ep::simulate(p, in, fn, {ep::Exchange(5)}); }, "options.exchange"},
      {"inconsistent placement", [&] { ep::simulate(broken, in, fn, {}); }, "placement"},
      {"id out of range", [&] {
         const std::vector<int32_t> bad{0, 8};
         ep::simulate(p, with([&](auto& i) { i.topk_ids = bad.data(); }), fn, {});
       }, "topk_ids"},
      {"check: returned of the wrong size", [&] { ep::check_delivery(p, ids.data(), 1, 2, ep::DeliveryLog{}); }, "log.returned"},
      {"single_rank: dropped out of range", [&] { ep::single_rank(in, fn, {2}); }, "dropped"},
  });
}

}  // namespace
}  // namespace moekit::testing
