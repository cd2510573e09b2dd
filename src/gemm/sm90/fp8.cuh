// fp8.cuh — the FP8 parts of the Hopper expert GEMM's consumers (docs/design.md, "FP8"): the
// mainloop with FP32 promotion per 128-deep K block, and the up epilogue that quantizes act.
// The producer (producer.cuh, Cfg::kFp8) fills each stage with 128 e4m3 of K per row and the
// stage's block scales; the down epilogue is the bf16 one (epilogue.cuh).
//
// Promotion: the FP8 tensor cores' own accumulation is not full FP32, so each stage's products
// are summed alone (wgmma e4m3, QGMMA) and then added to the FP32 accumulators times
// a_scale(row) · b_scale(block). With 128 accumulators (the 64 x 256 tile of a warpgroup) and 216
// registers there is room for one 64 x 128 sum at a time: a stage is two halves — B rows 0-127
// (Up: gate) and 128-255 (Up: up), each with its own B scale — each multiplied (4 x m64n128k32),
// waited for and promoted. The other consumer warpgroup's wgmma runs while this one promotes.
#pragma once

#include <cstdint>

#include "common/fp8.cuh"
#include "common/silu.cuh"
#include "gemm/common.cuh"
#include "gemm/sm90/epilogue.cuh"  // gate_silus
#include "gemm/sm90/layout.hpp"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/pipeline.cuh"
#include "gemm/sm90/ptx.cuh"

namespace moekit::kernels::gemm::sm90 {

static_assert(kFp8BlockK == dev::kFp8Block, "a stage is one scale block deep");
inline constexpr int kHalfAccs = 64;                          // one m64n128 sum per thread
inline constexpr uint32_t kHalfBBytes = 128 * kRowBytes;      // B rows 128..255 of a stage

// acc = Σ over K blocks of (A·Bᵀ of the block) · a_scale · b_scale, for this warpgroup's 64 rows;
// `rows` are this thread's two tile rows (acc_row of v % 4 = 0 and 2), for their A scales.
// kTmaA: A came by TMA (the async proxy, as B), so no proxy fence is needed before the wgmma.
template <class Cfg, bool kTmaA = false, class Hook>
__device__ __forceinline__ void mma_tile_fp8(float (&acc)[Cfg::kAccs], const Smem<Cfg>& sm, uint64_t desc_a0,
                                             uint64_t desc_b0, int32_t k_tiles, Pipe<Cfg::kStages>& pipe, int lane,
                                             bool live, const int (&rows)[2], Hook&& after_first_step) {
  static_assert(Cfg::kAccs == 2 * kHalfAccs, "two n128 halves");
  if (!live) {
    after_first_step();
    release_stages(sm, k_tiles, pipe, lane);
    return;
  }
#pragma unroll
  for (int i = 0; i < Cfg::kAccs; ++i) acc[i] = 0.0f;
  float part[kHalfAccs];
  for (int32_t kt = 0; kt < k_tiles; ++kt, pipe.advance()) {
    const uint32_t stage = pipe.stage;
    ptx::mbar_wait(sm.full(stage), pipe.phase);
    __syncwarp();
    // A rows that landed through cp.async are read by wgmma through the async proxy.
    if constexpr (!kTmaA) ptx::fence_proxy_async_smem();
    const uint32_t sc = sm.scales(stage);
    const float sa[2] = {ptx::ld_shared_f32(sc + uint32_t(rows[0]) * 4), ptx::ld_shared_f32(sc + uint32_t(rows[1]) * 4)};
    const float sb[2] = {ptx::ld_shared_f32(sc + Cfg::kScaleB * 4), ptx::ld_shared_f32(sc + (Cfg::kScaleB + 1) * 4)};
    const uint64_t desc_a = desc_advance(desc_a0, stage * Cfg::kABytes);
    const uint64_t desc_b = desc_advance(desc_b0, stage * Cfg::kBBytes);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      ptx::fence_operands(part);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / kWgmmaK; ++kk) {
        const uint32_t k_bytes = uint32_t(kk * 32);  // 32 e4m3 per wgmma along the 128-byte row
        ptx::wgmma_m64n128k32_e4m3(part, desc_advance(desc_a, k_bytes),
                                   desc_advance(desc_b, half * kHalfBBytes + k_bytes), kk > 0);
      }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_operands(part);
      if (half == 1) {  // both halves read the stage
        __syncwarp();     // every lane's scale loads of the stage before lane 0 releases it
        if (lane == 0) ptx::mbar_arrive(sm.empty(stage));
      }
      const float s0 = sa[0] * sb[half], s1 = sa[1] * sb[half];
#pragma unroll
      for (int v = 0; v < kHalfAccs; ++v) acc[half * kHalfAccs + v] += part[v] * ((v & 2) ? s1 : s0);
    }
    if (kt == 0) after_first_step();
  }
}

