// placement.cpp — the expert-parallel placement planner, the replica rule and the token split
// (moekit/ep.hpp). Pure host code: run once per placement, reused by the CPU simulation and by
// the future NCCL path, which copies the Placement's tables to the devices.
#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <string>
#include <utility>

#include "common/validate.hpp"
#include "ep/internal.hpp"
#include "moekit/ep.hpp"

namespace moekit::ep {
namespace {

using detail::fail;
std::string str(int64_t v) { return std::to_string(v); }

constexpr const char* kPlan = "plan_placement";

// The effective slot count: 0 asks for just enough room; more than E is taken as E (a rank holds
// an expert at most once, so further slots would stay empty and only inflate decode buffers).
int64_t effective_slots(const PlacementOptions& o) {
  const int64_t s = o.slots_per_rank > 0 ? o.slots_per_rank : (o.experts + o.replicas + o.ranks - 1) / o.ranks;
  return std::min(s, o.experts);
}

void validate(const PlacementOptions& o) {
  if (o.experts < 1 || o.experts > kMaxExperts)
    fail(kPlan, "options.experts", "must be in [1, " + str(kMaxExperts) + "], got " + str(o.experts));
  // Slot ids are int32 on the device: R*S <= R*E must fit.
  if (o.ranks < 1 || o.ranks > std::numeric_limits<int32_t>::max() / o.experts)
    fail(kPlan, "options.ranks", "must be in [1, " + str(std::numeric_limits<int32_t>::max() / o.experts) +
                                     "] (R*E fits int32 slot ids), got " + str(o.ranks));
  if (int(o.rule) != int(ReplicaRule::token_modulo) && int(o.rule) != int(ReplicaRule::prefer_home))
    fail(kPlan, "options.rule", "must be token_modulo or prefer_home, got " + str(int(o.rule)));
  if (o.slots_per_rank < 0)
    fail(kPlan, "options.slots_per_rank", "must be >= 0 (0: just enough), got " + str(o.slots_per_rank));
  if (o.slots_per_rank > 0 && o.slots_per_rank * o.ranks < o.experts)
    fail(kPlan, "options.slots_per_rank", str(o.ranks) + " ranks x " + str(o.slots_per_rank) +
                                              " slots cannot hold " + str(o.experts) + " experts");
  if (o.replicas < 0) fail(kPlan, "options.replicas", "must be >= 0, got " + str(o.replicas));
  if (o.replicas > o.experts * (o.ranks - 1))
    fail(kPlan, "options.replicas", "at most E*(R-1) = " + str(o.experts * (o.ranks - 1)) +
                                        " (an expert at most once per rank), got " + str(o.replicas));
  const int64_t free_slots = effective_slots(o) * o.ranks - o.experts;
  if (o.replicas > free_slots)
    fail(kPlan, "options.replicas", "only " + str(free_slots) + " slots are left after one copy of every expert, got " +
                                        str(o.replicas));
  if (!o.expert_load.empty() && int64_t(o.expert_load.size()) != o.experts)
    fail(kPlan, "options.expert_load", "expected " + str(o.experts) + " values (one per expert) or none, got " +
                                           str(int64_t(o.expert_load.size())));
  for (size_t e = 0; e < o.expert_load.size(); ++e)
    if (!std::isfinite(o.expert_load[e]) || o.expert_load[e] < 0)
      fail(kPlan, "options.expert_load", "must be finite and >= 0; entry " + str(int64_t(e)) + " is " +
                                             std::to_string(o.expert_load[e]));
  if (o.replicas > 0 && o.expert_load.empty())
    fail(kPlan, "options.expert_load", "is required when options.replicas > 0 (it says which experts are hot)");
}

// Phase 1: the replica budget, one copy at a time, to the expert with the largest load per copy
// (ties: lower id). An expert never gets more copies than ranks, and one with no load none.
// Returns the copies after each of the budgets asked for (ascending): prefixes of one sequence.
std::vector<std::vector<int64_t>> replica_counts(const PlacementOptions& o, const std::vector<int64_t>& budgets) {
  std::vector<int64_t> copies(static_cast<size_t>(o.experts), 1);
  auto share = [&](int64_t e) { return o.expert_load[size_t(e)] / double(copies[size_t(e)]); };
  auto lower_priority = [&](int64_t a, int64_t b) {
    const double sa = share(a), sb = share(b);
    return sa != sb ? sa < sb : a > b;
  };
  std::priority_queue<int64_t, std::vector<int64_t>, decltype(lower_priority)> heap(lower_priority);
  if (o.ranks > 1)
    for (int64_t e = 0; e < o.experts; ++e) heap.push(e);
  std::vector<std::vector<int64_t>> snapshots;
  int64_t placed = 0;
  for (int64_t budget : budgets) {
    for (; placed < budget && !heap.empty(); ++placed) {
      const int64_t e = heap.top();
      if (share(e) <= 0) break;  // only idle experts are left: a copy would serve nothing
      heap.pop();
      ++copies[size_t(e)];
      if (copies[size_t(e)] < o.ranks) heap.push(e);
    }
    snapshots.push_back(copies);
  }
  return snapshots;
}

}  // namespace

std::vector<std::vector<int32_t>> internal::pack(const std::vector<double>& expert_load,
                                                 const std::vector<int64_t>& copies, int64_t R, int64_t S) {
  const int64_t E = int64_t(expert_load.size());
  std::vector<double> share(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) share[size_t(e)] = expert_load[size_t(e)] / double(copies[size_t(e)]);
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return share[size_t(a)] > share[size_t(b)]; });

  std::vector<std::vector<int32_t>> held(static_cast<size_t>(R));
  std::vector<uint8_t> holds(static_cast<size_t>(R * E), 0);
  std::vector<double> load(static_cast<size_t>(R), 0.0);
  auto put = [&](int64_t r, int64_t e) {
    held[size_t(r)].push_back(int32_t(e));
    holds[size_t(r * E + e)] = 1;
    load[size_t(r)] += share[size_t(e)];
  };
  for (int64_t e : order) {
    for (int64_t c = 0; c < copies[size_t(e)]; ++c) {
      int64_t best = -1;
      for (int64_t r = 0; r < R; ++r) {
        if (int64_t(held[size_t(r)].size()) >= S || holds[size_t(r * E + e)]) continue;
        if (best < 0 || load[size_t(r)] < load[size_t(best)] ||
            (load[size_t(r)] == load[size_t(best)] && held[size_t(r)].size() < held[size_t(best)].size()))
          best = r;
      }
      if (best < 0) {
        // NOTES: every rank with a free slot already holds e. Slots suffice in total, so some
        // rank `from` is full without e, and one expert x of it is missing from a rank `to` with
        // a free slot (to holds e and fewer than S experts). Moving x frees a slot for e.
        int64_t to = 0, from = 0;
        while (int64_t(held[size_t(to)].size()) >= S) ++to;
        while (holds[size_t(from * E + e)]) ++from;
        auto& src = held[size_t(from)];
        const auto it = std::find_if(src.begin(), src.end(), [&](int32_t x) { return !holds[size_t(to * E + x)]; });
        const int32_t x = *it;
        src.erase(it);
        holds[size_t(from * E + x)] = 0;
        load[size_t(from)] -= share[size_t(x)];
        put(to, x);
        best = from;
      }
      put(best, e);
    }
  }
  return held;
}

