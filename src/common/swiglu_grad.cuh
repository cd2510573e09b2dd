// swiglu_grad.cuh — the SwiGLU backward of one element, shared by the backward's D GEMM epilogues
// (mma.sync: backward/ragged.cuh; wgmma: gemm/sm90/epilogue.cuh), so both give the same function
// of the same inputs.
#pragma once

namespace moekit::dev {

// From g and u (h, bf16) and D, with the routing weight w: act = silu(g)·u, and dact = w·D gives
// dg = dact·u·silu'(g), du = dact·silu(g), where silu'(g) = σ(g)·(1 + g·(1 − σ(g))). A very
// negative g has σ = 0 (e^-g overflows to inf): all three are 0, as in the limit.
// σ(g) = 1 / (1 + e^-g) on the SFU: e^-g as 2^(-g·log2 e) (ex2.approx.ftz, relative error about
// 2^-22, plus |g|·2^-23 from rounding the constant and the exponent's product) and the reciprocal
// by rcp.approx.ftz (about 1 ulp): within |g|·2^-23 + 2^-21 of σ relative, checked on every float
// (tests/gpu/swiglu_grad_test.cu, which derives it). Two FP32 instructions and two SFU operations
// where expf and a correctly rounded reciprocal took ~13 (the DGrad epilogue runs 128 of these a
// thread a tile, on the issue slots the other warpgroup's mainloop needs); the outputs are rounded
// to bf16 (u = 2^-8), so ~2^-20 of relative error is nothing next to them
// (tests/gpu/backward_util.hpp, the bounds). The limits hold: g -> -inf gives e^-g = inf and σ = 0
// (all three outputs 0), g -> +inf σ = 1, NaN stays NaN.
__device__ __forceinline__ float sigmoid_approx(float g) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return r;
}

struct SwigluGrad {
  float act, dg, du;
  __device__ __forceinline__ SwigluGrad(float g, float u, float d, float w) {
    const float sig = sigmoid_approx(g);
    const float silu = g * sig;
    act = silu * u;
    const float dact = w * d;
    du = dact * silu;
    dg = dact * u * (sig * (1.0f + g * (1.0f - sig)));
  }
};

}  // namespace moekit::dev