// Up, FP8: act = silu(g)·u in FP32; the tile's 128 act columns are one quantization group per
// row, held by a lane quad (32 each), so the row's amax is a 4-lane reduction. Stored as e4m3,
// 8 bytes per store, with the row's scale at act_scale[row][n_tile].
template <class Cfg>
struct Fp8UpEpilogue {
  static constexpr int kUpBlock0 = Cfg::kBlockN / 16;  // first n8 block of "up"
  static_assert(cols_per_tile(Mode::Up, Cfg::kBlockN) == dev::kFp8Block, "an up tile is one act group wide");
  __device__ __forceinline__ void load_row_data(const Params&, const int32_t (&)[2]) {}
  __device__ __forceinline__ int32_t out_row(int32_t sorted_row, int32_t) const { return sorted_row; }
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[Cfg::kAccs], int h, int32_t id,
                                        int32_t out_row, int32_t n0, int lane) const {
    const int q = lane & 3;
    const bool row_ok = id < p.num_assign;
    float act[32];  // blocks 4g + i (g, i < 4), columns 2q, 2q + 1: act[8g + 2i + c]
    float amax = 0.0f;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      float silu[8];
      gate_silus(acc, g, h, row_ok, silu);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float a = silu[2 * i + c] * acc[epi_acc(g, i, h) + 4 * kUpBlock0 + c];
          act[8 * g + 2 * i + c] = a;
          amax = dev::amax_step(amax, a);
        }
    }
    amax = dev::lanes_amax<4>(amax);
    const dev::Fp8Scale s = dev::fp8_scale(amax);
    uint8_t* out = reinterpret_cast<uint8_t*>(p.out) + int64_t(out_row) * p.n_dim;
    auto shfl = [](uint32_t v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); };
#pragma unroll
    for (int g2 = 0; g2 < 2; ++g2) {
      // Word i: the e4m3 pair of block 4·(2g2) + i (low half) and of block 4·(2g2 + 1) + i (high).
      uint32_t x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int lo = 8 * (2 * g2) + 2 * i, hi = 8 * (2 * g2 + 1) + 2 * i;
        x[i] = uint32_t(dev::pack_e4m3x2(act[lo] * s.inv, act[lo + 1] * s.inv)) |
               (uint32_t(dev::pack_e4m3x2(act[hi] * s.inv, act[hi + 1] * s.inv)) << 16);
      }
      quad_transpose(x, q, shfl);  // lane q: block 8g2 + q (low halves), block 8g2 + 4 + q (high)
      const uint2 lo8 = make_uint2((x[0] & 0xffffu) | (x[1] << 16), (x[2] & 0xffffu) | (x[3] << 16));
      const uint2 hi8 = make_uint2((x[0] >> 16) | (x[1] & 0xffff0000u), (x[2] >> 16) | (x[3] & 0xffff0000u));
      const int32_t n_lo = n0 + 8 * (8 * g2 + q), n_hi = n0 + 8 * (8 * g2 + 4 + q);
      if (row_ok && n_lo < p.n_dim) *reinterpret_cast<uint2*>(out + n_lo) = lo8;
      if (row_ok && n_hi < p.n_dim) *reinterpret_cast<uint2*>(out + n_hi) = hi8;
    }
    constexpr int B = dev::kFp8Block;
    if (row_ok && q == 0) p.out_scale[int64_t(out_row) * ((p.n_dim + B - 1) / B) + n0 / B] = s.scale;
  }
};

}  // namespace moekit::kernels::gemm::sm90
