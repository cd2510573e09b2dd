// producer.cuh — the producer warpgroup of the Hopper expert GEMM (warpgroup 2, 64 registers):
// fills the ring of stages for every tile its CTA takes, and claims and publishes those tiles.
//
// B = BN rows of the expert's weights by TMA (one 4-D box: Up takes BN/2 gate rows and the same
// BN/2 up rows; Dx and DGrad, N-major: a box of 64 columns by the 64 K rows per 64 columns). A =
// the tile's 128 rows by cp.async, gathered through sorted_ids (Up: x row a/k, DGrad: dy row a/k;
// Down and Dx: row r in sorted order), padding rows and the K tail zero-filled, written straight into
// the 128-byte swizzle wgmma reads. Each stage's "full" mbarrier completes when the TMA bytes have
// landed and all 128 producer threads' cp.async have (cp.async.mbarrier.arrive.noinc).
// FP8 (Cfg::kFp8): the same bytes (rows of 128 e4m3, addressed in 2-byte units: gemm/params.hpp),
// plus each stage's block scales by 4-byte cp.async in the same arrival: thread (row_in_pass, chunk)
// loads the A scale of its row of pass `chunk` (so the 128 threads cover the 128 rows once), the
// TMA thread the B scales of the tile's two 128-row halves.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/fp8.cuh"
#include "gemm/common.cuh"
#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/ptx.cuh"
#include "gemm/sm90/scheduler.cuh"

