// ep_layer.cu — the host side of an expert-parallel step over NCCL (moekit/ep_nccl.hpp):
// validation, the buffers (allocated once), and the launches and exchanges of forward(). What a
// rank sets up before its layer (the communicator, its slots' weights) and the check that every
// rank built the same layer are in setup.cpp.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "align/launch.hpp"
#include "combine/launch.hpp"
#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/validate.hpp"
#include "ep/ep_kernels.cuh"
#include "ep/internal.hpp"
#include "ep/nccl.hpp"
#include "gemm/launch.hpp"
#include "moekit/ep_nccl.hpp"
#include "tuning/planner.hpp"
#include "tuning/workspace.hpp"

namespace moekit::ep {
namespace {
using detail::fail;
std::string str(int64_t v) { return std::to_string(v); }
nccl::Comm as_comm(void* c) { return static_cast<nccl::Comm>(c); }
// Rows per rank of [R][S] counts: the sum of each rank's S entries.
std::vector<int64_t> rows_per_rank(const int32_t* counts, int64_t R, int64_t S) {
  std::vector<int64_t> rows(static_cast<size_t>(R), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t l = 0; l < S; ++l) rows[size_t(r)] += counts[r * S + l];
  return rows;
}
}  // namespace

// ---- buffers -----------------------------------------------------------------------------------
struct EpLayer::Buffers {
  void* base = nullptr;
  int32_t* h_counts = nullptr;  // pinned [2][R*S]: slot counts sent, counts received (prefill)
  int32_t *replica_offsets, *replica_slots;
  int32_t *slot, *order, *order_blocks, *order_rows, *slot_counts, *status, *align_scratch;
  int32_t *inv, *sent_counts, *recv_counts, *overflow;
  __nv_bfloat16 *send_x, *ret_x, *recv_x;
  float *send_w, *recv_w;
  void* local_ws = nullptr;
  Workspace ws;
  // Every buffer, laid out over `p` in one list (tuning/workspace.hpp): over no buffer for the
  // size, then over the allocation for the pointers. The local GEMMs' workspace comes last.
  struct Sizes {
    int64_t experts, replica_slots, assignments, slots, send_rows, recv_rows, hidden, local_ws_bytes;
    bool grid_align;
  };
  void lay_out(detail::Pieces& p, const Sizes& z) {
    auto i32 = [&](int64_t n) { return p.add(DType::i32, {n}).as<int32_t>(); };
    const int64_t A = z.assignments;
    replica_offsets = i32(z.experts + 1), replica_slots = i32(z.replica_slots);
    slot = i32(A), order = i32(A), order_blocks = i32(A), order_rows = i32(1);
    slot_counts = i32(z.slots), status = i32(1);
    align_scratch = p.add(DType::i32, {int64_t(kAlignMaxCtas), z.slots + 1}, z.grid_align).as<int32_t>();
    inv = i32(A), sent_counts = i32(z.slots), recv_counts = i32(z.slots), overflow = i32(1);
    send_x = p.add(DType::bf16, {z.send_rows, z.hidden}).as<__nv_bfloat16>();
    ret_x = p.add(DType::bf16, {z.send_rows, z.hidden}).as<__nv_bfloat16>();
    send_w = p.add(DType::f32, {z.send_rows}).as<float>();
    recv_x = p.add(DType::bf16, {z.recv_rows, z.hidden}).as<__nv_bfloat16>();  // weights: the local ws
    local_ws = p.add(DType::i32, {(z.local_ws_bytes + 3) / 4}).data;
  }
  ~Buffers() {
    if (base) cudaFree(base);
    if (h_counts) cudaFreeHost(h_counts);
  }
};

EpLayer::EpLayer(const Communicator& comm, const Placement& placement, const EpOptions& options)
    : comm_(comm), placement_(placement), opt_(options) {
  constexpr const char* kEntry = "EpLayer";
  internal::expect_placement(placement_, kEntry, "placement");
  const MoeShape& s = opt_.shape;
  const int64_t R = placement_.ranks, S = placement_.slots_per_rank, k = s.topk;
  if (R != comm.ranks())
    fail(kEntry, "placement", "has " + str(R) + " ranks but the communicator has " + str(comm.ranks()));
  int device = -1;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  if (device != comm.device())
    fail(kEntry, "comm", "was made on device " + str(comm.device()) + " but the current device is " + str(device));
  if (s.experts != placement_.experts)
    fail(kEntry, "options.shape.experts", "is " + str(s.experts) + " but the placement has " + str(placement_.experts));
  if (s.tokens < 1) fail(kEntry, "options.shape.tokens", "the most tokens per rank must be >= 1, got " + str(s.tokens));
  detail::expect_shape(s, kEntry);
  if (R * S > kMaxExperts)
    fail(kEntry, "placement",
         "R*S = " + str(R * S) + " slots; the send order is an align over slots, at most " + str(kMaxExperts));
  if (s.hidden % 8 != 0) fail(kEntry, "options.shape.hidden", "must be a multiple of 8, got " + str(s.hidden));
  const int64_t A = s.tokens * k;
  if (opt_.mode == EpMode::decode) {
    if (opt_.capacity < 0) fail(kEntry, "options.capacity", "must be >= 0, got " + str(opt_.capacity));
    capacity_ = opt_.capacity > 0 ? opt_.capacity : no_overflow_capacity(placement_, s.tokens, k);
    decode_geometry(placement_, capacity_);  // validates the 32-bit row bound
  } else if (opt_.capacity != 0) {
    fail(kEntry, "options.capacity", "is for decode; prefill sends exact sizes (give 0)");
  }
  // Rows a rank may receive: every source's assignments (prefill), or R fixed messages (decode).
  recv_rows_max_ = opt_.mode == EpMode::decode ? R * capacity_ : R * A;
  if (recv_rows_max_ > std::numeric_limits<int32_t>::max() / 2) {
    const bool decode = opt_.mode == EpMode::decode;
    fail(kEntry, decode ? "options.capacity" : "options.shape.tokens",
         (decode ? "R*capacity = " : "R*T*k = ") + str(recv_rows_max_) + " receive rows do not fit 32-bit row ids");
  }

  // The local GEMMs: S experts, k = 1 (each received row is one assignment).
  MoeShape local{recv_rows_max_, s.hidden, s.inter, S, 1};
  GemmConfig up = opt_.up, down = opt_.down;
  if ((up.block_m == 0) != (down.block_m == 0))
    fail(kEntry, up.block_m == 0 ? "options.up" : "options.down", "give both tile configs or neither");
  if (up.block_m == 0) {
    // Configs for the typical load, T*k rows over S experts, as a single GPU with R*T tokens
    // would see per expert; buffers are sized for the worst case below.
    const MoeShape typical_shape{std::max<int64_t>(1, A), s.hidden, s.inter, S, 1};
    const ForwardPlan typical = plan_forward(typical_shape, query_device());
    up = typical.up;
    down = typical.down;
  }
  local_plan_ = plan_forward_with(local, up, down, 1);

  // One allocation for every buffer. The send order's align takes A assignments at most: its grid
  // kernel (tuning::plan_align) needs a scratch.
  const int64_t slots = R * S, E = s.experts;
  const Buffers::Sizes sizes{E,
                             int64_t(placement_.replica_slots.size()),
                             A,
                             slots,
                             opt_.mode == EpMode::decode ? R * capacity_ : A,
                             recv_rows_max_,
                             s.hidden,
                             int64_t(workspace_bytes(local_plan_)),
                             tuning::plan_align(A) == AlignKernel::grid};
  buf_ = std::make_unique<Buffers>();
  Buffers& b = *buf_;
  detail::Pieces sizing;
  b.lay_out(sizing, sizes);
  bytes_ = size_t(sizing.bytes());
  MK_CUDA_CHECK(cudaMalloc(&b.base, bytes_));
  MK_CUDA_CHECK(cudaMallocHost(&b.h_counts, size_t(2 * slots) * 4));
  detail::Pieces pieces(b.base);
  b.lay_out(pieces, sizes);
  b.ws = detail::carve_unchecked(local_plan_, b.local_ws);
  b.recv_w = b.ws.topk_weights.as<float>();
  MK_CUDA_CHECK(cudaMemset(b.base, 0, bytes_));  // no stale bytes: decode sends whole messages
  MK_CUDA_CHECK(cudaMemcpy(b.replica_offsets, placement_.replica_offsets.data(), 4 * (E + 1), cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(b.replica_slots, placement_.replica_slots.data(), 4 * placement_.replica_slots.size(),
                           cudaMemcpyHostToDevice));

  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));

