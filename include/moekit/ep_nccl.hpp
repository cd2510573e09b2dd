// moekit/ep_nccl.hpp — expert parallelism on the GPU: dispatch and combine over NCCL, the local
// experts through moekit's own kernels. One process per rank, one GPU per process.
//
// A step on rank r (the design is moekit/ep.hpp's; its host layouts are the oracle):
//   route    slot of every local assignment (route_assignment's rule, on the device);
//   order    align with block_m = 1 over the R*S slots: the send order of plan_dispatch;
//   pack     x rows and weights into the send buffer in that order (decode: at most `capacity`
//            rows per destination; the rest are counted in a device counter, never lost quietly);
//   exchange prefill: the [R][S] counts first (one host sync), then exact sizes;
//            decode: fixed-size messages and the counts beside them (no host sync: graph-safe);
//            both are ncclSend/ncclRecv pairs inside one ncclGroupStart/End per direction;
//   experts  the receiver builds the block table of its S local experts from the counts alone
//            (expert, then source, then arrival: plan_receive's order) and runs expert_up and
//            expert_down on the receive buffer (k = 1: each row is one assignment);
//   return   the weighted rows go back along the same messages;
//   combine  y[t] = sum_j row(t*k + j) in slot order j, FP32, bf16 out: the single-GPU combine.
// Every row's result depends only on its x row, its expert and its weight (a GEMM row does not
// see its tile's other rows), so with the same tile configs and down_splits = 1 the output is
// bitwise the single-GPU experts_forward's; tests/gpu/ep_test.cu checks that with R processes.
// Besides the layer: the communicator's equal-size collectives, and spawn_ranks, a single-host
// launcher of the R rank processes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moekit/ep.hpp"
#include "moekit/moe.hpp"

namespace moekit::ep {

// NCCL's rendezvous token: made by one process (nccl_unique_id), handed to all R (a pipe, a file,
// MPI, torch.distributed), then each makes its Communicator with it.
struct NcclId {
  char bytes[128];
};
NcclId nccl_unique_id();
std::string nccl_version();  // "2.28.9 (libnccl.so.2)"; throws moekit::Error when NCCL is missing

// One NCCL communicator of R ranks; rank r runs on the device current at construction.
class Communicator {
 public:
  Communicator(const NcclId& id, int rank, int ranks);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  int device() const { return device_; }
  void* nccl_comm() const { return comm_; }  // ncclComm_t

  // Equal-size exchanges among the R ranks (device buffers), one ncclGroupStart/End of
  // ncclSend/ncclRecv each, enqueued on `stream` only: no host sync, capturable in a CUDA graph.
  // Every rank must make the same call with the same sizes (NCCL pairs the messages).
  // all_to_all: block p of send [R][bytes_per_rank] goes to rank p; rank p's block lands in
  // block p of recv [R][bytes_per_rank].
  void all_to_all(const void* send, void* recv, size_t bytes_per_rank, cudaStream_t stream) const;
  // all_gather: send [bytes] goes to every rank; rank p's lands in block p of recv [R][bytes].
  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) const;

 private:
  void* comm_ = nullptr;
  int rank_ = 0, ranks_ = 0, device_ = 0;
};

// ---- R rank processes on one host -------------------------------------------------------------
// One GPU each, for the EP tests and `moekit bench --ep`: the parent makes the NCCL id and runs R
// copies of its own executable (fork + exec of /proc/self/exe: a fresh process per rank, whatever
// CUDA state the parent has), each told its rank through the environment. A stand-in for torchrun
// or mpirun, nothing more.
struct RankEnv {
  int rank = 0, ranks = 1;
  NcclId id{};
};

// In a spawned rank: its rank, R and the NCCL id (MOEKIT_EP_RANK, MOEKIT_EP_RANKS,
// MOEKIT_EP_NCCL_ID); std::nullopt in a process that was not spawned. Malformed values throw
// moekit::Error naming the variable.
std::optional<RankEnv> rank_from_env();

// Runs `ranks` copies of this executable with argv = {argv0, args...} and waits for all of them.
// Returns each rank's exit status (128 + signal if it was killed). Rank r should use GPU r. Once
// one rank has failed, the others get a grace period to finish, then are killed (a rank that
// failed leaves its peers blocked in NCCL).
std::vector<int> spawn_ranks(int ranks, const std::vector<std::string>& args);

// This rank's slots' weights from the whole layer's: w13_local[l] = w13[e], w2_local[l] = w2[e]
// for e = slot_expert[rank*S + l]; an empty slot's weights are left as they are (never read).
// w13 [E, 2F, H], w2 [E, H, F], w13_local [S, 2F, H], w2_local [S, H, F], bf16, on the device.
// Enqueued on `stream` (device-to-device copies).
void copy_local_experts(const Placement& placement, int64_t rank, const Tensor& w13, const Tensor& w2,
                        const Tensor& w13_local, const Tensor& w2_local, cudaStream_t stream);

