// communicator.cpp — the NCCL side of expert parallelism that is not a layer step: the id every
// rank's communicator is made from, the communicator itself, and copying a rank's experts out of
// the full weights (moekit/ep_nccl.hpp).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>

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

}  // namespace moekit::ep
