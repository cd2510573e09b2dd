// geometry.hpp — the tile geometry of the Hopper (wgmma + TMA) expert GEMM, host and device: the
// 128 x BN tile, its three warpgroups, the ring of stages and the shared-memory map of one CTA.
// The launcher (launch.cu), the planner's config list (src/tuning/configs.cpp) and the kernel
// read the numbers from here; the layout arithmetic inside a stage is layout.hpp's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/canon.hpp"  // MK_HD
#include "common/sm90_limits.hpp"
#include "gemm/params.hpp"

namespace moekit::kernels::gemm::sm90 {

// ---- tile geometry ------------------------------------------------------------------------------
inline constexpr int kBlockM = 128;      // rows per tile: the aligned layout's block_m
inline constexpr int kBlockK = 64;       // bf16 per smem row = one 128-byte swizzle row
inline constexpr int kRowBytes = kBlockK * 2;
inline constexpr int kFp8BlockK = kRowBytes;  // e4m3 per smem row: one 128-deep scale block
inline constexpr int kSwizzleAtomBytes = 8 * kRowBytes;  // 8 rows: the 128B pattern's period
inline constexpr int kWgmmaM = 64;       // rows per wgmma (one consumer warpgroup)
inline constexpr int kWgmmaK = 16;       // bf16 reduction depth per wgmma
inline constexpr int kConsumerWarpgroups = kBlockM / kWgmmaM;
inline constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
inline constexpr int kProducerThreads = 128;  // one warpgroup: A gather (cp.async) + B (TMA)
inline constexpr int kThreads = kConsumerThreads + kProducerThreads;
inline constexpr int kItemSlots = 2;  // the work-item channel's ring (scheduler.cuh)
static_assert(kRowBytes == 128, "the 128B swizzle needs rows of exactly 128 bytes");
// Registers per thread at launch: the one CTA of an SM shares its 65,536-register file (sm_90),
// allocated in multiples of 8: 65536 / 384 = 170 -> 168. setmaxnreg then moves them between roles.
inline constexpr int kRegisterFile = 65536;
inline constexpr int kLaunchRegs = kRegisterFile / kThreads / 8 * 8;

// The tile configuration of one compiled instance: BN columns of B per tile, STAGES-deep ring.
// FP8: the same bytes per stage (a 128-byte row is 128 e4m3, one scale block deep), plus each
// stage's scales: the A scale of every tile row, then the B scales of the tile's two 128-row halves.
// PINGPONG (pingpong.cuh): each consumer warpgroup owns whole tiles, all 128 rows (two m64 sets of
// kAccs accumulators), the two taking alternate tiles so one's epilogue runs under the other's
// mainloop; a stage is then released by the 4 warps of one warpgroup.
template <int BN, int STAGES, bool FP8 = false, bool PINGPONG = false>
struct Config {
  static constexpr int kBlockN = BN;
  static constexpr int kStages = STAGES;
  static constexpr bool kFp8 = FP8;
  static constexpr bool kPingPong = PINGPONG;
  static constexpr uint32_t kScaleFloats = FP8 ? kBlockM + 4 : 0;  // a[128], b[2], padding to 16 B
  static constexpr uint32_t kScaleB = kBlockM;                     // index of b[0]
  static constexpr int kAccs = BN / 2;  // m64nBN f32 accumulators per consumer thread
  static constexpr uint32_t kABytes = kBlockM * kRowBytes;  // one stage of A: [128][64] bf16
  static constexpr uint32_t kBBytes = BN * kRowBytes;       // one stage of B: [BN][64] bf16
  static constexpr uint32_t kAOffset = 0;
  static constexpr uint32_t kBOffset = kAOffset + STAGES * kABytes;
  static constexpr uint32_t kScaleOffset = kBOffset + STAGES * kBBytes;
  static constexpr uint32_t kBarOffset = kScaleOffset + STAGES * kScaleFloats * 4;  // full[STAGES], empty[STAGES]
  // The work-item channel (scheduler.cuh): item_full[2], item_empty[2], then
  // the two slots of {item, live warpgroups} (int32 each).
  static constexpr uint32_t kItemBarOffset = kBarOffset + 2 * STAGES * 8;
  static constexpr uint32_t kItemSlotOffset = kItemBarOffset + 2 * kItemSlots * 8;
  // Ping-pong: the consumer warpgroups' turn mbarriers, turn[2] (pingpong.cuh).
  static constexpr uint32_t kTurnBarOffset = kItemSlotOffset + kItemSlots * 8;
  // +1024: the dynamic-smem base is only guaranteed 16-byte aligned; the kernel rounds it up.
  static constexpr size_t kSmemBytes = kTurnBarOffset + (PINGPONG ? 2 * 8 : 0) + kSwizzleAtomBytes;
  // full: 128 cp.async arrivals (.noinc) + 1 arrive.expect_tx of the TMA thread.
  static constexpr uint32_t kFullArrivals = kProducerThreads + 1;
  // empty: lane 0 of every consumer warp, once its warpgroup's wgmma on the stage completed.
  // Ping-pong: lane 0 of the owning warpgroup's 4 warps (so also a turn's arrivals).
  static constexpr uint32_t kEmptyArrivals = (PINGPONG ? 128 : kConsumerThreads) / 32;
  static constexpr uint32_t kTurnArrivals = 128 / 32;
  // item_full: the claiming thread; item_empty: lane 0 of every warp of the CTA, once it read the slot
  // (the weight-gradient kernel inits it with kThreads instead: every thread arrives after its
  // own read: weight_grad.cuh's take_work).
  static constexpr uint32_t kItemFullArrivals = 1;
  static constexpr uint32_t kItemEmptyArrivals = kThreads / 32;
  // 128·64 + 256·216 = 63488 <= the 384 × kLaunchRegs registers the CTA is launched with. The producer
  // needs 64 since it publishes work items (claim, two ids); the consumers fit 216 without a spill.
  // FP8's producer also holds the block scales' sources: 72 (64 spilled; 128·72 + 256·216 = 64512,
  // the whole launch). The ping-pong (DGrad's) takes 80 / 208 (128·80 + 256·208 = 63488): measured
  // 0.94-0.95x of its time at 64 / 216, and 64 / 208 as slow as 64 / 216, so the gain is the
  // producer's (ncu's locked clock, H100; docs/perf/NOTES.md, "Backward"): a ping-pong stage drains
  // in half a cooperative one's time. The cooperative kernels moved within ±1.5%: they keep 64 / 216.
  static constexpr int kProducerRegs = FP8 ? 72 : (PINGPONG ? 80 : 64);
  static constexpr int kConsumerRegs = PINGPONG ? 208 : 216;

