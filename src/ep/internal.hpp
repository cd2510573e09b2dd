// internal.hpp — what the EP sources share and the public header does not show.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/ep.hpp"

namespace moekit::ep::internal {

// route_assignment without its checks: the layouts validate their inputs once, not per row.
int32_t route_unchecked(const Placement& p, int64_t token, int32_t expert, int64_t home_rank);

// Phase 2 of plan_placement: the copies of every expert (copies[e] <= R, sum <= R*S), largest
// share load/copies first, each on the least-loaded rank (then the emptier, then the lower) with
// a free slot that lacks the expert. Where every rank with a free slot already holds it, one
// expert moves from a full rank to such a rank first (always possible: see the NOTES there).
// Returns the experts of each rank, in placement order.
std::vector<std::vector<int32_t>> pack(const std::vector<double>& expert_load, const std::vector<int64_t>& copies,
                                       int64_t R, int64_t S);

// The placement is consistent (as plan_placement returns it); else moekit::Error naming `arg`.
void expect_placement(const Placement& p, const char* entry, const char* arg);

}  // namespace moekit::ep::internal
