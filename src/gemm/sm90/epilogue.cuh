// epilogue.cuh — what the Hopper expert GEMM's consumers do with a finished tile, per mode, from
// registers: Up — silu(g)·u from the paired gate/up accumulators, stored to act row r (sorted
// order); UpH — g and u as they are, to h row r; UpSaveH — both; Down — times the routing
// weight, stored to y_rows row a = sorted_ids[r]; DownSplitK — the same, as FP32 to the K-slice's
// partials[split][a]; Dx (the backward's dx_rows) — stored as they are to row a; DGrad (the
// backward's D) — the SwiGLU backward. Padding rows and columns past n_dim are never stored.
// Every output element is one thread's fixed-order sum: bitwise deterministic.
//
// A thread holds two rows of the tile (row halves h = 0, 1 of its warp's 16). Four n8 column
// blocks at a time are transposed across the lane quad so each lane stores 8 consecutive columns
// (16 bytes): store_row_groups, shared by both modes; each mode packs its values.
#pragma once

#include <cstdint>

#include "common/device.cuh"  // bf16_lo, bf16_hi
#include "common/silu.cuh"
#include "common/swiglu_grad.cuh"
#include "gemm/common.cuh"
#include "gemm/sm90/layout.hpp"

namespace moekit::kernels::gemm::sm90 {

// One row's output columns [n0, n0 + kOutBlocks·8): pack(g, x) fills x[i] with
// the packed bf16 pair of columns 8(4g + i) + 2q, +1 (q = lane % 4); the transpose and the 16-byte
// stores are here. 64-bit row offset: a·H overflows 32 bits in large prefills.
template <int kOutBlocks, class Pack>
__device__ __forceinline__ void store_row_groups(const Params& p, bool row_ok, int32_t out_row, int32_t n0, int lane,
                                                 Pack&& pack) {
  const int q = lane & 3;
  auto shfl = [](uint32_t v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); };
#pragma unroll
  for (int g = 0; g < kOutBlocks / 4; ++g) {
    uint32_t x[4];
    pack(g, x);
    quad_transpose(x, q, shfl);
    const int32_t n = n0 + epi_store_col(g, q);
    if (row_ok && n < p.n_dim)
      *reinterpret_cast<uint4*>(p.out + int64_t(out_row) * p.n_dim + n) = make_uint4(x[0], x[1], x[2], x[3]);
  }
}

// Split-K's FP32 partial row (the bf16 down GEMM, geometry.hpp: splits_k): columns [n0, n0 +
// kOutBlocks·8) of `row` (partials[split][a]), value(v) of accumulator v of row half h. The
// quad transpose as store_row_groups', once for the even columns and once for the odd, so each
// lane stores its 8 consecutive columns as two 16-byte stores.
template <int kOutBlocks, class Value>
__device__ __forceinline__ void store_partial_row(const Params& p, float* row, bool row_ok, int32_t n0, int h,
                                                  int lane, Value&& value) {
  const int q = lane & 3;
  auto shfl = [](uint32_t v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); };
#pragma unroll
  for (int g = 0; g < kOutBlocks / 4; ++g) {
    uint32_t even[4], odd[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int v = epi_acc(g, i, h);
      even[i] = __float_as_uint(value(v)), odd[i] = __float_as_uint(value(v + 1));
    }
    quad_transpose(even, q, shfl);
    quad_transpose(odd, q, shfl);
    const int32_t n = n0 + epi_store_col(g, q);
    if (row_ok && n < p.n_dim) {
      *reinterpret_cast<uint4*>(row + n) = make_uint4(even[0], odd[0], even[1], odd[1]);
      *reinterpret_cast<uint4*>(row + n + 4) = make_uint4(even[2], odd[2], even[3], odd[3]);
    }
  }
}

// The SiLUs of an Up tile's gate group g in row half h (the 8 gate columns 8(4g + i) + 2q, +1 of
// this lane q), bf16's and FP8's epilogue alike. A padding row (never stored; its sums are exact
// zeros, or stale in a warpgroup with no real row) takes a gate of 1: zero is outside SiLU's fast
// range, and the exact fallback is a branch its whole warp would wait for (common/silu.cuh).
template <int kAccs>
__device__ __forceinline__ void gate_silus(const float (&acc)[kAccs], int g, int h, bool row_ok, float (&silu)[8]) {
  float gate[8];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    gate[2 * i] = row_ok ? acc[epi_acc(g, i, h)] : 1.0f, gate[2 * i + 1] = row_ok ? acc[epi_acc(g, i, h) + 1] : 1.0f;
  dev::silu_group(gate, silu);
}

