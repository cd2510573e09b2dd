// spawn.hpp — R processes on one host, one GPU each, for the EP tests and `moekit bench --ep`:
// the parent makes the NCCL id and runs R copies of its own executable (fork + exec of
// /proc/self/exe: a fresh process per rank, whatever CUDA state the parent has), each told its
// rank through the environment. A stand-in for torchrun or mpirun, nothing more.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "moekit/ep_nccl.hpp"

namespace moekit::ep {

struct RankEnv {
  int rank = 0, ranks = 1;
  NcclId id{};
};

// In a spawned rank: its rank, R and the NCCL id (MOEKIT_EP_RANK, MOEKIT_EP_RANKS,
// MOEKIT_EP_NCCL_ID); std::nullopt in a process that was not spawned. Malformed values throw.
std::optional<RankEnv> rank_from_env();

// Runs `ranks` copies of this executable with argv = {argv0, args...} and waits for all of them.
// Returns each rank's exit status (128 + signal if it was killed). Rank r should use GPU r.
std::vector<int> spawn_ranks(int ranks, const std::vector<std::string>& args);

}  // namespace moekit::ep