enum class EpMode : int {
  prefill,  // counts exchanged first (one host sync per step), exact message sizes
  decode,   // fixed-size messages: no host sync, capturable in a CUDA graph
};

struct EpOptions {
  // hidden, inter, experts (global E), topk; tokens = the most tokens one rank passes to forward.
  MoeShape shape;
  EpMode mode = EpMode::prefill;
  // decode: rows per (source, destination) message; 0 = no_overflow_capacity (never overflows).
  int64_t capacity = 0;
  // Tile configs of the local expert GEMMs; block_m == 0: plan_forward's for the local shape.
  // down_splits is always 1 (the rows travel back as bf16, as y_rows).
  GemmConfig up, down;
};

// What the last forward did, read back from the device (synchronises the stream).
struct EpStats {
  int64_t overflow = 0;                // this rank's assignments beyond decode capacity (0 in prefill)
  bool ids_out_of_range = false;       // a topk id outside [0, E): skipped
  std::vector<int64_t> rows_sent;      // [R]: rows this rank sent each destination (decode: that fit)
  std::vector<int64_t> rows_received;  // [R]: rows each source sent this rank
  int64_t bytes_on_wire = 0;           // sent to peers (not itself) in both exchanges: what NCCL moved out
};

class EpLayer {
 public:
  // Validates (moekit::Error names the argument), plans the local GEMMs and allocates every
  // buffer once: forward never allocates. The placement must have comm.ranks() ranks; the
  // communicator must outlive the layer. Collective: every rank constructs its layer together,
  // and they check over NCCL that all were given the same options and placement (else every
  // rank throws, naming what differs).
  EpLayer(const Communicator& comm, const Placement& placement, const EpOptions& options);
  ~EpLayer();
  EpLayer(const EpLayer&) = delete;
  EpLayer& operator=(const EpLayer&) = delete;

  // x [T_r, H] bf16 (T_r <= options.shape.tokens), topk_ids [T_r, k] i32 (global expert ids),
  // topk_weights [T_r, k] f32 (from route()), w13 [S, 2F, H] and w2 [S, H, F] bf16: the weights of
  // this rank's slots (slot_expert[rank*S + l]; an empty slot's weights are never read), y [T_r, H].
  // token_offset: global index of this rank's first token (the replica rule's t mod n).
  // Every rank must call forward with its own inputs for the same step (NCCL pairs the messages).
  // Prefill cannot be captured in a CUDA graph (it syncs once for the counts): Error naming
  // options.mode. An id outside [0, E) skips its assignment (the token's sum lacks it) and
  // check() reports it, as align does.
  // expert_load [E] i64 (optional; E global experts, moe.hpp "Load statistics"): gains, per
  // expert, the assignments of this rank's tokens that this step routed to it (summed over its
  // replicas; counted before the decode capacity, so overflowed rows count too; ids outside
  // [0, E) do not). One launch of E threads, only when given; graph-safe. The sum over the ranks
  // (an all-reduce the caller runs when it reads) is the layer's histogram: the expert_load that
  // PlacementOptions takes to re-plan replicas.
  void forward(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& w13, const Tensor& w2,
               const Tensor& y, int64_t token_offset, cudaStream_t stream, const Tensor& expert_load = Tensor());

  // Synchronises the stream; counts of the last forward, its overflow and out-of-range ids.
  EpStats stats(cudaStream_t stream) const;
  // stats(), then moekit::Error when an id was out of range or rows overflowed (naming which).
  void check(cudaStream_t stream) const;

  // Benchmarks: the last forward's two exchanges again (dispatch and return, same sizes and
  // buffers), nothing else — the transport's share of a step. Enqueue only (graph-safe in decode).
  void exchange_only(cudaStream_t stream);

  const ForwardPlan& local_plan() const { return local_plan_; }
  int64_t capacity() const { return capacity_; }
  size_t device_bytes() const { return bytes_; }

 private:
  struct Buffers;
  void agree_with_peers();
  void exchange_counts(cudaStream_t stream);
  void exchange_rows(bool back, cudaStream_t stream);

  const Communicator& comm_;
  Placement placement_;
  EpOptions opt_;
  ForwardPlan local_plan_;
  int64_t capacity_ = 0;       // decode message rows
  int64_t recv_rows_max_ = 0;  // receive buffer rows
  size_t bytes_ = 0;
  std::unique_ptr<Buffers> buf_;
  // The last forward's message sizes in rows, per peer (prefill: from the counts; decode: fixed).
  std::vector<int64_t> send_rows_, recv_rows_;
  int64_t last_tokens_ = -1;
  int sm_count_ = 0;
};

}  // namespace moekit::ep
