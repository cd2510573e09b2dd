// mainloop.cuh — the consumer warpgroups' multiply of the Hopper expert GEMM (warpgroups 0-1, 216
// registers): warpgroup w owns rows [64w, 64w + 64) of the tile and its BN columns; per stage
// 4 x wgmma.m64nBNk16 (A and B from shared memory, f32 accumulators in registers), one group in
// flight while the previous stage is released through its "empty" mbarrier.
#pragma once

#include <cstdint>

#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/ptx.cuh"

namespace moekit::kernels::gemm::sm90 {

// acc = A[64 rows of this warpgroup] · B[BN]ᵀ over the whole K of one tile.
// A warpgroup whose rows are all padding (live = false) only releases the stages: the other one
// runs alone, at up to the SM's whole tensor rate, and the tile ends sooner.
// after_first_step() runs once the first k-step's wgmma group is issued (the epilogue's loads go
// there: see kernel.cuh).
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

// kBNMajor: B is N-major (Dx, DGrad, the weight gradients: make_desc_mn_sw128, imm-trans-b), its
// k16 slices 16 K rows apart; kAMMajor: A is M-major alike (the weight gradients: imm-trans-a).
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
  uint32_t prev_stage = 0;
  for (int32_t kt = 0; kt < k_tiles; ++kt, pipe.advance()) {
    const uint32_t stage = pipe.stage;
    ptx::mbar_wait(sm.full(stage), pipe.phase);
    __syncwarp();  // reconverge the lanes before the warpgroup-wide (.aligned) wgmma instructions
    // The A rows landed through cp.async (generic proxy); wgmma reads them through the async proxy.
    ptx::fence_proxy_async_smem();
    ptx::fence_operands(acc);
    ptx::wgmma_fence();
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
    ptx::wgmma_commit();
    if (kt > 0) {
      ptx::wgmma_wait<1>();  // the previous stage's group is done: hand that stage back
      ptx::fence_operands(acc);
      if (lane == 0) ptx::mbar_arrive(sm.empty(prev_stage));
    } else {
      after_first_step();
    }
    prev_stage = stage;
  }
  ptx::wgmma_wait<0>();
  ptx::fence_operands(acc);
  if (lane == 0) ptx::mbar_arrive(sm.empty(prev_stage));
}

}  // namespace moekit::kernels::gemm::sm90