  // Message sizes in rows: decode's are fixed; prefill's are set by each forward from the counts.
  const int64_t fixed = opt_.mode == EpMode::decode ? capacity_ : 0;
  send_rows_.assign(size_t(R), fixed);
  recv_rows_.assign(size_t(R), fixed);
  agree_with_peers();
  MK_CUDA_CHECK(cudaDeviceSynchronize());  // the memset and table copies are done before any stream uses them
}

EpLayer::~EpLayer() = default;

// ---- exchanges -------------------------------------------------------------------------------
// The [R][S] counts: row d of this rank's slot counts goes to d; source s's row lands at [s].
void EpLayer::exchange_counts(cudaStream_t stream) {
  const int32_t* counts = opt_.mode == EpMode::decode ? buf_->sent_counts : buf_->slot_counts;
  comm_.all_to_all(counts, buf_->recv_counts, size_t(placement_.slots_per_rank) * 4, stream);
}

// Dispatch (back = false): send_x/send_w rows of destination d (send_rows_[d] of them, after those
// of the ranks before d) to d, received after the rows of the sources before it. Return (back =
// true): the local GEMM's y_rows along the same messages, reversed. Empty messages are skipped on
// both sides (each side knows the other's size).
void EpLayer::exchange_rows(bool back, cudaStream_t stream) {
  const nccl::Comm c = as_comm(comm_.nccl_comm());
  const size_t row = size_t(opt_.shape.hidden) * 2;
  const auto* y_rows = static_cast<const char*>(buf_->ws.y_rows.data);
  auto* send_x = reinterpret_cast<const char*>(buf_->send_x);
  auto* recv_x = reinterpret_cast<char*>(buf_->recv_x);
  auto* ret_x = reinterpret_cast<char*>(buf_->ret_x);
  nccl::group([&] {
    size_t so = 0, ro = 0;  // offsets of this peer's messages: the rows of the peers before it
    for (int peer = 0; peer < comm_.ranks(); ++peer) {
      const size_t sn = size_t(send_rows_[size_t(peer)]), rn = size_t(recv_rows_[size_t(peer)]);
      if (!back && sn) {
        nccl::send(c, send_x + so * row, sn * row, peer, stream);
        nccl::send(c, buf_->send_w + so, sn * 4, peer, stream);
      }
      if (!back && rn) {
        nccl::recv(c, recv_x + ro * row, rn * row, peer, stream);
        nccl::recv(c, buf_->recv_w + ro, rn * 4, peer, stream);
      }
      if (back && rn) nccl::send(c, y_rows + ro * row, rn * row, peer, stream);
      if (back && sn) nccl::recv(c, ret_x + so * row, sn * row, peer, stream);
      so += sn;
      ro += rn;
    }
  });
}

