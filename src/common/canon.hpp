// canon.hpp — arithmetic shared bit-for-bit by the GPU kernels and the CPU oracle.
//
// The router and combine are tested bitwise against the CPU reference, so every floating-point
// operation they do is spelled out here: explicit round-to-nearest adds/multiplies/FMAs (nvcc
// would otherwise contract a*b+c on the device, g++ might on the host), an exp built from them,
// and the fixed reduction orders (a 32-lane butterfly) both sides follow.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MK_HD __host__ __device__ __forceinline__
#else
#define MK_HD inline
#endif

namespace moekit::canon {

MK_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MK_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MK_HD float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}
MK_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

MK_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
MK_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// bf16 <-> f32 on raw bits (round to nearest even; NaN stays NaN).
MK_HD float bf16_bits_to_float(uint16_t b) { return bits_to_float(uint32_t(b) << 16); }
MK_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// exp(x) in FP32 from the operations above: range reduction by ln2, Cephes' degree-6
// polynomial, exact scaling by 2^n. Within 2 ulp of expf; identical on host and device.
MK_HD float exp(float x) {
  if (x != x) return x;
  if (x > 88.0f) return bits_to_float(0x7f800000u);  // +inf
  if (x < -87.0f) return 0.0f;                       // below FLT_MIN: flush
  const float n = rintf(mul(x, 1.44269504088896341f));
  float r = fma(-n, 0.693359375f, x);
  r = fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fma(p, r, 1.3981999507e-3f);
  p = fma(p, r, 8.3334519073e-3f);
  p = fma(p, r, 4.1665795894e-2f);
  p = fma(p, r, 1.6666665459e-1f);
  p = fma(p, r, 5.0000001201e-1f);
  const float e = add(fma(mul(p, r), r, r), 1.0f);
  const int ni = int(n);  // in [-126, 127] after the clamps above
  return mul(e, bits_to_float(uint32_t(ni + 127) << 23));
}

MK_HD float sigmoid(float x) { return div(1.0f, add(1.0f, exp(-x))); }

// A routing weight as written: a NaN becomes the quiet NaN 0x7fc00000. A NaN's payload is not
// defined across processors (the GPU's arithmetic makes 0x7fffffff, the host's keeps its input's),
// so the weights' bitwise contract names one NaN.
MK_HD float weight_out(float w) { return w != w ? bits_to_float(0x7fc00000u) : w; }

// SwiGLU gate in FP32 (GEMM epilogue; tested by tolerance, so no bitwise contract between the
// processors). The add and the division are explicit so that nvcc cannot contract the add into
// expf's last multiply in one kernel and not in another: dev::silu_group (common/silu.cuh) gives
// these bits without the division's branch.
MK_HD float silu(float x) { return div(x, add(1.0f, expf(-x))); }

// Selection order of the router: a higher score wins; equal scores: the lower expert id wins.
// NaN scores rank below every number, so k distinct experts are always chosen.
MK_HD bool ranks_before(float va, int ea, float vb, int eb) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ea < eb;
}

// The 32-lane butterfly (xor 16, 8, 4, 2, 1) the kernels reduce with, replayed on the host.
inline float tree_sum32(const float (&lane)[32]) {
  float v[32];
  for (int i = 0; i < 32; ++i) v[i] = lane[i];
  for (int off = 16; off >= 1; off >>= 1) {
    float w[32];
    for (int i = 0; i < 32; ++i) w[i] = add(v[i], v[i ^ off]);
    for (int i = 0; i < 32; ++i) v[i] = w[i];
  }
  return v[0];
}

// Router logits x·w_gateᵀ: lane l accumulates the 8-element chunks l, l+32, l+64, ... of H in
// ascending order with FMAs, then the butterfly sums the 32 lane partials.
inline constexpr int kLogitChunk = 8;

}  // namespace moekit::canon
