// launch.cu — host side of the mma.sync expert GEMM: instantiates the compiled configs
// (gemm/configs.hpp) and launches the one the plan names on a persistent grid (SMs x resident CTAs,
// at most the worst-case number of items); the kernel reads the true number of blocks on the
// device.
#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/launch.hpp"
#include "common/per_device.hpp"
#include "common/validate.hpp"
#include "gemm/configs.hpp"
#include "gemm/launch.hpp"
#include "gemm/mma_sync/fp8.cuh"
#include "gemm/mma_sync/kernel.cuh"

namespace moekit::detail {

namespace {

using kernels::gemm::Mode;
using kernels::gemm::Params;

namespace ms = kernels::gemm::mma_sync;

// Cfg: the smem tile in 2-byte units (an fp8 config's block_k of 128 or 256 e4m3 is 64 or 128 units).
template <Mode M, class Cfg, class Parts>
void launch_instance(Params p, int64_t max_blocks, cudaStream_t stream) {
  constexpr int BN = Cfg::kBlockN, BK = Cfg::kBlockK;
  constexpr size_t kSmem = Parts::kSmemBytes;
  auto kernel = ms::expert_gemm_kernel<M, Cfg, Parts>;
  constexpr int C = Parts::kCluster;  // CTAs per cluster (FP8 narrow up tiles), else 1
  // Once per instance and device: raise the shared-memory limit and size the persistent grid
  // from the device (SM count x resident CTAs, or resident clusters x C). Not per call: keeps the
  // hot path free of queries.
  static PerDevice<int64_t> resident;
  const int64_t resident_ctas = resident.get([&](int device) {
    MK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    int sms = 0, per_sm = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if constexpr (C > 1) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(C * sms));
      cfg.blockDim = dim3(Cfg::kThreads);
      cfg.dynamicSmemBytes = kSmem;
      cudaLaunchAttribute attr = cluster_attribute(unsigned(C));
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      MK_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
      return int64_t(std::max(clusters, 1)) * C;
    }
    MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads, kSmem));
    return int64_t(sms) * std::max(per_sm, 1);
  });
  const int64_t cols = kernels::gemm::cols_per_tile(M, BN);
  p.n_tiles = (p.n_dim + cols - 1) / cols;
  const int64_t k_tiles = (p.k_dim + BK - 1) / BK;
  p.k_tiles_per_split = (k_tiles + p.k_splits - 1) / p.k_splits;
  const int64_t items = max_blocks * ((p.n_tiles + C - 1) / C) * p.k_splits;  // per cluster
  const int64_t grid = C * std::max<int64_t>(1, std::min(resident_ctas / C, items));
  if constexpr (C > 1)
    launch_pdl_cluster("expert_gemm_kernel", unsigned(C), kernel, dim3(unsigned(grid)), dim3(Cfg::kThreads), kSmem,
                       stream, p);
  else
    launch_pdl("expert_gemm_kernel", kernel, dim3(unsigned(grid)), dim3(Cfg::kThreads), kSmem, stream, p);
}

// M: the kernel's mode, Up or Down; kSaveH (Up, bf16): the epilogue that also stores h (UpSaveH).
template <Mode M, bool kSaveH = false>
void dispatch(const GemmConfig& c, const Params& p, int64_t max_blocks, cudaStream_t stream) {
#define MK_DISPATCH(bm, bn, bk, wm, wn, st)                                                  \
  if (c == GemmConfig{bm, bn, bk, wm, wn, st, GemmKernel::mma_sync}) {                       \
    using Cfg = ms::Tile<bm, bn, bk, wm, wn, st>;                                            \
    if constexpr (kSaveH)                                                                    \
      launch_instance<M, Cfg, ms::Bf16Parts<M, Cfg, ms::UpSaveHEpilogue<Cfg>>>(p, max_blocks, stream); \
    else                                                                                     \
      launch_instance<M, Cfg, ms::Bf16Parts<M, Cfg>>(p, max_blocks, stream);                 \
    return;                                                                                  \
  }
  MOEKIT_GEMM_CONFIGS(MK_DISPATCH)
#undef MK_DISPATCH
  if constexpr (kSaveH) fail("expert_gemm", "plan", "save_h needs a bf16 config, got " + c.str());
#define MK_DISPATCH_FP8(bm, bn, bk, wm, wn, st)                                              \
  if (c == GemmConfig{bm, bn, bk, wm, wn, st, GemmKernel::mma_sync, Precision::fp8}) {       \
    if constexpr (ms::Fp8Parts<M, ms::Tile<bm, bn, bk / 2, wm, wn, st>>::kCompiled) {        \
      using Cfg = ms::Tile<bm, bn, bk / 2, wm, wn, st>;                                      \
      launch_instance<M, Cfg, ms::Fp8Parts<M, Cfg>>(p, max_blocks, stream);                  \
      return;                                                                                \
    }                                                                                        \
  }
  MOEKIT_GEMM_FP8_CONFIGS(MK_DISPATCH_FP8)
#undef MK_DISPATCH_FP8
  fail("expert_gemm", "plan", "config " + c.str() + " is not compiled");
}

}  // namespace

void launch_mma_sync_gemm(Mode mode, const GemmConfig& config, const Params& p, int64_t max_blocks,
                          cudaStream_t stream) {
  if (mode == Mode::Up)
    dispatch<Mode::Up>(config, p, max_blocks, stream);
  else if (mode == Mode::UpSaveH)
    dispatch<Mode::Up, true>(config, p, max_blocks, stream);
  else
    dispatch<Mode::Down>(config, p, max_blocks, stream);
}

}  // namespace moekit::detail
