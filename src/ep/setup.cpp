// setup.cpp — what an expert-parallel rank sets up before its steps (moekit/ep_nccl.hpp): NCCL's
// rendezvous id and version, the Communicator and its equal-size collectives, its slots' weights
// (copy_local_experts), and EpLayer's check that every rank built the same layer. The step itself
// is ep_layer.cu.
#include <cuda_runtime.h>  // cudaMalloc's typed overload, cudaMalloc(T**)

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "common/validate.hpp"
#include "ep/internal.hpp"
#include "ep/nccl.hpp"
#include "moekit/ep_nccl.hpp"

namespace moekit::ep {
namespace {
using detail::fail;
std::string str(int64_t v) { return std::to_string(v); }
nccl::Comm as_comm(void* c) { return static_cast<nccl::Comm>(c); }
}  // namespace

NcclId nccl_unique_id() {
  nccl::UniqueId u{};
  nccl::check(nccl::api().GetUniqueId(&u), "ncclGetUniqueId");
  NcclId id{};
  static_assert(sizeof id.bytes == sizeof u.internal);
  std::memcpy(id.bytes, u.internal, sizeof id.bytes);
  return id;
}

std::string nccl_version() {
  const nccl::Api& a = nccl::api();
  const int v = a.version;  // 2.9+: major*10000 + minor*100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) + " (" +
         a.library + ")";
}

Communicator::Communicator(const NcclId& id, int rank, int ranks) : rank_(rank), ranks_(ranks) {
  constexpr const char* kEntry = "Communicator";
  if (ranks < 1) fail(kEntry, "ranks", "must be >= 1, got " + str(ranks));
  if (rank < 0 || rank >= ranks) fail(kEntry, "rank", "must be in [0, " + str(ranks) + "), got " + str(rank));
  MK_CUDA_CHECK(cudaGetDevice(&device_));
  nccl::UniqueId u{};
  std::memcpy(u.internal, id.bytes, sizeof u.internal);
  nccl::Comm c = nullptr;
  nccl::check(nccl::api().CommInitRank(&c, ranks, u, rank), "ncclCommInitRank");
  comm_ = c;
}

Communicator::~Communicator() {
  if (comm_ != nullptr) {
    const nccl::Result r = nccl::api().CommDestroy(as_comm(comm_));
    if (r != 0) std::fprintf(stderr, "moekit: ncclCommDestroy failed: %d\n", r);
  }
}

void Communicator::all_to_all(const void* send, void* recv, size_t bytes_per_rank, cudaStream_t stream) const {
  nccl::all_to_all(as_comm(comm_), ranks_, send, recv, bytes_per_rank, stream);
}

void Communicator::all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) const {
  nccl::all_gather(as_comm(comm_), ranks_, send, recv, bytes, stream);
}

void copy_local_experts(const Placement& placement, int64_t rank, const Tensor& w13, const Tensor& w2,
                        const Tensor& w13_local, const Tensor& w2_local, cudaStream_t stream) {
  constexpr const char* kEntry = "copy_local_experts";
  internal::expect_placement(placement, kEntry, "placement");
  const int64_t E = placement.experts, S = placement.slots_per_rank;
  if (rank < 0 || rank >= placement.ranks)
    fail(kEntry, "rank", "must be in [0, " + str(placement.ranks) + "), got " + str(rank));
  if (w13.rank != 3) fail(kEntry, "w13", "expected [E, 2F, H], got " + w13.shape_str());
  const int64_t F2 = w13.dim(1), H = w13.dim(2);
  detail::expect_tensor(kEntry, "w13", w13, DType::bf16, {E, F2, H});
  detail::expect_tensor(kEntry, "w2", w2, DType::bf16, {E, H, F2 / 2});
  detail::expect_tensor(kEntry, "w13_local", w13_local, DType::bf16, {S, F2, H});
  detail::expect_tensor(kEntry, "w2_local", w2_local, DType::bf16, {S, H, F2 / 2});
  const size_t b13 = size_t(F2 * H) * 2, b2 = size_t(H * (F2 / 2)) * 2;  // bytes per expert
  for (int64_t l = 0; l < S; ++l) {
    const int32_t e = placement.slot_expert[size_t(rank * S + l)];
    if (e < 0) continue;
    MK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(w13_local.data) + l * b13, static_cast<const char*>(w13.data) + e * b13,
                                  b13, cudaMemcpyDeviceToDevice, stream));
    MK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(w2_local.data) + l * b2, static_cast<const char*>(w2.data) + e * b2, b2,
                                  cudaMemcpyDeviceToDevice, stream));
  }
}

// Every rank must build the same layer: the message sizes and receive buffers follow from these
// values, and a peer with others would hang NCCL or overrun a buffer. Each rank sends its
// descriptor to every rank and compares what it gets; all ranks see a mismatch and throw.
void EpLayer::agree_with_peers() {
  const int R = comm_.ranks();
  auto fnv = [](uint64_t& h, int64_t v) { h = (h ^ uint64_t(v)) * 1099511628211ull; };  // FNV-1a step
  uint64_t table_hash = 1469598103934665603ull, config_hash = 1469598103934665603ull;
  for (int32_t v : placement_.slot_expert) fnv(table_hash, v);
  for (int32_t v : placement_.replica_slots) fnv(table_hash, v);
  fnv(table_hash, int64_t(placement_.rule));
  for (char ch : local_plan_.up.str() + "/" + local_plan_.down.str()) fnv(config_hash, ch);
  const MoeShape& s = opt_.shape;
  constexpr int kFields = 9;
  static const char* kNames[kFields] = {"mode",          "capacity",   "shape.tokens", "shape.hidden", "shape.inter",
                                        "shape.experts", "shape.topk", "tile configs", "placement"};
  const int64_t mine[kFields] = {
      int64_t(opt_.mode),   capacity_,          s.tokens, s.hidden, s.inter, s.experts, s.topk,
      int64_t(config_hash), int64_t(table_hash)};
  int64_t* d = nullptr;
  MK_CUDA_CHECK(cudaMalloc(&d, sizeof(int64_t) * kFields * (R + 1)));
  std::vector<int64_t> theirs(size_t(kFields * R));
  cudaStream_t stream = nullptr;
  try {
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MK_CUDA_CHECK(cudaMemcpy(d, mine, sizeof mine, cudaMemcpyHostToDevice));
    comm_.all_gather(d, d + kFields, sizeof mine, stream);
    MK_CUDA_CHECK(cudaMemcpyAsync(theirs.data(), d + kFields, theirs.size() * 8, cudaMemcpyDeviceToHost, stream));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    if (stream) cudaStreamDestroy(stream);
    cudaFree(d);
    throw;
  }
  cudaStreamDestroy(stream);
  cudaFree(d);
  for (int peer = 0; peer < R; ++peer)
    for (int f = 0; f < kFields; ++f)
      if (theirs[size_t(peer * kFields + f)] != mine[f])
        fail("EpLayer", f == kFields - 1 ? "placement" : "options",
             std::string(kNames[f]) + " differs between rank " + str(comm_.rank()) + " and rank " + str(peer) +
                 ": every rank must build the same layer");
}

}  // namespace moekit::ep
