// ep_sim.cpp — the CPU simulation of R expert-parallel ranks (ep_sim.hpp). Messages are plain
// vectors standing for what ncclSend/ncclRecv would move; the layouts are the library's own.
// Test support (moekit_test_support): the library does not contain it.
#include "support/ep_sim.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/validate.hpp"
#include "ep/internal.hpp"
#include "moekit/reference.hpp"

namespace moekit::ep {
namespace {

using detail::fail;
std::string str(int64_t v) { return std::to_string(v); }

// Rows in flight: activation, local expert id and weight (what the GPU path sends), and the tag.
struct Rows {
  int64_t hidden = 0;
  std::vector<bf16> x;        // [n, H]
  std::vector<int32_t> local; // [n]
  std::vector<float> weight;  // [n]
  std::vector<int64_t> tag;   // [n]: global assignment; -1 on rows that hold none (poison)
  Rows(int64_t n, int64_t h) : hidden(h), x(size_t(n * h), 0), local(size_t(n), -1), weight(size_t(n), 0.0f), tag(size_t(n), -1) {}
  void copy_row(int64_t to, const Rows& from, int64_t row) {
    std::copy_n(from.x.begin() + row * hidden, hidden, x.begin() + to * hidden);
    local[size_t(to)] = from.local[size_t(row)], weight[size_t(to)] = from.weight[size_t(row)], tag[size_t(to)] = from.tag[size_t(row)];
  }
};

void validate(const Placement& p, const SimInput& in, const char* entry) {
  internal::expect_placement(p, entry, "placement");
  if (in.tokens < 0) fail(entry, "in.tokens", "must be >= 0, got " + str(in.tokens));
  if (in.topk < 1 || in.topk > kMaxTopk) fail(entry, "in.topk", "must be in [1, " + str(kMaxTopk) + "], got " + str(in.topk));
  if (in.hidden < 1) fail(entry, "in.hidden", "must be >= 1, got " + str(in.hidden));
  if (in.tokens > 0 && !in.x) fail(entry, "in.x", "is null but tokens = " + str(in.tokens));
  if (in.tokens > 0 && !in.topk_ids) fail(entry, "in.topk_ids", "is null but tokens = " + str(in.tokens));
  if (in.tokens > 0 && !in.topk_weights) fail(entry, "in.topk_weights", "is null but tokens = " + str(in.tokens));
}

}  // namespace

SimResult simulate(const Placement& p, const SimInput& in, const ExpertRowFn& expert, const SimOptions& options) {
  constexpr const char* kEntry = "ep::simulate";
  validate(p, in, kEntry);
  if (!expert) fail(kEntry, "expert", "is required but was not given");
  const bool decode = options.exchange == Exchange::decode;
  if (!decode && options.exchange != Exchange::prefill)
    fail(kEntry, "options.exchange", "must be prefill or decode, got " + str(int(options.exchange)));
  if (decode && options.capacity < 1)
    fail(kEntry, "options.capacity", "decode needs >= 1 row per (source, destination), got " + str(options.capacity));

  const int64_t R = p.ranks, S = p.slots_per_rank, H = in.hidden, k = in.topk, T = in.tokens;
  const std::vector<int64_t> split = split_tokens(T, R);
  SimResult res;
  res.rows_sent.assign(size_t(R * R), 0);
  res.log.returned.assign(size_t(T * k), -1);

  // ---- each source: its layout, and its rows in send order -------------------------------
  std::vector<DispatchLayout> layout;
  std::vector<Rows> send;  // prefill: rows in send order; decode: the [R][S][capacity] send buffer
  const DecodeGeometry g = decode ? decode_geometry(p, options.capacity) : DecodeGeometry{};
  std::vector<DecodeDispatch> dd(decode ? size_t(R) : 0);
  for (int64_t s = 0; s < R; ++s) {
    const int64_t t0 = split[size_t(s)], Ts = split[size_t(s + 1)] - t0;
    layout.push_back(plan_dispatch(p, in.topk_ids + t0 * k, Ts, k, t0, s));
    const DispatchLayout& L = layout.back();
    if (decode) dd[size_t(s)] = plan_decode_dispatch(g, L);
    Rows rows(decode ? g.buffer_rows() : Ts * k, H);
    for (int64_t row = 0; row < Ts * k; ++row) {
      const int64_t a = L.send_assignment[size_t(row)];  // local assignment
      const int64_t to = decode ? dd[size_t(s)].send_row[size_t(a)] : row;
      if (to < 0) continue;  // beyond capacity: reported below
      std::copy_n(in.x + (t0 + a / k) * H, H, rows.x.begin() + to * H);
      rows.local[size_t(to)] = L.slot[size_t(a)] % int32_t(S);
      rows.weight[size_t(to)] = in.topk_weights[t0 * k + a];
      rows.tag[size_t(to)] = t0 * k + a;
    }
    if (decode) {
      for (int64_t a = 0; a < Ts * k; ++a)
        if (dd[size_t(s)].send_row[size_t(a)] < 0) res.log.overflowed.push_back(t0 * k + a);
      res.overflow += dd[size_t(s)].overflow;
    }
    for (int64_t d = 0; d < R; ++d)
      for (int64_t l = 0; l < S; ++l)
        res.rows_sent[size_t(s * R + d)] += decode ? dd[size_t(s)].sent_counts[size_t(d * S + l)]
                                                   : L.slot_counts[size_t(d * S + l)];
    send.push_back(std::move(rows));
  }

  // ---- each destination: receive, run its experts in grouped order, return ---------------
  std::vector<Rows> back;  // per source, in its send layout
  for (int64_t s = 0; s < R; ++s) back.emplace_back(send[size_t(s)].tag.size(), H);
  for (int64_t d = 0; d < R; ++d) {
    // The counts each source sends d (prefill: exchanged first; decode: the mask beside the rows).
    std::vector<int32_t> counts(static_cast<size_t>(R * S));
    for (int64_t s = 0; s < R; ++s)
      for (int64_t l = 0; l < S; ++l)
        counts[size_t(s * S + l)] = decode ? dd[size_t(s)].sent_counts[size_t(d * S + l)]
                                           : layout[size_t(s)].slot_counts[size_t(d * S + l)];
    // recv_row(s, i): where row i of the message from s sits in d's receive buffer; the message
    // is the contiguous block of the source's send rows for destination d.
    const ReceiveLayout rl = plan_receive(p, d, counts, decode ? g.capacity : 0);
    const int64_t recv_rows = rl.rows();
    auto message_begin = [&](int64_t s) { return decode ? d * g.message_rows() : layout[size_t(s)].send_offsets[size_t(d)]; };
    auto recv_begin = [&](int64_t s) { return decode ? s * g.message_rows() : rl.recv_offsets[size_t(s)]; };
    auto message_rows = [&](int64_t s) { return decode ? g.message_rows() : layout[size_t(s)].send_rows(d); };

    Rows recv(recv_rows, H);
    for (int64_t s = 0; s < R; ++s)
      for (int64_t i = 0; i < message_rows(s); ++i) recv.copy_row(recv_begin(s) + i, send[size_t(s)], message_begin(s) + i);

    // Grouped order: local expert l, then source, then arrival (decode: masked by the counts).
    const std::vector<int64_t>& order = rl.grouped_rows;     // expert l's rows: order[group[l], group[l+1])
    const std::vector<int64_t>& group = rl.expert_offsets;
    Rows out(recv_rows, H);
    for (int64_t l = 0; l < S; ++l)
      for (int64_t idx = group[size_t(l)]; idx < group[size_t(l + 1)]; ++idx) {
        const int64_t row = order[size_t(idx)];
        // The row must carry the local expert its group is for; a mismatch is logged as no expert.
        const int32_t e = recv.local[size_t(row)] == l ? p.slot_expert[size_t(d * S + l)] : -1;
        res.log.processed.push_back({recv.tag[size_t(row)], int32_t(d), e});
        if (e >= 0) expert(e, &recv.x[size_t(row * H)], recv.weight[size_t(row)], &out.x[size_t(row * H)]);
        out.tag[size_t(row)] = recv.tag[size_t(row)];
      }
    // The reverse exchange: the same blocks, the other way.
    for (int64_t s = 0; s < R; ++s)
      for (int64_t i = 0; i < message_rows(s); ++i) back[size_t(s)].copy_row(message_begin(s) + i, out, recv_begin(s) + i);
  }

  // ---- each source: results to their assignment rows, combine in slot order --------------
  res.y.assign(size_t(T * H), 0);
  res.y_rows.assign(size_t(T * k * H), 0);
  for (int64_t s = 0; s < R; ++s) {
    const int64_t t0 = split[size_t(s)], Ts = split[size_t(s + 1)] - t0;
    bf16* y_rows = res.y_rows.data() + t0 * k * H;  // this source's [Ts*k, H]
    for (int64_t row = 0; row < Ts * k; ++row) {
      const int64_t a = layout[size_t(s)].send_assignment[size_t(row)];
      const int64_t from = decode ? dd[size_t(s)].send_row[size_t(a)] : row;
      if (from < 0) continue;
      std::copy_n(back[size_t(s)].x.begin() + from * H, H, y_rows + a * H);
      res.log.returned[size_t(t0 * k + a)] = back[size_t(s)].tag[size_t(from)];
    }
    const std::vector<bf16> y = ref::combine(y_rows, Ts, k, H);
    std::copy(y.begin(), y.end(), res.y.begin() + t0 * H);
  }
  std::sort(res.log.overflowed.begin(), res.log.overflowed.end());
  res.check = check_delivery(p, in.topk_ids, T, k, res.log);
  return res;
}

DeliveryCheck check_delivery(const Placement& p, const int32_t* topk_ids, int64_t tokens, int64_t topk,
                             const DeliveryLog& log) {
  constexpr const char* kEntry = "ep::check_delivery";
  internal::expect_placement(p, kEntry, "placement");
  if (tokens < 0) fail(kEntry, "tokens", "must be >= 0, got " + str(tokens));
  if (topk < 1) fail(kEntry, "topk", "must be >= 1, got " + str(topk));
  if (tokens > 0 && !topk_ids) fail(kEntry, "topk_ids", "is null but tokens = " + str(tokens));
  const int64_t A = tokens * topk;
  if (log.returned.size() != size_t(A))
    fail(kEntry, "log.returned", "expected T*k = " + str(A) + " entries, got " + str(int64_t(log.returned.size())));

  DeliveryCheck c;
  auto note = [&](int64_t& counter, const std::string& what) {
    if (c.first.empty()) c.first = what;
    ++counter;
  };
  const std::vector<int64_t> split = split_tokens(tokens, p.ranks);
  std::vector<int32_t> ran(static_cast<size_t>(A), 0);
  std::vector<uint8_t> overflowed(static_cast<size_t>(A), 0), misrouted(static_cast<size_t>(A), 0);
  for (int64_t a : log.overflowed)
    if (a >= 0 && a < A) overflowed[size_t(a)] = 1;
  for (const DeliveryLog::Processed& e : log.processed) {
    if (e.assignment < 0 || e.assignment >= A) {
      note(c.spurious, "rank " + str(e.rank) + " ran a row carrying no assignment (tag " + str(e.assignment) + ")");
      continue;
    }
    const int64_t a = e.assignment, t = a / topk;
    const int64_t home = std::upper_bound(split.begin(), split.end(), t) - split.begin() - 1;
    const int32_t want = topk_ids[a];
    const int64_t want_rank = internal::route_unchecked(p, t, want, home) / p.slots_per_rank;
    if (++ran[size_t(a)] > 1 || overflowed[size_t(a)])
      note(c.duplicated, "assignment " + str(a) + " ran more than once or despite its overflow");
    if (e.expert != want || e.rank != want_rank)
      misrouted[size_t(a)] = 1, note(c.misrouted, "assignment " + str(a) + " (expert " + str(want) + ", rank " + str(want_rank) + ") ran as expert " +
                            str(e.expert) + " on rank " + str(e.rank));
  }
  for (int64_t a = 0; a < A; ++a) {
    if (ran[size_t(a)] == 0 && !overflowed[size_t(a)]) note(c.missing, "assignment " + str(a) + " never ran");
    const int64_t want = ran[size_t(a)] > 0 ? a : -1;
    if (log.returned[size_t(a)] != want)
      note(c.misreturned, "row " + str(a) + " got the result of " + str(log.returned[size_t(a)]) + ", expected " + str(want));
    else if (ran[size_t(a)] == 1 && !overflowed[size_t(a)] && !misrouted[size_t(a)])
      ++c.delivered;
  }
  return c;
}

std::vector<bf16> single_rank(const SimInput& in, const ExpertRowFn& expert, const std::vector<int64_t>& dropped) {
  const std::vector<bf16> y_rows = single_rank_rows(in, expert, dropped);
  return ref::combine(y_rows.data(), in.tokens, in.topk, in.hidden);
}

std::vector<bf16> single_rank_rows(const SimInput& in, const ExpertRowFn& expert, const std::vector<int64_t>& dropped) {
  constexpr const char* kEntry = "ep::single_rank";
  const int64_t T = in.tokens, k = in.topk, H = in.hidden;
  if (T < 0) fail(kEntry, "in.tokens", "must be >= 0, got " + str(T));
  if (k < 1 || H < 1) fail(kEntry, k < 1 ? "in.topk" : "in.hidden", "must be >= 1");
  if (!expert) fail(kEntry, "expert", "is required but was not given");
  std::vector<uint8_t> skip(static_cast<size_t>(T * k), 0);
  for (int64_t a : dropped) {
    if (a < 0 || a >= T * k) fail(kEntry, "dropped", "entry " + str(a) + " is outside [0, T*k)");
    skip[size_t(a)] = 1;
  }
  std::vector<bf16> y_rows(static_cast<size_t>(T * k * H), 0);
  for (int64_t a = 0; a < T * k; ++a)
    if (!skip[size_t(a)]) expert(in.topk_ids[a], in.x + (a / k) * H, in.topk_weights[a], &y_rows[size_t(a * H)]);
  return y_rows;
}

}  // namespace moekit::ep