namespace {

// What each rank serves: its experts' loads split evenly over their copies, summed in ascending
// expert order (one fixed order, so candidates compare exactly and the result is reproducible).
std::vector<double> rank_loads(const std::vector<std::vector<int32_t>>& held, const std::vector<double>& load,
                               const std::vector<int64_t>& copies) {
  std::vector<double> out(held.size(), 0.0);
  for (size_t r = 0; r < held.size(); ++r)
    for (int32_t e : held[r]) out[r] += (load.empty() ? 1.0 : load[size_t(e)]) / double(copies[size_t(e)]);
  return out;
}

}  // namespace

int64_t Placement::local_experts(int64_t rank) const {
  int64_t n = 0;
  for (int64_t l = 0; l < slots_per_rank; ++l) n += slot_expert[size_t(rank * slots_per_rank + l)] >= 0;
  return n;
}

Placement plan_placement(const PlacementOptions& options) {
  validate(options);
  const int64_t E = options.experts, R = options.ranks, S = effective_slots(options);
  const bool loaded = !options.expert_load.empty();

  std::vector<int64_t> copies(static_cast<size_t>(E), 1);
  std::vector<std::vector<int32_t>> held(static_cast<size_t>(R));
  if (loaded) {
    // NOTES: more copies do not always lower the peak (a copy may have to sit on a busy rank),
    // so the budgets 0, 1, 2, 4, ..., replicas are each packed and the lowest peak rank load
    // wins (ties: fewer copies). Budget 0 is a candidate: replicas never make the plan worse.
    std::vector<int64_t> budgets{0};
    for (int64_t b = 1; b < options.replicas; b *= 2) budgets.push_back(b);
    if (options.replicas > 0) budgets.push_back(options.replicas);
    const std::vector<std::vector<int64_t>> candidates = replica_counts(options, budgets);
    double best_peak = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      std::vector<std::vector<int32_t>> h = internal::pack(options.expert_load, candidates[i], R, S);
      for (auto& experts : h) std::sort(experts.begin(), experts.end());
      const std::vector<double> loads = rank_loads(h, options.expert_load, candidates[i]);
      const double peak = *std::max_element(loads.begin(), loads.end());
      if (i == 0 || peak < best_peak) best_peak = peak, copies = candidates[i], held = std::move(h);
    }
  } else {
    // No loads: contiguous blocks, as checkpoints are sharded; sizes differ by at most one.
    for (int64_t r = 0; r < R; ++r)
      for (int64_t e = E * r / R; e < E * (r + 1) / R; ++e) held[size_t(r)].push_back(int32_t(e));
  }

  Placement p;
  p.experts = E, p.ranks = R, p.slots_per_rank = S, p.rule = options.rule;
  p.slot_expert.assign(size_t(R * S), -1);
  for (int64_t r = 0; r < R; ++r) std::copy(held[size_t(r)].begin(), held[size_t(r)].end(), p.slot_expert.begin() + r * S);
  p.replica_offsets.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) p.replica_offsets[size_t(e + 1)] = p.replica_offsets[size_t(e)] + int32_t(copies[size_t(e)]);
  p.replica_slots.assign(size_t(p.replica_offsets[size_t(E)]), -1);
  std::vector<int32_t> next(p.replica_offsets.begin(), p.replica_offsets.end() - 1);
  for (int64_t s = 0; s < R * S; ++s)  // ascending slots: each expert's copies come out ascending
    if (p.slot_expert[size_t(s)] >= 0) p.replica_slots[size_t(next[size_t(p.slot_expert[size_t(s)])]++)] = int32_t(s);
  p.rank_load = rank_loads(held, options.expert_load, copies);
  return p;
}

