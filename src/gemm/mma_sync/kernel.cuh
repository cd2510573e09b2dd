// kernel.cuh — the mma.sync expert GEMM (stages 3 and 4 for decode and small batches), composed of
// its parts: DealtSchedule (scheduler.cuh: which items this CTA takes), Loader (loader.cuh: the
// cp.async stream of A and B), Mainloop (mainloop.cuh: ldmatrix + mma per K-tile) and Epilogue
// (epilogue.cuh: SwiGLU, or the routing weight and the store). The contract is gemm/common.cuh's.
// A precision is a set of parts: Bf16Parts here, Fp8Parts (fp8.cuh: the block scales' loads, the
// per-K-tile promotion, act quantized in the up epilogue, and for its narrow up tiles a cluster of
// CTAs per item: Parts::kCluster, launched with that cluster shape).
//
// One loop walks the CTA's K-tile stream through a STAGES-deep ring: step s waits for K-tile s,
// refills the slot that step s - 1 freed with K-tile s + STAGES - 1, and multiplies K-tile s; when
// an item's K-tiles are summed its epilogue runs and the next item starts, while the loader is
// already STAGES - 1 K-tiles into it. Each tile is summed in K order by one CTA, so results are
// bitwise those of a tile-at-a-time loop.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/async_copy.cuh"
#include "common/device.cuh"
#include "gemm/mma_sync/epilogue.cuh"
#include "gemm/mma_sync/loader.cuh"
#include "gemm/mma_sync/mainloop.cuh"
#include "gemm/mma_sync/scheduler.cuh"
#include "gemm/mma_sync/tile.hpp"

namespace moekit::kernels::gemm::mma_sync {

// Epi: the mode's epilogue, or another part for it (UpSaveHEpilogue: Up that also keeps h).
template <Mode M, class Cfg, class Epi = mma_sync::Epilogue<M, Cfg>>
struct Bf16Parts {
  static constexpr int kCluster = 1;
  static constexpr bool kBoundary = false;  // Params::boundary: measured for FP8 only (forward.cu)
  using Sched = DealtSchedule<Cfg>;
  using Loader = mma_sync::Loader<M, Cfg>;
  using Mainloop = mma_sync::Mainloop<M, Cfg>;
  using Epilogue = Epi;
  static constexpr size_t kSmemBytes = Cfg::kSmemBytes;
};

template <Mode M, class Cfg, class Parts>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
expert_gemm_kernel(const Params p) {
  constexpr int BK = Cfg::kBlockK, STAGES = Cfg::kStages;
  // The forward's up -> down boundary (Params::boundary; the FP8 parts only, so the bf16 kernels
  // are the code they were without it): down moves its first item's B rows into L2 before it
  // waits for up, and up lets down launch only once its loader finds its loads all issued, so
  // those rows arrive while up's last K-tiles drain rather than under its stream.
  bool trigger_pending = false;
  if constexpr (Parts::kBoundary) {
    if constexpr (M == Mode::Down)
      if (p.boundary) prefetch_first_b<M, Cfg, typename Parts::Sched>(p, int(threadIdx.x));
    trigger_pending = M == Mode::Up && p.boundary;
  }
  if (trigger_pending)
    dev::pdl_wait();
  else
    dev::pdl_enter();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const typename Parts::Sched sched(p);
  if (!sched.cta_has_items()) return;
  const int64_t k_tiles_total = (p.k_dim + BK - 1) / BK;
  const int tid = int(threadIdx.x);

  typename Parts::Loader loader(p, sched, k_tiles_total, tid);
  const WarpTile<M, Cfg> warp(tid);
  typename Parts::Mainloop mma;
  mma.zero();
  typename Parts::Epilogue epi;

  // The consumer's item: c_left of its K-tiles still to multiply.
  int64_t c_item = sched.first() - sched.stride, c_left = 0;
  bool have_item = false;
  Item c_it{};
  // Steps -(STAGES - 1) .. -1 only fill the ring; step >= 0 multiplies K-tile `step` of the stream.
  for (int64_t step = 1 - STAGES;; ++step) {
    if (step >= 0) {
      while (c_left == 0) {  // the item is summed (or has no K-tiles): store it, take the next
        if (have_item) {
          epi.store(p, mma.acc, c_it, warp, smem_raw);
          mma.zero();
        }
        have_item = true;
        c_item = sched.next(c_item);
        if (sched.done(c_item)) {
          dev::cp_async_wait<0>();
          if constexpr (Parts::kCluster > 1) cooperative_groups::this_cluster().sync();  // peers' last reads of our smem
          return;
        }
        c_it = sched.at(p, c_item);
        int64_t kt0;
        c_left = split_k_tiles(p, c_it.split, k_tiles_total, kt0);
        epi.load(p, c_it.block, warp);
      }
      dev::cp_async_wait<STAGES - 2>();
      __syncthreads();  // K-tile `step` landed for all threads; the slot of step - 1 is free to refill
    }
    loader.load(smem, int((step + STAGES - 1) % STAGES));
    dev::cp_async_commit();
    if constexpr (Parts::kBoundary)
      if (trigger_pending && loader.done()) {  // one step after the step that issued the last loads
        dev::pdl_trigger();
        trigger_pending = false;
      }
    if (step < 0) continue;
    mma.k_tile(smem, int(step % STAGES), warp);
    --c_left;
  }
}

}  // namespace moekit::kernels::gemm::mma_sync
