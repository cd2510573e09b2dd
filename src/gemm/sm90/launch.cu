// launch.cu — host side of the Hopper (wgmma + TMA) prefill expert GEMM: encodes the weights' TMA
// descriptor (4-D view, 128-byte swizzle), sizes the persistent grid from the device and launches
// the compiled config the plan names. Unchecked: what the kernel relies on (block_m 128, H and F
// multiples of 8 below 2^31, split-K only on the bf16 down GEMM, a compiled block_n, 16-byte
// aligned operands, rows and work items in 32 bits) is guaranteed by plan_forward_with and the
// public entries' validation.
//
// The TMA descriptor is encoded per call (it holds the weight pointer) by cuTensorMapEncodeTiled,
// a pure host function reached through the runtime's driver entry point (no libcuda link), and
// passed by value as a __grid_constant__ parameter: graph capture records it like any argument.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <climits>
#include <string>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "common/validate.hpp"
#include "gemm/configs.hpp"
#include "gemm/launch.hpp"
#include "gemm/sm90/kernel.cuh"
#include "gemm/sm90/weight_grad.cuh"
#include "tuning/backward_planner.hpp"  // the wgmma weight-gradient tile the plan counts items of

namespace moekit::detail {

namespace {

namespace sm90 = kernels::gemm::sm90;
using kernels::gemm::Mode;
using kernels::gemm::Params;

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    MK_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || f == nullptr)
      throw CudaError("sm90 expert GEMM: the driver has no cuTensorMapEncodeTiled (needs CUDA 12.0+ driver)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 4-D tensor map of 2-byte elements (FP8 rows in 2-byte units: gemm/params.hpp) with the 128-byte
// swizzle wgmma reads and zeros outside the tensor; `what` names the operand in the error.
CUtensorMap encode_map(const void* base, const cuuint64_t (&dims)[4], const cuuint64_t (&strides)[3],
                       const cuuint32_t (&box)[4], const std::string& what) {
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims,
                                          strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError("sm90 expert GEMM: cuTensorMapEncodeTiled " + what + " failed with CUresult " + std::to_string(int(r)));
  return map;
}

// The weights as a 4-D tensor (K innermost, but for Dx and DGrad): Up (and UpH) w13 [E][2][F][H] viewed as (H, F, 2, E), so one
// box of (64, BN/2, 2, 1) brings BN/2 gate rows and the same BN/2 up rows, gate first; Down w2
// [E][H][F] as (F, H, 1, E) with boxes (64, BN, 1, 1). Rows past F (or H) and K past k_dim are
// outside the tensor: TMA fills them with zeros instead of reading the next expert.
// The backward's N-major B (Dx: w13 [E][2F][H] read with K = 2F; DGrad: w2 [E][H][F] with K = H):
// (N, K, 1, E), boxes of (64, 64, 1, 1), one per 64 columns of a tile.
CUtensorMap make_b_map(Mode mode, const Params& p, int64_t experts, int block_n) {
  const bool n_major = kernels::gemm::b_n_major(mode);
  const int64_t halves = kernels::gemm::pairs_gate_up(mode) ? 2 : 1;
  const int64_t inner = n_major ? p.n_dim : p.k_dim, outer = n_major ? p.k_dim : p.n_dim;
  const cuuint64_t dims[4] = {cuuint64_t(inner), cuuint64_t(outer), cuuint64_t(halves), cuuint64_t(experts)};
  const cuuint64_t row_bytes = cuuint64_t(inner) * 2;
  const cuuint64_t strides[3] = {row_bytes, row_bytes * cuuint64_t(outer),
                                 cuuint64_t(p.b_expert_stride) * 2};  // bytes of dims 1..3
  const cuuint32_t box[4] = {cuuint32_t(sm90::kBlockK), n_major ? cuuint32_t(sm90::kBlockK) : cuuint32_t(block_n / halves),
                             cuuint32_t(halves), 1};
  return encode_map(p.b, dims, strides, box,
                    "of B (dims " + std::to_string(p.k_dim) + "x" + std::to_string(p.n_dim) + "x" +
                        std::to_string(halves) + "x" + std::to_string(experts) + ")");
}

// A by TMA (sm90/producer.cuh, tma_a: the FP8 down GEMM): act [rows][F] e4m3 in 2-byte units
// (k_dim) as (K, rows, 1, 1), boxes of (64, 128, 1, 1): one stage of a tile's 128 sorted rows.
// Rows past `rows` (max_rows) and K past F read zeros.
CUtensorMap make_a_map(const Params& p, int64_t rows) {
  const cuuint64_t dims[4] = {cuuint64_t(p.k_dim), cuuint64_t(rows), 1, 1};
  const cuuint64_t row_bytes = cuuint64_t(p.k_dim) * 2;
  const cuuint64_t strides[3] = {row_bytes, row_bytes * cuuint64_t(rows), row_bytes * cuuint64_t(rows)};
  const cuuint32_t box[4] = {cuuint32_t(sm90::kBlockK), cuuint32_t(sm90::kBlockM), 1, 1};
  return encode_map(p.a, dims, strides, box,
                    "of A (" + std::to_string(rows) + " rows of " + std::to_string(row_bytes) + " bytes)");
}

// Once per kernel and device: raise its shared-memory limit; returns the SMs, one CTA each (the
// grids are persistent).
template <class Cfg, auto Kernel>
int64_t persistent_sms() {
  static detail::PerDevice<int64_t> per_device;
  return per_device.get([&](int device) {
    int count = 0, optin = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (int64_t(optin) < int64_t(Cfg::kSmemBytes))
      throw CudaError("sm90 GEMM kernel: needs " + std::to_string(Cfg::kSmemBytes) +
                      " bytes of shared memory per block, the device allows " + std::to_string(optin));
    MK_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes)));
    return int64_t(count);
  });
}

