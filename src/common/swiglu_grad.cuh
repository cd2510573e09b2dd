// swiglu_grad.cuh — the SwiGLU backward of one element, shared by the backward's D GEMM epilogues
// (mma.sync: backward/ragged.cuh; wgmma: gemm/sm90/epilogue.cuh), so both give the same function
// of the same inputs.
#pragma once

namespace moekit::dev {

// From g and u (h, bf16) and D, with the routing weight w: act = silu(g)·u, and dact = w·D gives
// dg = dact·u·silu'(g), du = dact·silu(g), where silu'(g) = σ(g)·(1 + g·(1 − σ(g))). A very
// negative g has σ = 0 (expf overflows to inf): all three are 0, as in the limit.
struct SwigluGrad {
  float act, dg, du;
  __device__ __forceinline__ SwigluGrad(float g, float u, float d, float w) {
    const float sig = __frcp_rn(1.0f + expf(-g));
    const float silu = g * sig;
    act = silu * u;
    const float dact = w * d;
    du = dact * silu;
    dg = dact * u * (sig * (1.0f + g * (1.0f - sig)));
  }
};

}  // namespace moekit::dev