template <Mode M, class Cfg>
struct Epilogue;

template <class Cfg>
struct Epilogue<Mode::Up, Cfg> {
  static constexpr int kOutBlocks = cols_per_tile(Mode::Up, Cfg::kBlockN) / 8;  // n8 blocks of act columns
  static constexpr int kUpBlock0 = Cfg::kBlockN / 16;                             // first n8 block of "up"
  // Under the tile's first k-step: nothing to load.
  __device__ __forceinline__ void load_row_data(const Params&, const int32_t (&)[2]) {}
  // act row r of the sorted order.
  __device__ __forceinline__ int32_t out_row(int32_t sorted_row, int32_t) const { return sorted_row; }
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[Cfg::kAccs], int h, int32_t id,
                                        int32_t out_row, int32_t n0, int lane) const {
    const bool row_ok = id < p.num_assign;
    store_row_groups<kOutBlocks>(p, row_ok, out_row, n0, lane, [&](int g, uint32_t(&x)[4]) {
      float silu[8];
      gate_silus(acc, g, h, row_ok, silu);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int u = epi_acc(g, i, h) + 4 * kUpBlock0;  // the same column of the up half
        x[i] = pack_bf16x2(silu[2 * i] * acc[u], silu[2 * i + 1] * acc[u + 1]);
      }
    });
  }
};

template <class Cfg>
struct Epilogue<Mode::Down, Cfg> {
  static constexpr int kOutBlocks = cols_per_tile(Mode::Down, Cfg::kBlockN) / 8;
  float weights[2] = {0.0f, 0.0f};  // the routing weights of this thread's two rows
  // Under the tile's first k-step, once the ids are in registers: a load still in flight at the
  // next k-step's proxy fence stalls it, and that fence then runs under ~1k cycles of tensor work.
  __device__ __forceinline__ void load_row_data(const Params& p, const int32_t (&ids)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (ids[h] < p.num_assign) weights[h] = p.topk_weights[ids[h]];
  }
  // y_rows row a = the row's assignment.
  __device__ __forceinline__ int32_t out_row(int32_t, int32_t id) const { return id; }
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[Cfg::kAccs], int h, int32_t id,
                                        int32_t out_row, int32_t n0, int lane) const {
    const float weight = weights[h];
    store_row_groups<kOutBlocks>(p, id < p.num_assign, out_row, n0, lane, [&](int g, uint32_t(&x)[4]) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int v = epi_acc(g, i, h);  // accumulators of block 4g+i, this row half
        x[i] = pack_bf16x2(acc[v] * weight, acc[v + 1] * weight);
      }
    });
  }
};

// DownSplitK (the bf16 down GEMM's split-K): Down's rows and weights, and weight · this K-slice's
// sum as FP32 to partials[split][a] (y_partials), which combine_partials sums in a fixed order.
template <class Cfg>
struct Epilogue<Mode::DownSplitK, Cfg> : Epilogue<Mode::Down, Cfg> {
  // The tile's K-slice, and whether it is past K (no k-step ran: acc holds the last tile's sums,
  // and the slice's partials are zeros). The consumer sets both.
  int32_t split = 0;
  bool empty = false;
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[Cfg::kAccs], int h, int32_t id,
                                        int32_t out_row, int32_t n0, int lane) const {
    const float weight = this->weights[h];
    float* row = p.partials + (int64_t(split) * p.num_assign + out_row) * p.n_dim;
    store_partial_row<Epilogue<Mode::Down, Cfg>::kOutBlocks>(p, row, id < p.num_assign, n0, h, lane,
                                                            [&](int v) { return empty ? 0.0f : acc[v] * weight; });
  }
};

template <class Cfg>
struct Epilogue<Mode::Dx, Cfg> {
  static constexpr int kOutBlocks = cols_per_tile(Mode::Dx, Cfg::kBlockN) / 8;
  __device__ __forceinline__ void load_row_data(const Params&, const int32_t (&)[2]) {}
  // dx_rows row a = the row's assignment.
  __device__ __forceinline__ int32_t out_row(int32_t, int32_t id) const { return id; }
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[Cfg::kAccs], int h, int32_t id,
                                        int32_t out_row, int32_t n0, int lane) const {
    store_row_groups<kOutBlocks>(p, id < p.num_assign, out_row, n0, lane, [&](int g, uint32_t(&x)[4]) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int v = epi_acc(g, i, h);
        x[i] = pack_bf16x2(acc[v], acc[v + 1]);
      }
    });
  }
};