namespace moekit::kernels::gemm::sm90 {

// Whether A comes by TMA too: the FP8 down GEMM, whose A (act) rows are contiguous in sorted
// order (the other modes gather A rows by id, which TMA cannot on sm_90). Padding rows of act are
// never written: TMA brings whatever is there, which reaches only padding outputs (rows are
// independent), never stored; their A scales are zeros.
template <Mode M, class Cfg>
__host__ __device__ constexpr bool tma_a() {
  return Cfg::kFp8 && M == Mode::Down;
}

template <Mode M, class Cfg>
__device__ __forceinline__ void produce(const Params& p, const CUtensorMap* b_map, const CUtensorMap* a_map,
                                        const Smem<Cfg>& sm, int32_t items, int32_t blocks, int32_t k_tiles) {
  constexpr int kChunksPerRow = kRowBytes / 16;                           // 8
  constexpr int kRowsPerPass = kProducerThreads / kChunksPerRow;          // 16
  constexpr int kPasses = kBlockM / kRowsPerPass;                         // 8
  // 8 consecutive threads read one row's 128 contiguous bytes: each warp-wide cp.async moves 4
  // whole 128-byte lines.
  const int t = int(threadIdx.x) - kConsumerThreads;
  const int chunk = t % kChunksPerRow, row_in_pass = t / kChunksPerRow;
  const bool tma_thread = t == 0;  // also the thread that claims the work items
  const bool publisher = t < 32;   // the warp that turns them into tiles (scheduler.cuh)
  const int lane = t % 32;

  Pipe<Cfg::kStages> pipe;
  ItemRing ring;
  int32_t next = int32_t(blockIdx.x);  // thread 0: the item to publish next
  for (;;) {
    if (publisher) publish_tile(p, sm, ring, __shfl_sync(0xffffffffu, next, 0), items, blocks, lane);
    const int32_t code = take_item(sm, ring, lane).item;
    if (code >= items) break;
    const TileCoord tile = tile_of(code, int32_t(p.n_tiles));
    const KSlice ks = slice_of<M, Cfg>(p, tile, k_tiles);
    const int32_t row0 = tile.block * kBlockM;
    const int32_t expert = tma_thread ? p.block_expert[tile.block] : 0;
    const int32_t b_row = ks.n_tile * cols_per_tile(M, Cfg::kBlockN);

    // This thread's 8 source rows for the whole K loop (64-bit offsets: ids·H overflows 32 bits).
    const __nv_bfloat16* src[kPasses];
    uint32_t row_ok = 0;
    const float* scale_src = p.a_scale;  // FP8: this thread's A-scale row (index: the K-tile)
    bool scale_ok = false;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int32_t r = row0 + row_in_pass + i * kRowsPerPass;
      const int32_t id = p.sorted_ids[r];
      const bool ok = id < p.num_assign;
      // ids are non-negative int32: 32-bit division (a 64-bit one is a register-hungry call)
      const int32_t src_row = a_by_token(M) ? (ok ? int32_t(uint32_t(id) / uint32_t(p.topk)) : 0) : r;
      src[i] = p.a + int64_t(src_row) * p.k_dim + chunk * 8;
      row_ok |= uint32_t(ok) << i;
      if constexpr (Cfg::kFp8)
        if (i == chunk) {
          scale_ok = ok;
          scale_src = p.a_scale + int64_t(src_row) * k_tiles;  // k_tiles = scale blocks per row
        }
    }
    // FP8, the TMA thread: the B scale rows of the tile's halves (Up: gate's and up's block; Down:
    // blocks 2·n_tile and 2·n_tile + 1, the second past H in a partial last tile).
    const float* b_scale_src[2] = {p.b_scale, p.b_scale};
    bool b_scale_ok[2] = {false, false};
    if constexpr (Cfg::kFp8)
      if (tma_thread) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int32_t blk = M == Mode::Up ? (j == 0 ? 0 : int32_t(p.b_up_block0)) + ks.n_tile : 2 * ks.n_tile + j;
          b_scale_ok[j] = M == Mode::Up || (2 * ks.n_tile + j) * dev::kFp8Block < p.n_dim;
          b_scale_src[j] = p.b_scale + int64_t(expert) * p.b_scale_expert_stride + int64_t(blk) * k_tiles;
        }
      }

    for (int32_t kt = ks.kt0; kt < ks.kt0 + ks.count; ++kt, pipe.advance()) {
      const uint32_t stage = pipe.stage;
      ptx::mbar_wait(sm.empty(stage), pipe.phase ^ 1);  // the consumers released this stage
      const int32_t k0 = kt * kBlockK;
      if (tma_thread) {
        ptx::mbar_arrive_expect_tx(sm.full(stage), Cfg::kBBytes + (tma_a<M, Cfg>() ? Cfg::kABytes : 0u));
        // A box: (k0.., row0.., 0, 0), 128 rows of one stage; rows past max_rows read zeros.
        if constexpr (tma_a<M, Cfg>()) ptx::tma_load_4d(sm.a(stage), a_map, sm.full(stage), k0, row0, 0, 0);
        if constexpr (b_n_major(M)) {
          // N-major B: one box (b_row + 64j.., k0.., 0, expert) of 64 N values by 64 K rows per
          // panel (layout.hpp, mn_tile_offset); N past n_dim and K past k_dim read zeros.
#pragma unroll
          for (int j = 0; j < Cfg::kBlockN / 64; ++j)
            ptx::tma_load_4d(sm.b(stage) + uint32_t(j) * kMnPanelBytes, b_map, sm.full(stage), b_row + 64 * j, k0, 0,
                             expert);
        } else {
          // B box: (k0.., b_row.., half 0.., expert); rows past n_dim and K past k_dim read zeros.
          ptx::tma_load_4d(sm.b(stage), b_map, sm.full(stage), k0, b_row, 0, expert);
        }
      }
      if constexpr (!tma_a<M, Cfg>()) {
        const bool k_ok = k0 + chunk * 8 < p.k_dim;
        const uint32_t dst = sm.a(stage);
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
          const bool ok = k_ok && ((row_ok >> i) & 1u);
          ptx::cp_async16(dst + sw128_offset(uint32_t(row_in_pass + i * kRowsPerPass), uint32_t(chunk)),
                          ok ? static_cast<const void*>(src[i] + k0) : static_cast<const void*>(p.a), ok ? 16u : 0u);
        }
      }
      if constexpr (Cfg::kFp8) {
        const uint32_t sc = sm.scales(stage);
        ptx::cp_async4(sc + uint32_t(row_in_pass + chunk * kRowsPerPass) * 4,
                       scale_ok ? static_cast<const void*>(scale_src + kt) : static_cast<const void*>(p.a_scale),
                       scale_ok ? 4u : 0u);
        if (tma_thread)
#pragma unroll
          for (int j = 0; j < 2; ++j)
            ptx::cp_async4(sc + (Cfg::kScaleB + j) * 4,
                           b_scale_ok[j] ? static_cast<const void*>(b_scale_src[j] + kt) : static_cast<const void*>(p.b_scale),
                           b_scale_ok[j] ? 4u : 0u);
      }
      ptx::cp_async_arrive_noinc(sm.full(stage));
    }
    // The next claim once this tile's loads are issued: its round trip (and the publisher's read
    // of two ids) overlaps the consumers' last stages.
    if (tma_thread) next = claim_item(p.tile_counter);
  }
  ptx::cp_async_wait_all();  // leave no copy of this thread in flight when it exits
}

}  // namespace moekit::kernels::gemm::sm90