int64_t slots_for_memory(int64_t free_bytes, int64_t bytes_per_expert) {
  if (free_bytes < 0) fail("slots_for_memory", "free_bytes", "must be >= 0, got " + str(free_bytes));
  if (bytes_per_expert <= 0)
    fail("slots_for_memory", "bytes_per_expert", "must be > 0, got " + str(bytes_per_expert));
  return free_bytes / bytes_per_expert;
}

namespace internal {

int32_t route_unchecked(const Placement& p, int64_t token, int32_t expert, int64_t home_rank) {
  const int32_t begin = p.replica_offsets[size_t(expert)];
  const int32_t n = p.replica_offsets[size_t(expert) + 1] - begin;
  if (p.rule == ReplicaRule::prefer_home)
    for (int32_t i = 0; i < n; ++i)
      if (p.replica_slots[size_t(begin + i)] / p.slots_per_rank == home_rank) return p.replica_slots[size_t(begin + i)];
  return p.replica_slots[size_t(begin + token % n)];
}

void expect_placement(const Placement& p, const char* entry, const char* arg) {
  const int64_t E = p.experts, R = p.ranks, S = p.slots_per_rank;
  bool ok = E >= 1 && R >= 1 && S >= 1 && p.slot_expert.size() == size_t(R * S) &&
            p.replica_offsets.size() == size_t(E + 1) && p.replica_offsets[0] == 0 &&
            p.replica_slots.size() == size_t(p.replica_offsets[size_t(E)]);
  for (int64_t e = 0; ok && e < E; ++e) {
    ok = p.replica_offsets[size_t(e + 1)] > p.replica_offsets[size_t(e)];
    for (int32_t i = p.replica_offsets[size_t(e)]; ok && i < p.replica_offsets[size_t(e + 1)]; ++i) {
      const int32_t s = p.replica_slots[size_t(i)];
      ok = s >= 0 && s < R * S && p.slot_expert[size_t(s)] == e;
    }
  }
  if (!ok) fail(entry, arg, "is not a consistent placement (use plan_placement)");
}

}  // namespace internal

int32_t route_assignment(const Placement& p, int64_t token, int32_t expert, int64_t home_rank) {
  constexpr const char* kEntry = "route_assignment";
  internal::expect_placement(p, kEntry, "placement");
  if (expert < 0 || expert >= p.experts)
    fail(kEntry, "expert", "must be in [0, " + str(p.experts) + "), got " + str(expert));
  if (token < 0) fail(kEntry, "token", "must be >= 0, got " + str(token));
  if (home_rank < 0 || home_rank >= p.ranks)
    fail(kEntry, "home_rank", "must be in [0, " + str(p.ranks) + "), got " + str(home_rank));
  return internal::route_unchecked(p, token, expert, home_rank);
}

std::vector<int64_t> split_tokens(int64_t tokens, int64_t ranks) {
  if (tokens < 0) fail("split_tokens", "tokens", "must be >= 0, got " + str(tokens));
  if (ranks < 1) fail("split_tokens", "ranks", "must be >= 1, got " + str(ranks));
  std::vector<int64_t> offsets(static_cast<size_t>(ranks + 1));
  for (int64_t r = 0; r <= ranks; ++r) offsets[size_t(r)] = tokens / ranks * r + std::min(r, tokens % ranks);
  return offsets;
}

}  // namespace moekit::ep
