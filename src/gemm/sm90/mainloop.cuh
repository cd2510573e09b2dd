// mainloop.cuh — the consumer warpgroups' multiply of the Hopper expert GEMM (warpgroups 0-1, 216
// registers): warpgroup w owns rows [64w, 64w + 64) of the tile and its BN columns; per stage
// 4 x wgmma.m64nBNk16 (A and B from shared memory, f32 accumulators in registers), one group in
// flight while the previous stage is released through its "empty" mbarrier. The K loop itself
// (wgmma_k_loop) is shared with the ping-pong consumers (pingpong.cuh); what a stage issues is
// each caller's.
#pragma once

#include <cstdint>

#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/ptx.cuh"

namespace moekit::kernels::gemm::sm90 {

// A warpgroup with no real row in the tile: only hands the tile's stages back as they fill.
template <class Cfg>
__device__ __forceinline__ void release_stages(const Smem<Cfg>& sm, int32_t k_tiles, Pipe<Cfg::kStages>& pipe,
                                               int lane) {
  for (int32_t kt = 0; kt < k_tiles; ++kt, pipe.advance()) {
    ptx::mbar_wait(sm.full(pipe.stage), pipe.phase);
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(sm.empty(pipe.stage));
  }
}

// The K loop of a consumer warpgroup, whatever it multiplies: per stage, wait for it to fill,
// issue(stage, kt) one group of wgmma on it and commit it, then wait for the previous group and
// hand that stage back (one group in flight). fence() keeps the compiler from moving the
// accumulators across the asynchronous wgmma. after_first_step() runs once the first group is
// issued (the epilogue's loads go there: kernel.cuh), last_stage_full() once the last stage has
// been seen full (a ping-pong warpgroup gives the other its turn there: pingpong.cuh).
template <class Cfg, class Fence, class Issue, class First, class LastFull>
__device__ __forceinline__ void wgmma_k_loop(const Smem<Cfg>& sm, int32_t k_tiles, Pipe<Cfg::kStages>& pipe, int lane,
                                             Fence&& fence, Issue&& issue, First&& after_first_step,
                                             LastFull&& last_stage_full) {
  uint32_t prev_stage = 0;
  for (int32_t kt = 0; kt < k_tiles; ++kt, pipe.advance()) {
    const uint32_t stage = pipe.stage;
    ptx::mbar_wait(sm.full(stage), pipe.phase);
    if (kt == k_tiles - 1) last_stage_full();
    __syncwarp();  // reconverge the lanes before the warpgroup-wide (.aligned) wgmma instructions
    // The A rows landed through cp.async (generic proxy); wgmma reads them through the async proxy.
    ptx::fence_proxy_async_smem();
    fence();
    ptx::wgmma_fence();
    issue(stage, kt);
    ptx::wgmma_commit();
    if (kt > 0) {
      ptx::wgmma_wait<1>();  // the previous stage's group is done: hand that stage back
      fence();
      if (lane == 0) ptx::mbar_arrive(sm.empty(prev_stage));
    } else {
      after_first_step();
    }
    prev_stage = stage;
  }
  ptx::wgmma_wait<0>();
  fence();
  if (lane == 0) ptx::mbar_arrive(sm.empty(prev_stage));
}

// acc = A[64 rows of this warpgroup] · B[BN]ᵀ over the tile's K: per stage 4 x wgmma.m64nBNk16.
// A warpgroup whose rows are all padding (live = false) only releases the stages: the other one
// runs alone, at up to the SM's whole tensor rate, and the tile ends sooner.
// kBNMajor: B is N-major (Dx, the weight gradients: make_desc_mn_sw128, imm-trans-b), its k16
// slices 16 K rows apart; kAMMajor: A is M-major alike (the weight gradients: imm-trans-a).
template <class Cfg, bool kBNMajor = false, bool kAMMajor = false, class Hook>
__device__ __forceinline__ void mma_tile(float (&acc)[Cfg::kAccs], const Smem<Cfg>& sm, uint64_t desc_a0,
                                         uint64_t desc_b0, int32_t k_tiles, Pipe<Cfg::kStages>& pipe, int lane,
                                         bool live, Hook&& after_first_step) {
  static_assert(!kAMMajor || kBNMajor, "an M-major A is wrapped with an N-major B only");
  if (!live) {
    after_first_step();
    release_stages(sm, k_tiles, pipe, lane);
    return;
  }
  auto issue = [&](uint32_t stage, int32_t kt) {
    const uint64_t desc_a = desc_advance(desc_a0, stage * Cfg::kABytes);
    const uint64_t desc_b = desc_advance(desc_b0, stage * Cfg::kBBytes);
#pragma unroll
    for (int kk = 0; kk < kBlockK / kWgmmaK; ++kk) {
      const uint32_t k_bytes = uint32_t(kk * kWgmmaK * 2);  // along the (pre-swizzle) 128-byte row
      const bool accumulate = kt > 0 || kk > 0;              // the tile's first wgmma overwrites
      if constexpr (kBNMajor) {
        static_assert(Cfg::kBlockN == 256, "the N-major B is wrapped for n256");
        const uint32_t a_bytes = kAMMajor ? mn_k16_bytes(kk) : k_bytes;
        ptx::wgmma_m64n256k16<1, kAMMajor ? 1 : 0>(acc, desc_advance(desc_a, a_bytes),
                                                   desc_advance(desc_b, mn_k16_bytes(kk)), accumulate);
      } else if constexpr (Cfg::kBlockN == 256)
        ptx::wgmma_m64n256k16(acc, desc_advance(desc_a, k_bytes), desc_advance(desc_b, k_bytes), accumulate);
      else
        ptx::wgmma_m64n128k16(acc, desc_advance(desc_a, k_bytes), desc_advance(desc_b, k_bytes), accumulate);
    }
  };
  wgmma_k_loop(sm, k_tiles, pipe, lane, [&] { ptx::fence_operands(acc); }, issue, after_first_step, [] {});
}

}  // namespace moekit::kernels::gemm::sm90
