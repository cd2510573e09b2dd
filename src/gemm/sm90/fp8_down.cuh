// fp8_down.cuh — the FP8 down GEMM of the Hopper prefill path on 128 x 128 tiles, built so that
// the FP32 promotion of each 128-deep K block stays off the tensor pipe's critical path
// (docs/design.md, "FP8"; docs/perf/NOTES.md, "FP8"). Its parts: a TMA producer for both operands
// and a consumer that streams its k-steps through two partial sums; the claimed-item scheduler,
// the ring of stages and the down epilogue are the other kernel's (scheduler.cuh, pipeline.cuh,
// epilogue.cuh).
//
// Why a kernel of its own: the n256 FP8 mainloop (fp8.cuh) has room for one 64-register partial
// sum beside its 128 accumulators, so a warpgroup waits for its own wgmma group before it can
// promote it and issue the next, and the tensor pipe is fed only while the other warpgroup's group
// runs — a tile with one live warpgroup (an expert's last block) gets less than half the pipe. A
// 128-column tile is exactly one B scale block and needs 64 accumulators, which leaves room for
// two 64-register partial sums: k-step j multiplies into part[j % 2] while part[(j - 1) % 2] is
// promoted, so each warpgroup keeps a group in flight. The k-steps run as one stream across the
// CTA's tiles: a tile's epilogue runs while the next tile's first group is in flight.
//
// A is act, whose rows are contiguous in sorted order, so it comes by TMA like B (4-D map of
// [max_rows][F] in 2-byte units): the consumers need no proxy fence per stage (cp.async-written A
// needs one). The producer's 128 threads load the stage's A scales, one row each, by cp.async;
// padding rows get scale 0. Their act rows are never written, so TMA brings whatever is there,
// which reaches only padding outputs, and those are never stored.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "common/device.cuh"  // pdl_enter
#include "gemm/common.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/mainloop.cuh"  // release_stages
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/ptx.cuh"
#include "gemm/sm90/scheduler.cuh"