template <Mode M, int BN, int ST, bool FP8, bool PINGPONG = false>
void launch_instance(const Params& p_in, const CUtensorMap& b_map, int64_t max_blocks, cudaStream_t stream) {
  using Cfg = sm90::Config<BN, ST, FP8, PINGPONG>;
  constexpr auto kernel = sm90::sm90_expert_gemm_kernel<M, BN, ST, FP8, PINGPONG>;
  const int64_t sms = persistent_sms<Cfg, kernel>();
  Params p = p_in;
  const int64_t cols = kernels::gemm::cols_per_tile(M, BN);
  // Split-K (DownSplitK): each column tile once per K-slice (layout.hpp, k_slice).
  p.k_splits = sm90::splits_k<M, Cfg>() ? p.k_splits : 1;
  const int64_t k_tiles = (p.k_dim + sm90::kBlockK - 1) / sm90::kBlockK;
  p.k_tiles_per_split = (k_tiles + p.k_splits - 1) / p.k_splits;
  p.n_tiles = (p.n_dim + cols - 1) / cols * p.k_splits;
  const int64_t grid = std::max<int64_t>(1, std::min(sms, max_blocks * p.n_tiles));
  // The claim counter starts at zero every launch: a memset node in a graph, no host work.
  MK_CUDA_CHECK(cudaMemsetAsync(p.tile_counter, 0, sizeof(int32_t), stream));
  const CUtensorMap a_map = sm90::tma_a<M, Cfg>() ? make_a_map(p, max_blocks * sm90::kBlockM) : CUtensorMap{};
  launch_pdl("sm90_expert_gemm_kernel", kernel, dim3(unsigned(grid)), dim3(sm90::kThreads), Cfg::kSmemBytes, stream, p,
             b_map, a_map);
}

// The forward's modes of one config: Up, Down, and (bf16) the training forward's UpSaveH.
template <int BN, int ST, bool FP8>
void launch_forward_instance(Mode mode, const Params& p, const CUtensorMap& b_map, int64_t max_blocks,
                             cudaStream_t stream) {
  if (mode == Mode::Up) return launch_instance<Mode::Up, BN, ST, FP8>(p, b_map, max_blocks, stream);
  if (mode == Mode::Down && p.k_splits <= 1)
    return launch_instance<Mode::Down, BN, ST, FP8>(p, b_map, max_blocks, stream);
  if constexpr (!FP8) {
    if (mode == Mode::Down) return launch_instance<Mode::DownSplitK, BN, ST, FP8>(p, b_map, max_blocks, stream);
    if (mode == Mode::UpSaveH) return launch_instance<Mode::UpSaveH, BN, ST, FP8>(p, b_map, max_blocks, stream);
  }
  fail("expert_gemm", "plan", "the forward's wgmma GEMMs are Up, Down (bf16: also split along K) and (bf16) UpSaveH");
}

}  // namespace

void launch_sm90_expert_gemm(Mode mode, const Params& p, const ForwardPlan& plan, cudaStream_t stream, int block_n) {
  if (plan.max_blocks() == 0) return;

  // FP8 rows are 2-byte units to TMA as to the kernel (gemm/params.hpp): the same box, the same bytes.
  const CUtensorMap b_map = make_b_map(mode, p, plan.shape.experts, block_n);
  const bool fp8 = plan.precision() == Precision::fp8;
#define MK_SM90_DISPATCH(bn, st, is_fp8)                                                    \
  if (block_n == bn && fp8 == is_fp8) {                                                     \
    launch_forward_instance<bn, st, is_fp8>(mode, p, b_map, plan.max_blocks(), stream);     \
    return;                                                                                 \
  }
#define MK_SM90_BF16(bn, st) MK_SM90_DISPATCH(bn, st, false)
#define MK_SM90_FP8(bn, st) MK_SM90_DISPATCH(bn, st, true)
  MOEKIT_WGMMA_CONFIGS(MK_SM90_BF16)
  MOEKIT_WGMMA_FP8_CONFIGS(MK_SM90_FP8)
#undef MK_SM90_FP8
#undef MK_SM90_BF16
#undef MK_SM90_DISPATCH
  fail("expert_gemm", "plan", "no compiled wgmma config has block_n " + std::to_string(block_n));
}