// h = g | u of a sorted row (row stride 2F, n_dim = F): the tile's gate accumulators to the g
// columns [n0, +BN/2) and its up accumulators to the u columns F + [n0, +BN/2), as the quad
// transpose lays them out for 16-byte stores. UpH's whole epilogue, and UpSaveH's after act.
template <int kOutBlocks, class Cfg>
__device__ __forceinline__ void store_h_row(const Params& p, __nv_bfloat16* h, const float (&acc)[Cfg::kAccs], int hh,
                                            int32_t id, int32_t out_row, int32_t n0, int lane) {
  const int q = lane & 3;
  const int64_t F = p.n_dim;
  auto shfl = [](uint32_t v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); };
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // g, then u
    __nv_bfloat16* row = h + int64_t(out_row) * 2 * F + half * F;
#pragma unroll
    for (int g = 0; g < kOutBlocks / 4; ++g) {
      uint32_t x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int v = epi_acc(g, i, hh) + half * 4 * kOutBlocks;  // up's blocks follow gate's
        x[i] = pack_bf16x2(acc[v], acc[v + 1]);
      }
      quad_transpose(x, q, shfl);
      const int64_t n = n0 + epi_store_col(g, q);
      if (id < p.num_assign && n < F) *reinterpret_cast<uint4*>(row + n) = make_uint4(x[0], x[1], x[2], x[3]);
    }
  }
}

// UpH (the backward's recomputed h, n_dim = F): g and u to h = out.
template <class Cfg>
struct Epilogue<Mode::UpH, Cfg> {
  static constexpr int kOutBlocks = cols_per_tile(Mode::UpH, Cfg::kBlockN) / 8;  // n8 blocks of g (and of u)
  __device__ __forceinline__ void load_row_data(const Params&, const int32_t (&)[2]) {}
  __device__ __forceinline__ int32_t out_row(int32_t sorted_row, int32_t) const { return sorted_row; }
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[Cfg::kAccs], int h, int32_t id,
                                        int32_t out_row, int32_t n0, int lane) const {
    store_h_row<kOutBlocks, Cfg>(p, p.out, acc, h, id, out_row, n0, lane);
  }
};

// UpSaveH (the training forward's up GEMM): Up's act to out, then g and u to h_out, from the same
// accumulators — the h the backward would recompute, without its GEMM.
template <class Cfg>
struct Epilogue<Mode::UpSaveH, Cfg> : Epilogue<Mode::Up, Cfg> {
  static constexpr int kOutBlocks = cols_per_tile(Mode::UpSaveH, Cfg::kBlockN) / 8;
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[Cfg::kAccs], int h, int32_t id,
                                        int32_t out_row, int32_t n0, int lane) const {
    Epilogue<Mode::Up, Cfg>::store(p, acc, h, id, out_row, n0, lane);
    store_h_row<kOutBlocks, Cfg>(p, p.h_out, acc, h, id, out_row, n0, lane);
  }
};