void EpLayer::exchange_only(cudaStream_t stream) {
  if (last_tokens_ < 0) fail("EpLayer::exchange_only", "this", "needs a forward first (its message sizes)");
  exchange_rows(false, stream);
  exchange_rows(true, stream);
}

// ---- forward ---------------------------------------------------------------------------------
void EpLayer::forward(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& w13,
                      const Tensor& w2, const Tensor& y, int64_t token_offset, cudaStream_t stream,
                      const Tensor& expert_load) {
  constexpr const char* kEntry = "EpLayer::forward";
  const MoeShape& s = opt_.shape;
  const int64_t R = placement_.ranks, S = placement_.slots_per_rank, k = s.topk, H = s.hidden, F = s.inter;
  const int64_t T = x.rank == 2 ? x.dim(0) : -1;
  if (T < 0 || T > s.tokens)
    fail(kEntry, "x",
         "expected [T, " + str(H) + "] bf16 with T <= options.shape.tokens = " + str(s.tokens) + ", got " +
             x.shape_str());
  detail::expect_tensor(kEntry, "x", x, DType::bf16, {T, H});
  detail::expect_tensor(kEntry, "topk_ids", topk_ids, DType::i32, {T, k});
  detail::expect_tensor(kEntry, "topk_weights", topk_weights, DType::f32, {T, k});
  detail::expect_tensor(kEntry, "w13", w13, DType::bf16, {S, 2 * F, H});
  detail::expect_tensor(kEntry, "w2", w2, DType::bf16, {S, H, F});
  detail::expect_tensor(kEntry, "y", y, DType::bf16, {T, H});
  if (token_offset < 0) fail(kEntry, "token_offset", "must be >= 0, got " + str(token_offset));
  using detail::span_of;
  detail::expect_expert_load(kEntry, expert_load, s.experts,
                             {span_of("x", x), span_of("topk_ids", topk_ids), span_of("topk_weights", topk_weights),
                              span_of("w13", w13), span_of("w2", w2), span_of("y", y),
                              span_of("the layer's buffers", buf_->base, bytes_)});
  int device = -1;
  MK_CUDA_CHECK(cudaGetDevice(&device));
  if (device != comm_.device())
    fail(kEntry, "comm", "was made on device " + str(comm_.device()) + " but the current device is " + str(device));
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  MK_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (opt_.mode == EpMode::prefill && capturing != cudaStreamCaptureStatusNone)
    fail(kEntry, "options.mode",
         "prefill syncs once for the counts and cannot be captured in a CUDA graph; use decode");

  Buffers& b = *buf_;
  const bool decode = opt_.mode == EpMode::decode;
  const int64_t A = T * k;
  nvtxRangePushA("moekit.ep.forward");

  // route: the slot of every assignment.
  kernels::ep::RouteParams rp{topk_ids.as<const int32_t>(),
                              b.replica_offsets,
                              b.replica_slots,
                              b.slot,
                              b.inv,
                              A,
                              token_offset,
                              int(k),
                              int(s.experts),
                              int(S),
                              comm_.rank(),
                              placement_.rule == ReplicaRule::prefer_home};
  const int64_t route_ctas = std::max<int64_t>(1, (A + kernels::ep::kRouteThreads - 1) / kernels::ep::kRouteThreads);
  detail::launch_pdl("ep.route_kernel", kernels::ep::route_kernel, dim3(unsigned(route_ctas)),
                     dim3(kernels::ep::kRouteThreads), 0, stream, rp);
  // order: align over the R*S slots, block_m = 1 (plan_dispatch's stable counting sort).
  // align counts slots, not experts: the load counter is not its (nullptr); load_kernel sums the
  // slots of each expert into it.
  detail::launch_align(tuning::plan_align(A), b.slot, A, int(R * S), 1,
                       {b.order, b.order_blocks, b.order_rows, b.slot_counts, b.status, b.align_scratch, s.tokens * k},
                       nullptr, stream);
  if (expert_load.given()) {
    const kernels::ep::LoadParams lp{b.slot_counts, b.replica_offsets, b.replica_slots, expert_load.as<int64_t>(),
                                     int(s.experts)};
    detail::launch_pdl("ep.load_kernel", kernels::ep::load_kernel, dim3(1), dim3(unsigned(kMaxExperts)), 0, stream, lp);
  }
  // pack
  if (decode) MK_CUDA_CHECK(cudaMemsetAsync(b.overflow, 0, 4, stream));
  kernels::ep::PackParams pp{x.as<const __nv_bfloat16>(),
                             topk_weights.as<const float>(),
                             b.slot,
                             b.order,
                             b.slot_counts,
                             b.send_x,
                             b.send_w,
                             b.inv,
                             decode ? b.sent_counts : nullptr,
                             b.overflow,
                             H,
                             decode ? capacity_ : 0,
                             int(k),
                             int(R * S),
                             int(S)};
  // A warp per row, up to 4 CTAs per SM.
  const int64_t pack_ctas = std::clamp<int64_t>((A + 7) / 8, 1, 4 * sm_count_);
  detail::launch_pdl("ep.pack_kernel", kernels::ep::pack_kernel, dim3(unsigned(pack_ctas)),
                     dim3(kernels::ep::kPackThreads), 0, stream, pp);

  // exchange: counts (prefill: then sizes on the host), rows and weights.
  exchange_counts(stream);
  if (!decode) {
    MK_CUDA_CHECK(cudaMemcpyAsync(b.h_counts, b.slot_counts, size_t(R * S) * 4, cudaMemcpyDeviceToHost, stream));
    MK_CUDA_CHECK(
        cudaMemcpyAsync(b.h_counts + R * S, b.recv_counts, size_t(R * S) * 4, cudaMemcpyDeviceToHost, stream));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    // Within the buffers: every rank was built with the same options (agree_with_peers), so a
    // source sends at most its T*k <= options.shape.tokens*k rows, and R of them fit recv rows.
    send_rows_ = rows_per_rank(b.h_counts, R, S);
    recv_rows_ = rows_per_rank(b.h_counts + R * S, R, S);
  }
  exchange_rows(false, stream);

  // experts: the local block table from the counts, then moekit's GEMMs on the received rows.
  kernels::ep::ReceiveParams rv{b.recv_counts,
                                b.ws.sorted_ids.as<int32_t>(),
                                b.ws.block_expert.as<int32_t>(),
                                b.ws.num_rows_padded.as<int32_t>(),
                                b.ws.expert_counts.as<int32_t>(),
                                local_plan_.max_blocks(),
                                decode ? capacity_ : 0,
                                int32_t(recv_rows_max_),
                                int(R),
                                int(S),
                                local_plan_.block_m()};
  detail::launch_pdl("ep.receive_layout_kernel", kernels::ep::receive_layout_kernel, dim3(1),
                     dim3(kernels::ep::kReceiveThreads), 0, stream, rv);
  detail::launch_expert_up(local_plan_, b.recv_x, w13.data, b.ws, stream);
  detail::launch_expert_down(local_plan_, w2.data, b.recv_w, b.ws, stream);

  // return and combine
  exchange_rows(true, stream);
  detail::launch_combine(b.ret_x, b.inv, y.data, T, H, int(k), stream);
  last_tokens_ = T;
  nvtxRangePop();
}