// Dx and UpH: the cooperative 128 x 256 tile. DGrad: ping-pong 128 x 128 tiles (pingpong.cuh), 6
// stages of 32 KB, its SwiGLU-backward epilogue under the other warpgroup's mainloop.
void launch_sm90_backward_gemm(Mode mode, const Params& p, int64_t max_blocks, int64_t experts, cudaStream_t stream) {
  if (max_blocks == 0) return;
  constexpr int kBlockN = 256, kPingPongN = 128;
  if (mode == Mode::DGrad) {
    const CUtensorMap b_map = make_b_map(mode, p, experts, kPingPongN);
    return launch_instance<Mode::DGrad, kPingPongN, 6, false, true>(p, b_map, max_blocks, stream);
  }
  const CUtensorMap b_map = make_b_map(mode, p, experts, kBlockN);
  if (mode == Mode::Dx)
    launch_instance<Mode::Dx, kBlockN, 4, false>(p, b_map, max_blocks, stream);
  else if (mode == Mode::UpH)
    launch_instance<Mode::UpH, kBlockN, 4, false>(p, b_map, max_blocks, stream);
  else
    fail("moe_backward", "plan", "the wgmma backward GEMMs are Dx, DGrad and UpH");
}

// The weight gradients' bf16 out [E][m_dim][n_dim] as (n_dim, m_dim, E, 1): each consumer warp
// stores 64 x 16 boxes of it (sm90/weight_grad_epilogue.cuh, store_bf16_rows); rows past m_dim stay inside
// their expert (dimension 1 ends there) and the TMA writes nothing outside the tensor.
static CUtensorMap make_weight_grad_out_map(const kernels::gemm::KGroupedParams& p) {
  const cuuint64_t dims[4] = {cuuint64_t(p.n_dim), cuuint64_t(p.m_dim), cuuint64_t(p.experts), 1};
  const cuuint64_t row_bytes = cuuint64_t(p.n_dim) * 2;  // a multiple of 16: n_dim is H or F, multiples of 8
  const cuuint64_t strides[3] = {row_bytes, row_bytes * cuuint64_t(p.m_dim), row_bytes * cuuint64_t(p.m_dim) * cuuint64_t(p.experts)};
  const cuuint32_t box[4] = {64, 16, 1, 1};
  return encode_map(p.out, dims, strides, box,
                    "of the weight gradient (" + std::to_string(p.experts) + "x" + std::to_string(p.m_dim) + "x" +
                        std::to_string(p.n_dim) + ")");
}

template <bool kATokens>
void launch_weight_grad_instance(const kernels::gemm::KGroupedParams& p, int64_t items, cudaStream_t stream) {
  using Cfg = sm90::WeightGradCfg;
  constexpr auto kernel = sm90::sm90_weight_grad_kernel<kATokens>;
  const int64_t grid = std::min(persistent_sms<Cfg, kernel>(), items);
  const CUtensorMap out_map = p.bf16_out() ? make_weight_grad_out_map(p) : CUtensorMap{};
  MK_CUDA_CHECK(cudaMemsetAsync(p.tile_counter, 0, sizeof(int32_t), stream));
  launch_pdl("sm90_weight_grad_kernel", kernel, dim3(unsigned(grid)), dim3(sm90::kThreads), Cfg::kSmemBytes, stream, p,
             out_map);
}

void launch_sm90_weight_grad(const kernels::gemm::KGroupedParams& p_in, bool a_by_token, cudaStream_t stream) {
  kernels::gemm::KGroupedParams p = p_in;
  p.topk_div = dev::FastDivU32(uint32_t(p.topk));
  p.m_tiles = int32_t((p.m_dim + sm90::kWeightGradM - 1) / sm90::kWeightGradM);
  p.n_tiles = int32_t((p.n_dim + sm90::kWeightGradN - 1) / sm90::kWeightGradN);
  const int64_t items = int64_t(p.experts) * p.splits * p.m_tiles * p.n_tiles;  // <= INT32_MAX: expect_backward_plan
  if (items == 0) return;
  static_assert(sm90::kWeightGradM == tuning::kWgmmaWeightGradTileM && sm90::kWeightGradN == tuning::kWgmmaWeightGradTileN,
                "the planner's count of the weight-gradient items is this kernel's");
  static_assert(2 * std::max(2 * kMaxInter, kMaxHidden) <= int64_t(UINT32_MAX),
                "the weight-gradient producer forms row bytes (2F or H bf16) in 32 bits");
  if (a_by_token)
    launch_weight_grad_instance<true>(p, items, stream);
  else
    launch_weight_grad_instance<false>(p, items, stream);
}

}  // namespace moekit::detail