// DGrad (the backward's D = dy·W2_e, n_dim = F): per element the SwiGLU backward from h's g and u
// and the routing weight; dh and act_w stored to the sorted row as bf16 pairs, and each row's
// ⟨D, act⟩ over each 64-column group (the thread's 16 columns of the group in order, then its lane
// quad: xor 1, 2) to dw_partials[group][a], as the mma.sync D GEMM sums them.
template <class Cfg>
struct Epilogue<Mode::DGrad, Cfg> {
  static constexpr int kBlocks = Cfg::kBlockN / 8;  // n8 blocks of D columns
  static constexpr int kGroupBlocks = 64 / 8;       // n8 blocks of one ⟨D, act⟩ group
  static_assert(kBlocks % kGroupBlocks == 0, "a tile is whole 64-column groups");
  float weights[2] = {0.0f, 0.0f};
  __device__ __forceinline__ void load_row_data(const Params& p, const int32_t (&ids)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (ids[h] < p.num_assign) weights[h] = p.topk_weights[ids[h]];
  }
  // dh and act_w rows are in sorted order (dw_partials is by assignment).
  __device__ __forceinline__ int32_t out_row(int32_t sorted_row, int32_t) const { return sorted_row; }
  // h, dh and act_w move as 16-byte rows (a lane quad: 64 contiguous bytes, whole sectors): each
  // lane loads the 8 columns [epi_store_col(g, q), +8) of g and of u, the quad transpose (its own
  // inverse) hands every lane the pairs of its accumulators, and the outputs go back the same way
  // (store_row_groups' layout). One ⟨D, act⟩ group's h loads in flight while the group before it
  // is computed: 2 · 32 registers, beside the 128 accumulators.
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[Cfg::kAccs], int h, int32_t id,
                                        int32_t out_row, int32_t n0, int lane) const {
    constexpr int kGroups = kBlocks / kGroupBlocks, kQuads = kGroupBlocks / 4;  // 32-column quads a group
    const bool row_ok = id < p.num_assign;
    const float w = weights[h];
    const int q = lane & 3;
    const int32_t F = int32_t(p.n_dim);
    // The row's pointers once (64-bit row offsets), 32-bit columns after.
    const int64_t row = out_row;
    const __nv_bfloat16* g_row = p.h + row * 2 * F;
    __nv_bfloat16* dg_row = p.dh ? p.dh + row * 2 * F : nullptr;
    __nv_bfloat16* aw_row = p.act_w ? p.act_w + row * F : nullptr;
    auto shfl = [](uint32_t v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); };
    auto load = [&](int g, uint4 (&gv)[kQuads], uint4 (&uv)[kQuads]) {
#pragma unroll
      for (int s = 0; s < kQuads; ++s) {
        const int32_t n = n0 + epi_store_col(kQuads * g + s, q);
        gv[s] = uv[s] = make_uint4(0u, 0u, 0u, 0u);
        if (row_ok && n < F) {
          gv[s] = *reinterpret_cast<const uint4*>(g_row + n);
          uv[s] = *reinterpret_cast<const uint4*>(g_row + F + n);
        }
      }
    };
    // Columns [n, n + 8) of `row` (null: the output is not asked for, nothing stored). The
    // transpose runs whether or not: a shuffle under a branch on dh or act_w being there (uniform,
    // but not provably so) made ptxas keep the whole consumer's loop state in vector registers
    // (the k-loop 190 instructions a stage with 32 R2UR, against 133 with none).
    auto store16 = [&](bool ok, __nv_bfloat16* row, int32_t n, uint32_t (&x)[4]) {
      quad_transpose(x, q, shfl);  // every lane: the shuffles are warp-wide
      if (ok && row != nullptr) *reinterpret_cast<uint4*>(row + n) = make_uint4(x[0], x[1], x[2], x[3]);
    };
    uint4 gv[2][kQuads], uv[2][kQuads];
    load(0, gv[0], uv[0]);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      if (g + 1 < kGroups) load(g + 1, gv[(g + 1) & 1], uv[(g + 1) & 1]);
      float dot = 0.0f;
#pragma unroll
      for (int s = 0; s < kQuads; ++s) {
        const int gq = kQuads * g + s;  // the 32-column quad of store_row_groups
        uint32_t gx[4] = {gv[g & 1][s].x, gv[g & 1][s].y, gv[g & 1][s].z, gv[g & 1][s].w};
        uint32_t ux[4] = {uv[g & 1][s].x, uv[g & 1][s].y, uv[g & 1][s].z, uv[g & 1][s].w};
        quad_transpose(gx, q, shfl);
        quad_transpose(ux, q, shfl);
        uint32_t dg[4], du[4], aw[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int v = epi_acc(gq, i, h);  // columns 8(4gq + i) + 2q, +1 of this row half
          dg[i] = du[i] = aw[i] = 0u;
          if (n0 + 8 * (4 * gq + i) >= F) continue;  // past F: no ⟨D, act⟩ term (F is a multiple of 8)
          const dev::SwigluGrad e0(dev::bf16_lo(gx[i]), dev::bf16_lo(ux[i]), acc[v], w),
              e1(dev::bf16_hi(gx[i]), dev::bf16_hi(ux[i]), acc[v + 1], w);
          dot += acc[v] * e0.act;
          dot += acc[v + 1] * e1.act;
          dg[i] = pack_bf16x2(e0.dg, e1.dg), du[i] = pack_bf16x2(e0.du, e1.du);
          aw[i] = pack_bf16x2(w * e0.act, w * e1.act);
        }
        const int32_t n = n0 + epi_store_col(gq, q);
        const bool ok = row_ok && n < F;
        store16(ok, dg_row, n, dg);
        store16(ok, dg_row, F + n, du);
        store16(ok, aw_row, n, aw);
      }
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      dot += __shfl_xor_sync(0xffffffffu, dot, 2);
      const int32_t group = n0 / 64 + g;
      if (q == 0 && row_ok && group * 64 < F) p.dw_partials[int64_t(group) * p.num_assign + id] = dot;
      // Two groups' h loads live at most: without this the compiler hoists all four groups' loads
      // above the math, next to the 128 accumulators.
      asm volatile("" ::: "memory");
    }
  }
};

}  // namespace moekit::kernels::gemm::sm90