// ---- after a step --------------------------------------------------------------------------
EpStats EpLayer::stats(cudaStream_t stream) const {
  if (last_tokens_ < 0) fail("EpLayer::stats", "this", "needs a forward first");
  const int64_t R = placement_.ranks, S = placement_.slots_per_rank;
  const bool decode = opt_.mode == EpMode::decode;
  std::vector<int32_t> sent(size_t(R * S)), recv(size_t(R * S));
  int32_t status = 0, overflow = 0;
  MK_CUDA_CHECK(cudaMemcpyAsync(sent.data(), decode ? buf_->sent_counts : buf_->slot_counts, sent.size() * 4,
                                cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(recv.data(), buf_->recv_counts, recv.size() * 4, cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(&status, buf_->status, 4, cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(&overflow, buf_->overflow, 4, cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  EpStats st;
  st.overflow = decode ? overflow : 0;
  st.ids_out_of_range = (status & kStatusExpertIdOutOfRange) != 0;
  st.rows_sent = rows_per_rank(sent.data(), R, S);
  st.rows_received = rows_per_rank(recv.data(), R, S);
  const int64_t row = opt_.shape.hidden * 2, me = comm_.rank();
  for (int64_t r = 0; r < R; ++r) {
    if (r == me) continue;
    // What NCCL moved out of this rank: whole messages (decode: capacity rows) of rows and weights,
    // the counts, and the results of the rows it received, sent back.
    st.bytes_on_wire += send_rows_[size_t(r)] * (row + 4) + S * 4 + recv_rows_[size_t(r)] * row;
  }
  return st;
}

void EpLayer::check(cudaStream_t stream) const {
  const EpStats st = stats(stream);
  if (st.ids_out_of_range)
    fail("EpLayer::forward", "topk_ids",
         "an expert id is outside [0, " + str(opt_.shape.experts) + "); those assignments were skipped");
  if (st.overflow > 0)
    fail("EpLayer::forward", "options.capacity",
         str(st.overflow) + " assignments did not fit the decode capacity of " + str(capacity_) +
             " rows per destination; their results are missing from y (raise the capacity)");
}

}  // namespace moekit::ep
