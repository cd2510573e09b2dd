// layout.cpp — where every row of an expert-parallel step goes: the send order of one source
// rank (plan_dispatch), the grouping of a receiver's rows by local expert (plan_receive), and
// decode's fixed-capacity buffers (decode_geometry, plan_decode_dispatch). Host code: the oracle of the
// NCCL path's kernels (src/ep/ep_kernels.cuh).
#include <algorithm>
#include <limits>
#include <string>

#include "common/validate.hpp"
#include "ep/internal.hpp"
#include "moekit/ep.hpp"

namespace moekit::ep {
namespace {
using detail::fail;
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

DispatchLayout plan_dispatch(const Placement& p, const int32_t* topk_ids, int64_t tokens,
                             int64_t topk, int64_t token_offset, int64_t rank) {
  constexpr const char* kEntry = "plan_dispatch";
  internal::expect_placement(p, kEntry, "placement");
  if (tokens < 0) fail(kEntry, "tokens", "must be >= 0, got " + str(tokens));
  if (topk < 1 || topk > kMaxTopk) fail(kEntry, "topk", "must be in [1, " + str(kMaxTopk) + "], got " + str(topk));
  if (token_offset < 0) fail(kEntry, "token_offset", "must be >= 0, got " + str(token_offset));
  if (rank < 0 || rank >= p.ranks) fail(kEntry, "rank", "must be in [0, " + str(p.ranks) + "), got " + str(rank));
  if (tokens > 0 && topk_ids == nullptr) fail(kEntry, "topk_ids", "is null but tokens = " + str(tokens));
  const int64_t A = tokens * topk, slots = p.num_slots();
  if (A > std::numeric_limits<int32_t>::max())
    fail(kEntry, "tokens", "T*k = " + str(A) + " is too large for 32-bit assignment ids");

  DispatchLayout d;
  d.slot.resize(size_t(A));
  d.slot_counts.assign(size_t(slots), 0);
  for (int64_t a = 0; a < A; ++a) {
    const int32_t e = topk_ids[a];
    if (e < 0 || e >= p.experts)
      fail(kEntry, "topk_ids", "entry " + str(a) + " is " + str(e) + ", outside [0, " + str(p.experts) + ")");
    d.slot[size_t(a)] = internal::route_unchecked(p, token_offset + a / topk, e, rank);
    ++d.slot_counts[size_t(d.slot[size_t(a)])];
  }
  // Stable counting sort by slot: slots are destination-major, so rows come out grouped by
  // destination, then local expert, then ascending assignment.
  std::vector<int64_t> next(size_t(slots) + 1, 0);
  for (int64_t s = 0; s < slots; ++s) next[size_t(s + 1)] = next[size_t(s)] + d.slot_counts[size_t(s)];
  d.send_offsets.resize(size_t(p.ranks + 1));
  for (int64_t r = 0; r <= p.ranks; ++r) d.send_offsets[size_t(r)] = next[size_t(r * p.slots_per_rank)];
  d.send_assignment.resize(size_t(A));
  for (int64_t a = 0; a < A; ++a) d.send_assignment[size_t(next[size_t(d.slot[size_t(a)])]++)] = int32_t(a);
  return d;
}

ReceiveLayout plan_receive(const Placement& p, int64_t rank, const std::vector<int32_t>& counts,
                           int64_t message_capacity) {
  constexpr const char* kEntry = "plan_receive";
  internal::expect_placement(p, kEntry, "placement");
  const int64_t R = p.ranks, S = p.slots_per_rank;
  if (rank < 0 || rank >= R) fail(kEntry, "rank", "must be in [0, " + str(R) + "), got " + str(rank));
  if (counts.size() != size_t(R * S))
    fail(kEntry, "counts", "expected [R][S] = " + str(R * S) + " values, got " + str(int64_t(counts.size())));
  for (int64_t s = 0; s < R; ++s)
    for (int64_t l = 0; l < S; ++l) {
      const int32_t c = counts[size_t(s * S + l)];
      if (c < 0) fail(kEntry, "counts", "entry [" + str(s) + "][" + str(l) + "] is negative: " + str(c));
      if (c > 0 && p.slot_expert[size_t(rank * S + l)] < 0)
        fail(kEntry, "counts", "entry [" + str(s) + "][" + str(l) + "] sends rows to an empty slot of rank " + str(rank));
    }
  if (message_capacity < 0) fail(kEntry, "message_capacity", "must be >= 0, got " + str(message_capacity));
  if (message_capacity > 0)
    for (int64_t s = 0; s < R; ++s) {
      int64_t rows = 0;
      for (int64_t l = 0; l < S; ++l) rows += counts[size_t(s * S + l)];
      if (rows > message_capacity)
        fail(kEntry, "counts", "source " + str(s) + " sends " + str(rows) + " rows, past the message capacity " +
                                   str(message_capacity));
    }

  ReceiveLayout r;
  // Where row (s, l, i) sits: source s's chunk, then its rows for experts below l.
  std::vector<int64_t> chunk_base(static_cast<size_t>(R * S));
  r.recv_offsets.assign(size_t(R + 1), 0);
  for (int64_t s = 0; s < R; ++s) {
    int64_t at = message_capacity > 0 ? s * message_capacity : r.recv_offsets[size_t(s)];
    for (int64_t l = 0; l < S; ++l) chunk_base[size_t(s * S + l)] = at, at += counts[size_t(s * S + l)];
    r.recv_offsets[size_t(s + 1)] = message_capacity > 0 ? (s + 1) * message_capacity : at;
  }
  r.expert_offsets.assign(size_t(S + 1), 0);
  r.grouped_rows.reserve(size_t(r.rows()));
  for (int64_t l = 0; l < S; ++l) {
    for (int64_t s = 0; s < R; ++s)
      for (int64_t i = 0; i < counts[size_t(s * S + l)]; ++i) r.grouped_rows.push_back(chunk_base[size_t(s * S + l)] + i);
    r.expert_offsets[size_t(l + 1)] = int64_t(r.grouped_rows.size());
  }
  return r;
}

DecodeGeometry decode_geometry(const Placement& p, int64_t capacity) {
  constexpr const char* kEntry = "decode_geometry";
  internal::expect_placement(p, kEntry, "placement");
  if (capacity < 1) fail(kEntry, "capacity", "must be >= 1 row per (source, destination), got " + str(capacity));
  // Buffer rows are int32 on the device, like sorted_ids.
  const int64_t limit = std::numeric_limits<int32_t>::max() / p.ranks;
  if (capacity > limit)
    fail(kEntry, "capacity", "R*capacity must fit 32-bit row ids: at most " + str(limit) + ", got " + str(capacity));
  return DecodeGeometry{p.ranks, p.slots_per_rank, capacity};
}

int64_t no_overflow_capacity(const Placement& p, int64_t tokens, int64_t topk) {
  constexpr const char* kEntry = "no_overflow_capacity";
  internal::expect_placement(p, kEntry, "placement");
  if (tokens < 0) fail(kEntry, "tokens", "must be >= 0, got " + str(tokens));
  if (topk < 1 || topk > kMaxTopk) fail(kEntry, "topk", "must be in [1, " + str(kMaxTopk) + "], got " + str(topk));
  return std::max<int64_t>(1, tokens * std::min(topk, p.slots_per_rank));
}

DecodeDispatch plan_decode_dispatch(const DecodeGeometry& g, const DispatchLayout& layout) {
  constexpr const char* kEntry = "plan_decode_dispatch";
  if (g.ranks < 1 || g.slots_per_rank < 1 || g.capacity < 1)
    fail(kEntry, "geometry", "is not a decode_geometry result");
  const int64_t slots = g.ranks * g.slots_per_rank;
  if (layout.slot_counts.size() != size_t(slots) || layout.send_assignment.size() != layout.slot.size() ||
      layout.send_offsets.size() != size_t(g.ranks + 1))
    fail(kEntry, "layout", "does not match the geometry's R*S = " + str(slots) + " slots");

  DecodeDispatch d;
  d.send_row.assign(layout.slot.size(), -1);
  d.sent_counts.assign(size_t(slots), 0);
  for (int64_t row = 0; row < int64_t(layout.send_assignment.size()); ++row) {
    const int32_t a = layout.send_assignment[size_t(row)];
    const int32_t s = layout.slot[size_t(a)];
    const int64_t dest = s / g.slots_per_rank, i = row - layout.send_offsets[size_t(dest)];
    if (i < g.capacity) d.send_row[size_t(a)] = g.row(dest, i), ++d.sent_counts[size_t(s)];
    else ++d.overflow;
  }
  return d;
}

}  // namespace moekit::ep
