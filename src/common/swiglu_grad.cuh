// swiglu_grad.cuh — the SwiGLU backward of one element, shared by the backward's D GEMM epilogues
// (mma.sync: backward/ragged.cuh; wgmma: gemm/sm90/epilogue.cuh), so both give the same function
// of the same inputs.
#pragma once

namespace moekit::dev {

// From g and u (h, bf16) and D, with the routing weight w: act = silu(g)·u, and dact = w·D gives
// dg = dact·u·silu'(g), du = dact·silu(g), where silu'(g) = σ(g)·(1 + g·(1 − σ(g))). A very
// negative g has σ = 0 (expf overflows to inf): all three are 0, as in the limit.
// 1 / x, correctly rounded, for x >= 1 (the sigmoid's 1 + e^-g): __frcp_rn's own fast path (the
// approximate reciprocal and one Newton step, exact in the FMA) without its slow path, which ptxas
// makes a subroutine: a call in an epilogue beside 128 live accumulators makes it spill (the
// ping-pong DGrad: 1.2 KB). The slow path serves results below 2^-126 only: x >= 2^126 (inf
// included) gives 0 here where __frcp_rn gives a denormal (g < -87.3: σ(g)·g < 1e-36).
__device__ __forceinline__ float rcp_of_at_least_one(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  r = fmaf(r, fmaf(-x, r, 1.0f), r);
  return x < 0x1p126f ? r : 0.0f;
}

struct SwigluGrad {
  float act, dg, du;
  __device__ __forceinline__ SwigluGrad(float g, float u, float d, float w) {
    const float sig = rcp_of_at_least_one(1.0f + expf(-g));
    const float silu = g * sig;
    act = silu * u;
    const float dact = w * d;
    du = dact * silu;
    dg = dact * u * (sig * (1.0f + g * (1.0f - sig)));
  }
};

}  // namespace moekit::dev