namespace moekit::kernels::gemm::sm90 {

// Registers after setmaxnreg: the producer holds no gathered row addresses (TMA brings A), so the
// consumers get the 232 that acc[64] + part[2][64] and the epilogue's state need.
// 128·40 + 256·232 = 64,512: the whole launch (geometry.hpp's kLaunchRegs).
inline constexpr int kTmaProducerRegs = 40;
inline constexpr int kStreamConsumerRegs = 232;
static_assert(kTmaProducerRegs * kProducerThreads + kStreamConsumerRegs * kConsumerThreads <= kLaunchRegs * kThreads,
              "setmaxnreg must stay within the registers the CTA was launched with");

// The producer: per stage A (128 rows) and B (128 rows of w2) by TMA, each 128 K-units deep, the
// A scale of row t by thread t and the tile's one B scale by the TMA thread (cp.async, counted by
// the same "full" barrier: 128 cp.async arrivals + the TMA thread's expect_tx).
template <class Cfg>
__device__ __forceinline__ void produce_tma_a(const Params& p, const CUtensorMap* a_map, const CUtensorMap* b_map,
                                              const Smem<Cfg>& sm, int32_t items, int32_t blocks, int32_t k_tiles) {
  const int t = int(threadIdx.x) - kConsumerThreads;  // the tile row whose A scales this thread loads
  const bool tma_thread = t == 0;                     // also claims and publishes the work items
  const int lane = t % 32;
  Pipe<Cfg::kStages> pipe;
  ItemRing ring;
  int32_t next = int32_t(blockIdx.x);
  for (;;) {
    if (tma_thread) publish_item(p, sm, ring, next, items, blocks);
    const int32_t item = take_item(sm, ring, lane).item;
    if (item >= items) break;
    const TileCoord tile = item_to_tile(item, blocks, int32_t(p.n_tiles));
    const int32_t row0 = tile.block * kBlockM, r = row0 + t;
    const bool scale_ok = p.sorted_ids[r] < p.num_assign;
    const float* a_scale_src = p.a_scale + int64_t(r) * k_tiles;  // k_tiles = scale blocks per row
    const int32_t expert = tma_thread ? p.block_expert[tile.block] : 0;
    // The tile's columns are B scale row n_tile of the expert (kBlockN = one 128-row block).
    const float* b_scale_src = p.b_scale + int64_t(expert) * p.b_scale_expert_stride + int64_t(tile.n_tile) * k_tiles;
    const int32_t b_row = tile.n_tile * Cfg::kBlockN;
    for (int32_t kt = 0; kt < k_tiles; ++kt, pipe.advance()) {
      const uint32_t stage = pipe.stage;
      ptx::mbar_wait(sm.empty(stage), pipe.phase ^ 1);  // the consumers released this stage
      const int32_t k0 = kt * kBlockK;
      const uint32_t sc = sm.scales(stage);
      if (tma_thread) {
        // Boxes past max_rows, H or F read zeros and still count their whole bytes.
        ptx::mbar_arrive_expect_tx(sm.full(stage), Cfg::kABytes + Cfg::kBBytes);
        ptx::tma_load_4d(sm.a(stage), a_map, sm.full(stage), k0, row0, 0, 0);
        ptx::tma_load_4d(sm.b(stage), b_map, sm.full(stage), k0, b_row, 0, expert);
        ptx::cp_async4(sc + Cfg::kScaleB * 4, b_scale_src + kt, 4u);
      }
      ptx::cp_async4(sc + uint32_t(t) * 4, scale_ok ? static_cast<const void*>(a_scale_src + kt) : static_cast<const void*>(p.a_scale),
                     scale_ok ? 4u : 0u);
      ptx::cp_async_arrive_noinc(sm.full(stage));
    }
    if (tma_thread) next = claim_item(p.tile_counter);  // its round trip overlaps the last stages
  }
  ptx::cp_async_wait_all();  // leave no copy of this thread in flight when it exits
}

// A consumer warpgroup's multiply of one tile: step kt (one stage) issues its group into
// part[kt % 2]; then the previous step's group (in the other part) is waited for, its stage handed
// back and its sum promoted: acc += part · a_scale(row) · b_scale. The last step is waited for
// alone. Each parity has one issue and one promotion, and every promotion follows a wait that
// covers its group: ptxas can then prove no wgmma register is read early (else it injects waits
// of its own and serializes every group).
template <class Cfg, class Hook>
__device__ __forceinline__ void mma_tile_streamed(float (&acc)[Cfg::kAccs], const Smem<Cfg>& sm, uint64_t desc_a0,
                                                  uint64_t desc_b0, int32_t k_tiles, Pipe<Cfg::kStages>& pipe,
                                                  int lane, const int (&rows)[2], Hook&& after_first_step) {
  constexpr int kN = Cfg::kAccs;
  float part0[kN], part1[kN];
  uint32_t prev_stage = 0;
  float prev_s0 = 0.0f, prev_s1 = 0.0f;
  // Issues step kt into d; returns its row scales · b scale (promoted a step later).
  auto issue = [&](float(&d)[kN], float& s0, float& s1) {
    const uint32_t stage = pipe.stage;
    ptx::mbar_wait(sm.full(stage), pipe.phase);
    __syncwarp();  // reconverge the lanes before the warpgroup-wide (.aligned) wgmma instructions
    const uint32_t sc = sm.scales(stage);
    const float sb = ptx::ld_shared_f32(sc + Cfg::kScaleB * 4);
    s0 = ptx::ld_shared_f32(sc + uint32_t(rows[0]) * 4) * sb;
    s1 = ptx::ld_shared_f32(sc + uint32_t(rows[1]) * 4) * sb;
    const uint64_t desc_a = desc_advance(desc_a0, stage * Cfg::kABytes);
    const uint64_t desc_b = desc_advance(desc_b0, stage * Cfg::kBBytes);
    ptx::wgmma_fence();  // d was last read by a promotion
    // The first wgmma overwrites d and is told so: d's old values (promoted a step ago) are dead.
    ptx::wgmma_m64n128k32_e4m3_overwrite(d, desc_a, desc_b);
#pragma unroll
    for (int kk = 1; kk < kFp8BlockK / 32; ++kk) {
      const uint32_t k_bytes = uint32_t(kk * 32);  // 32 e4m3 per wgmma along the 128-byte row
      ptx::wgmma_m64n128k32_e4m3(d, desc_advance(desc_a, k_bytes), desc_advance(desc_b, k_bytes), true);
    }
    ptx::wgmma_commit();
  };
  // The previous step's group (in d) is done: hand its stage back and promote it.
  auto retire = [&](float(&d)[kN]) {
    ptx::fence_operands(d);
    __syncwarp();  // every lane's scale loads of the stage before lane 0 releases it
    if (lane == 0) ptx::mbar_arrive(sm.empty(prev_stage));
#pragma unroll
    for (int v = 0; v < kN; ++v) acc[v] += d[v] * ((v & 2) ? prev_s1 : prev_s0);
  };
  // Step kt into d, then the previous step (in prev) retired; the scales move down a step.
  auto next = [&](float(&d)[kN], float(&prev)[kN]) {
    float s0, s1;
    const uint32_t stage = pipe.stage;
    issue(d, s0, s1);
    ptx::wgmma_wait<1>();  // the group in prev is done; d's runs on
    retire(prev);
    prev_stage = stage, prev_s0 = s0, prev_s1 = s1;
    pipe.advance();
  };

  prev_stage = pipe.stage;
  issue(part0, prev_s0, prev_s1);
  pipe.advance();
  after_first_step();
  int32_t kt = 1;
  for (; kt + 1 < k_tiles; kt += 2) {
    next(part1, part0);
    next(part0, part1);
  }
  if (kt < k_tiles) {  // k_tiles even: the last step is in part1
    next(part1, part0);
    ptx::wgmma_wait<0>();
    retire(part1);
  } else {
    ptx::wgmma_wait<0>();
    retire(part0);
  }
}

// A consumer warpgroup: rows [64·wg, +64) of every tile the CTA takes — the multiply above, then
// the down epilogue (routing weight, bf16 rows at their assignment). A tile without a real row of
// this warpgroup has its stages handed back only.
template <class Cfg>
__device__ __forceinline__ void consume_streamed(const Params& p, const Smem<Cfg>& sm, int32_t items, int32_t blocks,
                                                 int32_t k_tiles) {
  constexpr Mode M = Mode::Down;
  constexpr int kN = Cfg::kAccs;  // 64: an m64n128 sum per thread
  static_assert(Cfg::kFp8 && Cfg::kBlockN == 128 && kN == 64, "one B scale block per tile, n128 wgmma");
  // Warp-uniform (lane 0's), so the descriptors below live in uniform registers (kernel.cuh).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  const int warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
  const uint64_t desc_a0 = make_desc_k_sw128(sm.a(0) + uint32_t(wg * kWgmmaM * kRowBytes));
  const uint64_t desc_b0 = make_desc_k_sw128(sm.b(0));
  // This thread's two tile rows (acc_row of v % 4 = 0 and 2): their A scales and outputs.
  const int rows[2] = {wg * kWgmmaM + acc_row(warp, lane, 0), wg * kWgmmaM + acc_row(warp, lane, 2)};

  // The tile's row ids: the next tile's are loaded before this one's epilogue, which hides them.
  auto load_ids = [&](int32_t item, int32_t(&ids)[2]) {
    const int32_t row0 = item_to_tile(item, blocks, int32_t(p.n_tiles)).block * kBlockM;
#pragma unroll
    for (int h = 0; h < 2; ++h) ids[h] = p.sorted_ids[row0 + rows[h]];
  };
  Pipe<Cfg::kStages> pipe;
  ItemRing ring;
  Item it = take_item(sm, ring, lane);
  int32_t ids[2] = {0, 0};
  if (it.item < items) load_ids(it.item, ids);
  while (it.item < items) {
    const TileCoord tile = item_to_tile(it.item, blocks, int32_t(p.n_tiles));
    Epilogue<M, Cfg> epi;
    float acc[kN];
    const bool live = (it.live >> wg) & 1;
    if (live) {
#pragma unroll
      for (int i = 0; i < kN; ++i) acc[i] = 0.0f;
      mma_tile_streamed<Cfg>(acc, sm, desc_a0, desc_b0, k_tiles, pipe, lane, rows, [&] { epi.load_row_data(p, ids); });
    } else {
      release_stages(sm, k_tiles, pipe, lane);
    }
    // The next item (published once the producer issued this tile's last loads) and its ids.
    const Item next = take_item(sm, ring, lane);
    int32_t next_ids[2] = {0, 0};
    if (next.item < items) load_ids(next.item, next_ids);
    if (live) {
      const int32_t row0 = tile.block * kBlockM, n0 = tile.n_tile * Cfg::kBlockN;
#pragma unroll
      for (int h = 0; h < 2; ++h) epi.store(p, acc, h, ids[h], epi.out_row(row0 + rows[h], ids[h]), n0, lane);
    }
    it = next;
    ids[0] = next_ids[0], ids[1] = next_ids[1];
  }
}

// The kernel: one CTA per SM, persistent (launch.cu), 3 warpgroups as the other expert GEMM's.
template <Mode M, int BN, int STAGES>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_fp8_expert_gemm_kernel(const Params p, const __grid_constant__ CUtensorMap a_map,
                                const __grid_constant__ CUtensorMap b_map) {
  static_assert(M == Mode::Down && BN == 128, "the streamed FP8 kernel is the 128-column down GEMM");
  using Cfg = Config<BN, STAGES, true>;
  extern __shared__ unsigned char smem_raw[];
  if (threadIdx.x == 0) init_barriers(smem_layout<Cfg>(smem_raw));
  if (threadIdx.x == kConsumerThreads) {
    ptx::tma_prefetch_desc(&a_map);
    ptx::tma_prefetch_desc(&b_map);
  }
  dev::pdl_enter();  // launched with PDL: the routing and A (act) come from predecessors
  __syncthreads();
  // Nothing stays live across setmaxnreg (kernel.cuh): each role reads its work after the switch.
  if (threadIdx.x >= kConsumerThreads) {
    ptx::setmaxnreg_dec<kTmaProducerRegs>();
    const Work w = read_work(p);
    produce_tma_a<Cfg>(p, &a_map, &b_map, smem_layout<Cfg>(smem_raw), w.items, w.blocks, w.k_tiles);
  } else {
    ptx::setmaxnreg_inc<kStreamConsumerRegs>();
    const Work w = read_work(p);
    consume_streamed<Cfg>(p, smem_layout<Cfg>(smem_raw), w.items, w.blocks, w.k_tiles);
  }
}

}  // namespace moekit::kernels::gemm::sm90
