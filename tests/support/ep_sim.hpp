// ep_sim.hpp — R expert-parallel ranks simulated on the CPU: dispatch -> local experts ->
// combine, with the layouts of moekit/ep.hpp, and the checks the NCCL path must also pass.
//
// Each rank owns the token slice split_tokens gives it. Every assignment (t, j, e, w) travels
// with its local expert id, weight and a tag (its global assignment id, read only by the checks)
// to the rank route_assignment picks; the ranks run a stand-in expert function on what they
// received, in grouped (local expert) order; results come back along the same rows, land at
// their assignment row, and each source combines its tokens in slot order (ref::combine).
// check_delivery then proves every assignment ran exactly once, by its expert, on its planned
// rank, and came back to its own (token, slot); y must equal single_rank() bitwise.
// Test-only: built into moekit_test_support (tests/CMakeLists.txt), not into the library.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moekit/ep.hpp"

namespace moekit::ep {

using bf16 = uint16_t;  // raw bf16 bits on the host, as in ref::

// y_row [H] = the stand-in for expert `expert`'s FFN on x_row [H], weighted by `weight` (where
// the GPU path runs moekit's up/down GEMMs on the local experts). Must be deterministic.
using ExpertRowFn = std::function<void(int32_t expert, const bf16* x_row, float weight, bf16* y_row)>;

struct SimInput {
  const bf16* x = nullptr;              // [T, H]
  const int32_t* topk_ids = nullptr;    // [T, k]
  const float* topk_weights = nullptr;  // [T, k]
  int64_t tokens = 0, topk = 0, hidden = 0;
};

enum class Exchange : int {
  prefill,  // counts first, then exact sizes (plan_dispatch, plan_receive)
  decode,   // fixed messages of `capacity` rows with a counts mask (decode_geometry, plan_decode_dispatch)
};
struct SimOptions {
  Exchange exchange = Exchange::prefill;
  int64_t capacity = 0;  // decode: rows each source may send each destination
};

// What the ranks did, as the checks see it.
struct DeliveryLog {
  struct Processed {
    int64_t assignment;  // the tag the row carried (-1: a row that held no assignment)
    int32_t rank;        // where it ran
    int32_t expert;      // the global expert that ran it (-1: none could be named)
  };
  std::vector<Processed> processed;  // one entry per row an expert ran on
  std::vector<int64_t> returned;     // [T*k]: the tag of the result that landed at row a; -1: none
  std::vector<int64_t> overflowed;   // decode: assignments beyond capacity, ascending
};

struct DeliveryCheck {
  int64_t delivered = 0;     // ran once, by its expert, on its planned rank, back at its own row
  int64_t missing = 0;       // never ran and not reported as overflow
  int64_t duplicated = 0;    // ran more than once, or ran although reported as overflow
  int64_t misrouted = 0;     // ran on another rank than route_assignment's, or by another expert
  int64_t misreturned = 0;   // its row got another result (or none although it ran)
  int64_t spurious = 0;      // rows that ran carrying no assignment (a masked row, say)
  std::string first;         // the first violation, in words
  bool ok() const {
    return missing == 0 && duplicated == 0 && misrouted == 0 && misreturned == 0 && spurious == 0;
  }
};
// Tokens are owned as split_tokens(tokens, p.ranks) says.
DeliveryCheck check_delivery(const Placement& p, const int32_t* topk_ids, int64_t tokens, int64_t topk,
                             const DeliveryLog& log);

struct SimResult {
  std::vector<bf16> y;             // [T, H]
  std::vector<bf16> y_rows;        // [T*k, H]: each result where it landed at its source (0: overflow)
  DeliveryLog log;
  DeliveryCheck check;
  std::vector<int64_t> rows_sent;  // [R][R]: rows source s sent destination d (padding not counted)
  int64_t overflow = 0;            // decode: assignments beyond capacity, all sources
};
SimResult simulate(const Placement& p, const SimInput& in, const ExpertRowFn& expert,
                   const SimOptions& options);

// The one-rank computation the simulation must equal bitwise: y_rows[a] = expert(e, x[t], w)
// (zero for the assignments in `dropped`) [T*k, H], and y [T, H], those rows combined in slot
// order by ref::combine. Rows are compared too: a result swapped between two slots of one token
// can leave the sum unchanged.
std::vector<bf16> single_rank_rows(const SimInput& in, const ExpertRowFn& expert,
                                   const std::vector<int64_t>& dropped = {});
std::vector<bf16> single_rank(const SimInput& in, const ExpertRowFn& expert,
                              const std::vector<int64_t>& dropped = {});

}  // namespace moekit::ep
