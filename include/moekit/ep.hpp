// moekit/ep.hpp — expert parallelism (EP): which experts live on which rank, and where every
// assignment's row travels. Pure host code; no CUDA, no NCCL.
//
// R ranks each own a contiguous slice of the tokens (split_tokens) and hold the weights of up to
// S = slots_per_rank experts. plan_placement decides the experts of every rank once (each expert
// at least once; replicas of the hottest ones where loads are given); route_assignment sends
// assignment (t, e) to one replica by a fixed rule. A forward step is then
//   dispatch: a source rank sorts its assignments stably by destination slot d*S + l
//             (plan_dispatch: the same counting sort as align, with slots for experts) and sends
//             each destination one contiguous chunk of rows with their local expert ids and
//             weights;
//   experts:  a destination groups what it received by local expert (plan_receive, from the
//             counts alone: no sort) and runs moekit's up/down GEMMs on its local weights;
//   combine:  results go back along the same chunks (the reverse exchange reuses the counts),
//             land at their assignment row a = t*k + j, and combine sums each token's k rows in
//             slot order. A GEMM row's result does not depend on which rows share its tile, so
//             the output is bitwise the single-GPU layer's when both use the same tile configs
//             and no down-GEMM split-K (tests/gpu/ep_test.cu checks it with R processes).
// Prefill exchanges the [R][S] counts first and sends exact sizes. Decode (DecodeGeometry) sends
// fixed-size messages of `capacity` rows per (source, destination) pair with a counts mask, so a
// whole step has static sizes and captures in a CUDA graph with no host sync; rows beyond
// capacity are counted (plan_decode_dispatch) and reported, never silently dropped.
//
// The GPU path (moekit/ep_nccl.hpp, src/ep/ep_layer.cu) copies the Placement's flat int32 tables
// to the device once; a kernel maps topk_ids to slots by route_assignment's rule, align
// (block_m = 1) over the R*S <= kMaxExperts slots gives plan_dispatch's send order, and the
// exchanges are ncclSend/ncclRecv pairs in one group per direction. src/ep/ep_sim.hpp simulates
// the R ranks on the CPU with these layouts and checks every assignment is delivered exactly
// once and returns to its (token, slot).
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit::ep {

// Which replica serves assignment (t, e) when expert e has n > 1 copies.
enum class ReplicaRule : int {
  token_modulo,  // replica t mod n (global token index): spreads a hot expert's tokens evenly
  prefer_home,   // the replica on the token's own rank when there is one (no traffic), else t mod n
};

struct PlacementOptions {
  int64_t experts = 0;         // E
  int64_t ranks = 0;           // R
  int64_t slots_per_rank = 0;  // S: experts whose weights one rank holds; 0 = ceil((E + replicas) / R)
  int64_t replicas = 0;        // budget of extra copies of hot experts (needs expert_load)
  // [E] or empty: tokens per expert (routing counts, a histogram, a moving average), >= 0.
  // Empty: every expert equally loaded, experts placed in contiguous blocks (checkpoint order).
  std::vector<double> expert_load;
  ReplicaRule rule = ReplicaRule::token_modulo;
};

// Where every expert lives. Slot s = rank*S + l is local expert l of a rank; a rank's experts
// are ascending in its slots, empty slots (-1) last. The tables are flat int32 so that a device
// copy is a memcpy.
struct Placement {
  int64_t experts = 0, ranks = 0, slots_per_rank = 0;
  ReplicaRule rule = ReplicaRule::token_modulo;
  std::vector<int32_t> slot_expert;      // [R*S]: expert in slot s, or -1
  std::vector<int32_t> replica_offsets;  // [E+1]: copies of e are replica_slots[off[e], off[e+1])
  std::vector<int32_t> replica_slots;    // [E + replicas()]: slots holding each expert, ascending
  // [R]: the load each rank is planned to serve, expert_load split evenly over an expert's copies
  // (what token_modulo gives on average); all loads 1 when expert_load was empty.
  std::vector<double> rank_load;

  int64_t num_slots() const { return ranks * slots_per_rank; }
  int64_t replicas() const { return replica_offsets.empty() ? 0 : replica_offsets.back() - experts; }
  int64_t copies(int64_t expert) const { return replica_offsets[expert + 1] - replica_offsets[expert]; }
  int64_t local_experts(int64_t rank) const;  // occupied slots of the rank
};

// Validates the options (moekit::Error names 'options.<field>') and plans. Deterministic: ties
// go to the lower expert id, then the lower rank. With loads, copies go one at a time to the
// expert with the largest load per copy (never more copies than ranks, none to an idle expert),
// then every copy, largest share first, to the least-loaded rank with a free slot that lacks the
// expert (LPT). The budgets 0, 1, 2, 4, ..., replicas are each tried and the lowest peak
// rank_load kept (ties: fewer copies), so replicas() may be below the budget and a replica
// never raises the peak.
Placement plan_placement(const PlacementOptions& options);

// Experts of `bytes_per_expert` that fit in `free_bytes` of one rank: a value for slots_per_rank.
int64_t slots_for_memory(int64_t free_bytes, int64_t bytes_per_expert);

// The slot (rank = slot / S, local expert = slot % S) that serves assignment (token, expert) of a
// token owned by home_rank, by the placement's ReplicaRule. `token` is the global token index.
int32_t route_assignment(const Placement& p, int64_t token, int32_t expert, int64_t home_rank);

// Rank r owns tokens [offsets[r], offsets[r+1]): contiguous, sizes differ by at most one.
std::vector<int64_t> split_tokens(int64_t tokens, int64_t ranks);  // [R+1]

// ---- dispatch layouts (one source rank) -------------------------------------------------------
// Send order: assignments grouped by destination rank, then local expert, then ascending local
// assignment a = t_local*k + j (a stable counting sort by slot: deterministic).
struct DispatchLayout {
  std::vector<int32_t> slot;             // [T_s*k]: route_assignment of each local assignment
  std::vector<int32_t> slot_counts;      // [R*S]: rows for each slot (row d: the counts d receives)
  std::vector<int64_t> send_offsets;     // [R+1]: rows for destination d are [off[d], off[d+1])
  std::vector<int32_t> send_assignment;  // [T_s*k]: local assignment of each send row
  int64_t send_rows(int64_t dest) const { return send_offsets[dest + 1] - send_offsets[dest]; }
};
// topk_ids [tokens, topk] of the source rank `rank`, whose first token has global index
// token_offset. Throws naming 'topk_ids' on an id outside [0, E) (the device path sets a status
// bit instead: a host check would need a sync).
DispatchLayout plan_dispatch(const Placement& p, const int32_t* topk_ids, int64_t tokens,
                             int64_t topk, int64_t token_offset, int64_t rank);

// ---- receive layout (prefill: exact sizes after the counts exchange) -------------------------
// The receive buffer holds source 0's chunk, then source 1's, ...; each chunk is in the sender's
// order (local expert, then assignment). Grouping by local expert needs only the counts.
struct ReceiveLayout {
  std::vector<int64_t> recv_offsets;    // [R+1]: rows from source s are [off[s], off[s+1])
  std::vector<int64_t> expert_offsets;  // [S+1]: local expert l's rows are grouped_rows[off[l], off[l+1])
  std::vector<int64_t> grouped_rows;    // [rows]: receive row of each row in (expert, source, arrival) order
  int64_t rows() const { return recv_offsets.back(); }
};
// counts [R][S] i32: counts[s*S + l] = rows source s sends to local expert l of this rank (row
// `rank` of each source's slot_counts). message_capacity > 0: decode's fixed messages, source s's
// chunk begins at row s*message_capacity (its counts must fit), not packed after source s-1's.
ReceiveLayout plan_receive(const Placement& p, int64_t rank, const std::vector<int32_t>& counts,
                           int64_t message_capacity = 0);

// ---- decode: fixed capacity, masked per-expert layout ---------------------------------------
// Every (source, destination) message is `capacity` rows plus [S] counts, whatever the routing:
// static sizes, one equal-size all-to-all, no counts exchange first. A message holds the source's
// rows for the destination in send order (local expert, then assignment), packed from row 0; the
// counts are the mask. The receive buffer is [source][capacity]; local expert l's rows are the R
// segments (s, s*capacity + sum_{l'<l} counts[s][l'], counts[s][l]) — plan_receive with
// message_capacity = capacity gives them. Per-rank (not per-expert) capacity: NCCL moves whole
// messages, so the bytes on the wire are R*capacity rows per step whatever the spread over experts.
struct DecodeGeometry {
  int64_t ranks = 0, slots_per_rank = 0, capacity = 0;
  int64_t message_rows() const { return capacity; }
  int64_t buffer_rows() const { return ranks * capacity; }  // send buffer = receive buffer
  // Send buffer [dest][i]; receive buffer [source][i]: the same index with the peer's rank.
  int64_t row(int64_t peer, int64_t i) const { return peer * capacity + i; }
};
// capacity: rows each source may send each destination. A source of `tokens` tokens never
// overflows with capacity = no_overflow_capacity(p, tokens, topk): a token names an expert at most
// once (the router's top-k ids are distinct), so it sends a rank at most min(k, S) rows.
DecodeGeometry decode_geometry(const Placement& p, int64_t capacity);
int64_t no_overflow_capacity(const Placement& p, int64_t tokens, int64_t topk);

struct DecodeDispatch {
  std::vector<int64_t> send_row;    // [T_s*k]: row in the send buffer, or -1: beyond capacity
  std::vector<int32_t> sent_counts; // [R*S]: rows of each slot that fit: the mask sent with the rows
  int64_t overflow = 0;             // assignments beyond capacity: reported, never silently dropped
};
// Rows keep the send order; a destination's rows past `capacity` (its highest local experts'
// last rows) overflow. The GPU kernel counts them in a device counter; the caller must check it.
DecodeDispatch plan_decode_dispatch(const DecodeGeometry& g, const DispatchLayout& layout);

}  // namespace moekit::ep
