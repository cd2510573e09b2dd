// configs.cpp — the expert-GEMM configs the library compiles, as the planner sees them: one list
// from gemm/configs.hpp's X-macros (the launchers instantiate exactly these), the wgmma entries
// with the geometry of gemm/sm90/geometry.hpp, and how a config names itself.
#include <string>
#include <vector>

#include "gemm/configs.hpp"
#include "gemm/sm90/geometry.hpp"
#include "moekit/moe.hpp"
#include "tuning/planner.hpp"

namespace moekit {

#define MK_CHECK_BLOCK_M(bm, ...) static_assert(bm <= tuning::kLargestBlockM, "kLargestBlockM bounds every config");
MOEKIT_GEMM_CONFIGS(MK_CHECK_BLOCK_M)
#undef MK_CHECK_BLOCK_M
static_assert(kernels::gemm::sm90::kBlockM <= tuning::kLargestBlockM, "kLargestBlockM bounds every config");

const char* precision_name(Precision p) { return p == Precision::fp8 ? "fp8" : "bf16"; }

bool tuning::up_config_ok(const GemmConfig& c) {
  if (c.precision != Precision::fp8) return true;
  const int64_t cols = c.block_n / 2;  // act columns of the tile
  if (c.kernel == GemmKernel::wgmma) return cols == kFp8Block;
  return cols > 0 && kFp8Block % cols == 0 && kFp8Block / cols <= 8;
}

bool tuning::down_splits_ok(const GemmConfig& down, int splits) {
  if (splits == 1 || down.kernel == GemmKernel::mma_sync) return true;
  return down.precision == Precision::bf16 && splits <= kMaxWgmmaDownSplits;
}

std::string GemmConfig::str() const {
  return std::string(precision == Precision::fp8 ? "fp8-" : "") + (kernel == GemmKernel::wgmma ? "wgmma-" : "") + "m" + std::to_string(block_m) + "n" +
         std::to_string(block_n) + "k" + std::to_string(block_k) + "w" + std::to_string(warps_m) + "x" +
         std::to_string(warps_n) + "s" + std::to_string(stages);
}

const std::vector<GemmConfig>& compiled_gemm_configs(Precision precision) {
  namespace sm90 = kernels::gemm::sm90;
#define MK_CONFIG_ENTRY(bm, bn, bk, wm, wn, st) GemmConfig{bm, bn, bk, wm, wn, st, GemmKernel::mma_sync},
  // wgmma: warps_m counts every warp of the CTA (2 consumer warpgroups + 1 producer), warps_n 1.
#define MK_WGMMA_ENTRY(bn, st) \
  GemmConfig{sm90::kBlockM, bn, sm90::kBlockK, sm90::kThreads / 32, 1, st, GemmKernel::wgmma},
#define MK_FP8_ENTRY(bm, bn, bk, wm, wn, st) GemmConfig{bm, bn, bk, wm, wn, st, GemmKernel::mma_sync, Precision::fp8},
#define MK_WGMMA_FP8_ENTRY(bn, st) \
  GemmConfig{sm90::kBlockM, bn, sm90::kFp8BlockK, sm90::kThreads / 32, 1, st, GemmKernel::wgmma, Precision::fp8},
  static const std::vector<GemmConfig> bf16 = {MOEKIT_GEMM_CONFIGS(MK_CONFIG_ENTRY) MOEKIT_WGMMA_CONFIGS(MK_WGMMA_ENTRY)};
  static const std::vector<GemmConfig> fp8 = {MOEKIT_GEMM_FP8_CONFIGS(MK_FP8_ENTRY)
                                                  MOEKIT_WGMMA_FP8_CONFIGS(MK_WGMMA_FP8_ENTRY)};
#undef MK_WGMMA_FP8_ENTRY
#undef MK_FP8_ENTRY
#undef MK_WGMMA_ENTRY
#undef MK_CONFIG_ENTRY
  return precision == Precision::fp8 ? fp8 : bf16;
}

}  // namespace moekit
