// fp8_ffn_kernels.cuh — the small kernels of the cuBLASLt FP8 expert-FFN baseline (fp8_blas.cu,
// the only includer): the gather of token rows and scales into cuBLASLt's layouts, the repack of
// weight block scales, SwiGLU with per-row 128-column e4m3 quantization, and the combine; and the
// host side of its check, on the oracle's e4m3 arithmetic (moekit/reference.hpp). In an anonymous
// namespace, as ceilings.cuh.
//
// An expert's slot holds its gathered rows [r0, r0 + rows_pad) (rows_pad: its rows rounded up to a
// multiple of 4); the scales of those rows' 128-column groups sit in cuBLASLt's VEC128 layout for
// B, [L][rows_pad] (row index fastest) from float r0·L on.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "moekit/reference.hpp"

namespace moekit::cli {

namespace {

// The quantization of moekit's FP8 path (docs/design.md, "FP8"): per group of 128 values,
// amax = max |v| (NaN if any v is NaN), a = max(amax, 2^-100), scale = a / 448 (dequantizes),
// q = e4m3_rn_satfinite(v · (448 / a)); IEEE divisions, one rounding for the product (the
// constants are the oracle's, moekit/reference.hpp).

__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// xs_q[r] = x_q[src[r]], 16-byte vectors (H % 16 == 0); zeros where src[r] < 0 (padding rows).
__global__ void gather_fp8_rows_kernel(const uint4* __restrict__ x_q, const int32_t* __restrict__ src,
                                       uint4* __restrict__ xs_q, int64_t rows, int64_t vecs_per_row) {
  const int64_t n = rows * vecs_per_row, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / vecs_per_row, c = i % vecs_per_row;
    xs_q[i] = src[r] >= 0 ? x_q[int64_t(src[r]) * vecs_per_row + c] : make_uint4(0, 0, 0, 0);
  }
}

// x_scale [T, L] (row-major) -> the gathered rows' scales in the slot layout; 0 for padding rows.
// slot[r] = (r0, rows_pad) of the expert slot holding row r.
__global__ void gather_scales_kernel(const float* __restrict__ x_scale, const int32_t* __restrict__ src,
                                     const int2* __restrict__ slot, float* __restrict__ xs_scale, int64_t rows,
                                     int64_t L) {
  const int64_t n = rows * L, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / L, g = i % L;
    const int2 s = slot[r];
    xs_scale[int64_t(s.x) * L + g * s.y + (r - s.x)] = src[r] >= 0 ? x_scale[int64_t(src[r]) * L + g] : 0.0f;
  }
}

// Block scales [P, src_rows, L] -> [P, rows, L4]: rows src_row0 .. src_row0 + rows of each of the
// P matrices, columns L .. L4 zero. BLK128x128's K-major layout with a column stride of L4.
__global__ void repack_block_scales_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t P,
                                           int64_t src_rows, int64_t src_row0, int64_t rows, int64_t L, int64_t L4) {
  const int64_t n = P * rows * L4, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t p = i / (rows * L4), row = (i / L4) % rows, b = i % L4;
    dst[i] = b < L ? src[(p * src_rows + src_row0 + row) * L + b] : 0.0f;
  }
}

// act = silu(gate) ⊙ up of every gathered row, in FP32 from the bf16 gate_up [rows, 2F], quantized
// per 128-column group to act_q [rows, F] e4m3 with its scale in the slot layout. One warp per
// (row, group), 4 columns a lane (F % 16 == 0: a lane's 4 columns are all in range or all out).
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
constexpr int kSwigluThreads = 256;
__global__ void __launch_bounds__(kSwigluThreads)
    swiglu_quant_kernel(const __nv_bfloat16* __restrict__ gate_up, const int2* __restrict__ slot,
                        uint8_t* __restrict__ act_q, float* __restrict__ act_scale, int64_t rows, int64_t F) {
  const int lane = int(threadIdx.x & 31);
  const int64_t L = (F + 127) / 128;
  const int64_t warp = (int64_t(blockIdx.x) * kSwigluThreads + threadIdx.x) / 32;
  if (warp >= rows * L) return;  // the whole warp: `warp` is uniform across it
  const int64_t r = warp / L, g = warp % L, c = g * 128 + int64_t(lane) * 4;
  const bool in = c < F;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (in) {
    const uint2 gv = *reinterpret_cast<const uint2*>(gate_up + r * 2 * F + c);
    const uint2 uv = *reinterpret_cast<const uint2*>(gate_up + r * 2 * F + F + c);
    const __nv_bfloat162* gp = reinterpret_cast<const __nv_bfloat162*>(&gv);
    const __nv_bfloat162* up = reinterpret_cast<const __nv_bfloat162*>(&uv);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 gf = __bfloat1622float2(gp[h]), uf = __bfloat1622float2(up[h]);
      v[2 * h] = silu_mul(gf.x, uf.x);
      v[2 * h + 1] = silu_mul(gf.y, uf.y);
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) amax = max_nan(amax, fabsf(v[q]));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float a = max_nan(amax, ref::kFp8AmaxFloor);
  const float inv = __fdiv_rn(ref::kFp8Max, a), scale = __fdiv_rn(a, ref::kFp8Max);
  if (in) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] * inv, v[1] * inv), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] * inv, v[3] * inv), __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint32_t*>(act_q + r * F + c) = lo | (hi << 16);
  }
  if (lane == 0) {
    const int2 s = slot[r];
    act_scale[int64_t(s.x) * L + g * s.y + (r - s.x)] = scale;
  }
}

// y[t] = Σ_j w[t·k + j] · out[pos[t·k + j]] in FP32, slot order j = 0..k-1, bf16 out.
__global__ void combine_weighted_kernel(const __nv_bfloat16* __restrict__ out, const int32_t* __restrict__ pos,
                                        const float* __restrict__ w, __nv_bfloat16* __restrict__ y, int64_t tokens,
                                        int64_t k, int64_t H) {
  const int64_t n = tokens * H, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = i / H, h = i % H;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += w[t * k + j] * __bfloat162float(out[int64_t(pos[t * k + j]) * H + h]);
    y[i] = __float2bfloat16_rn(acc);
  }
}

// ---- host --------------------------------------------------------------------------------------
// All 256 e4m3 values (ref::e4m3_to_float), for the check's inner loops.
inline const double* e4m3_table() {
  static const std::vector<double> t = [] {
    std::vector<double> v(256);
    for (int q = 0; q < 256; ++q) v[size_t(q)] = ref::e4m3_to_float(ref::fp8(q));
    return v;
  }();
  return t.data();
}

// swiglu_quant_kernel's arithmetic for one row on the host, dequantized: SwiGLU in FP32 as the
// kernel spells it, each 128-column group quantized by ref::quantize_group (moekit's contract).
inline std::vector<double> host_swiglu_quant(const std::vector<float>& gate, const std::vector<float>& up) {
  const int64_t F = int64_t(gate.size());
  std::vector<float> v(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) v[size_t(f)] = gate[size_t(f)] / (1.0f + std::exp(-gate[size_t(f)])) * up[size_t(f)];
  std::vector<double> act(static_cast<size_t>(F));
  std::vector<ref::fp8> q(128);
  for (int64_t g0 = 0; g0 < F; g0 += 128) {
    const int64_t n = std::min<int64_t>(128, F - g0);
    const float scale = ref::quantize_group(v.data() + g0, n, q.data());
    for (int64_t i = 0; i < n; ++i) act[size_t(g0 + i)] = double(ref::e4m3_to_float(q[size_t(i)])) * double(scale);
  }
  return act;
}

}  // namespace

}  // namespace moekit::cli