  static_assert(BN == 128 || BN == 256, "wgmma wrappers exist for n128 and n256");
  static_assert(!FP8 || BN == 256, "the fp8 mainloop multiplies two n128 halves");
  static_assert(!PINGPONG || (BN == 128 && !FP8), "a ping-pong warpgroup holds 128 x 128 (2 x 64 accumulators), bf16");
  static_assert(BN % 64 == 0, "Up stores BN/2 columns in groups of 32 (the quad transpose)");
  static_assert(STAGES >= 3, "a consumer holds two stages (one wgmma group in flight): 3 stages at least");
  static_assert(kSmemBytes <= kSm90SmemPerBlockOptin, "an sm_90 CTA has at most 227 KB of shared memory");
  static_assert(kABytes % kSwizzleAtomBytes == 0 && kBBytes % kSwizzleAtomBytes == 0,
                "every stage must start on a 1024-byte swizzle atom");
  static_assert(kBlockM * kBlockK / 8 == kProducerThreads * 8, "A gather: 8 chunks of 16 B per producer thread");
  static_assert(kProducerRegs * kProducerThreads + kConsumerRegs * kConsumerThreads <= kLaunchRegs * kThreads,
                "setmaxnreg must stay within the registers the CTA was launched with");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0, "setmaxnreg takes multiples of 8");
};

// Whether an instance splits K (Params::k_splits; layout.hpp, k_slice): DownSplitK, the bf16 down
// GEMM whose few column tiles a block (Mixtral: H / 256 = 16) leave the last of a few waves mostly
// idle. Its slices store FP32 partial rows, which combine_partials sums in a fixed order.
template <Mode M, class Cfg>
MK_HD constexpr bool splits_k() {
  static_assert(M != Mode::DownSplitK || !Cfg::kFp8, "the FP8 down GEMM has no split-K");
  return M == Mode::DownSplitK;
}

}  // namespace moekit::kernels::gemm::sm90
