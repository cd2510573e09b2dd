// epilogue.cuh — what the mma.sync expert GEMM does with a finished tile's accumulators, per mode:
//   Up   — SwiGLU: act[r] = silu(gate)·up for the tile's columns, stored in sorted order (row r);
//          UpSaveHEpilogue (the training forward, ForwardPlan::save_h) also stores gate and up as
//          they are to h_out[r] = g | u (row stride 2F);
//   Down — times the routing weight of the row's assignment a, stored at y_rows[a] (bf16), or at
//          partials[split][a] (FP32) when the K dimension is split.
// Padding rows (id = T·k) and columns past n_dim are never stored. Every output element is one
// thread's sum in K order: bitwise deterministic.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/silu.cuh"
#include "gemm/common.cuh"
#include "gemm/mma_sync/mainloop.cuh"
#include "gemm/mma_sync/scheduler.cuh"

namespace moekit::kernels::gemm::mma_sync {

// The sorted ids of this thread's output rows: loaded when the item starts (under its first
// K-tile), so the store does not wait on memory.
template <Mode M, class Cfg>
struct EpilogueRows {
  static constexpr int MI = Cfg::MI, NI = Cfg::NI, BM = Cfg::kBlockM;
  int32_t ids[MI][2];
  __device__ __forceinline__ void load(const Params& p, int64_t block, const WarpTile<M, Cfg>& w) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) ids[i][h] = p.sorted_ids[block * BM + w.row(i, h)];
  }
};

template <Mode M, class Cfg>
struct Epilogue;

template <class Cfg>
struct Epilogue<Mode::Up, Cfg> : EpilogueRows<Mode::Up, Cfg> {
  using Base = EpilogueRows<Mode::Up, Cfg>;
  using Base::ids, Base::MI, Base::NI, Base::BM;
  // The warp's n8 fragments f < NI/2 are gate columns; fragment f + NI/2 holds the same columns of up.
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[MI][NI][4], const Item& it,
                                        const WarpTile<Mode::Up, Cfg>& w, unsigned char*) const {
    const int64_t row0 = it.block * BM;
    const int64_t n0 = it.n_tile * cols_per_tile(Mode::Up, Cfg::kBlockN);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = w.row(i, h);
        const int64_t id = ids[i][h];
        if (id >= p.num_assign) continue;  // padding row
        __nv_bfloat16* out_row = p.out + (row0 + r) * p.n_dim;
#pragma unroll
        for (int f = 0; f < NI / 2; ++f) {
          const int64_t n = n0 + w.wn * (Cfg::TN / 2) + f * 8 + (w.lane & 3) * 2;
          if (n >= p.n_dim) continue;
          const float* g = acc[i][f] + 2 * h;
          const float* u = acc[i][f + NI / 2] + 2 * h;
          const float gate[2] = {g[0], g[1]};
          float silu[2];
          dev::silu_group(gate, silu);  // canon::silu's bits, one range test a pair
          *reinterpret_cast<uint32_t*>(out_row + n) = pack_bf16x2(silu[0] * u[0], silu[1] * u[1]);
        }
      }
  }
};

// Up's part for ForwardPlan::save_h: act as Up stores it, then h = g | u of the same accumulators.
template <class Cfg>
struct UpSaveHEpilogue : Epilogue<Mode::Up, Cfg> {
  using Base = Epilogue<Mode::Up, Cfg>;
  using Base::ids, Base::MI, Base::NI, Base::BM;
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[MI][NI][4], const Item& it,
                                        const WarpTile<Mode::Up, Cfg>& w, unsigned char* smem) const {
    Base::store(p, acc, it, w, smem);
    const int64_t row0 = it.block * BM, F = p.n_dim;
    const int64_t n0 = it.n_tile * cols_per_tile(Mode::Up, Cfg::kBlockN);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (ids[i][h] >= p.num_assign) continue;  // padding row
        __nv_bfloat16* h_row = p.h_out + (row0 + w.row(i, h)) * 2 * F;
#pragma unroll
        for (int f = 0; f < NI / 2; ++f) {
          const int64_t n = n0 + w.wn * (Cfg::TN / 2) + f * 8 + (w.lane & 3) * 2;
          if (n >= F) continue;
          const float* g = acc[i][f] + 2 * h;
          const float* u = acc[i][f + NI / 2] + 2 * h;
          *reinterpret_cast<uint32_t*>(h_row + n) = pack_bf16x2(g[0], g[1]);
          *reinterpret_cast<uint32_t*>(h_row + F + n) = pack_bf16x2(u[0], u[1]);
        }
      }
  }
};

template <class Cfg>
struct Epilogue<Mode::Down, Cfg> : EpilogueRows<Mode::Down, Cfg> {
  using Base = EpilogueRows<Mode::Down, Cfg>;
  using Base::ids, Base::MI, Base::NI;
  __device__ __forceinline__ void store(const Params& p, const float (&acc)[MI][NI][4], const Item& it,
                                        const WarpTile<Mode::Down, Cfg>& w, unsigned char*) const {
    const int64_t n0 = it.n_tile * cols_per_tile(Mode::Down, Cfg::kBlockN);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t id = ids[i][h];
        if (id >= p.num_assign) continue;  // padding row
        const float wt = p.topk_weights[id];
        __nv_bfloat16* out_row = p.out + id * p.n_dim;
        float* partial_row = p.partials ? p.partials + (it.split * p.num_assign + id) * p.n_dim : nullptr;
#pragma unroll
        for (int f = 0; f < NI; ++f) {
          const int64_t n = n0 + w.wn * Cfg::TN + f * 8 + (w.lane & 3) * 2;
          if (n >= p.n_dim) continue;
          const float* c = acc[i][f] + 2 * h;
          if (partial_row)
            *reinterpret_cast<float2*>(partial_row + n) = make_float2(c[0] * wt, c[1] * wt);
          else
            *reinterpret_cast<uint32_t*>(out_row + n) = pack_bf16x2(c[0] * wt, c[1] * wt);
        }
      }
  }
};

}  // namespace moekit::kernels::gemm::mma_sync
