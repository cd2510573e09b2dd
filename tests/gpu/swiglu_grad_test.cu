// swiglu_grad_test.cu — dev::sigmoid_approx (common/swiglu_grad.cuh), the SwiGLU backward's σ(g)
// on the SFU, against σ in fp64 on every one of the 2^32 floats, within the bound derived here.
//
// The bound. e^-g is computed as ex2.approx(fl(g · fl(log2 e))): the constant and the product
// each round once (2^-24 relative), so the exponent is off by at most |g| · log2 e · 2^-23 and e^-g
// by that times ln 2, i.e. |g| · 2^-23 relative; ex2.approx adds at most 2 ulp (2^-22 relative:
// the CUDA guide's bound for the fast exp2), 1 + e^-g rounds once (2^-24) and rcp.approx adds about 1 ulp
// (2^-23). σ = 1 / (1 + e^-g) carries e^-g's relative error times e^-g / (1 + e^-g) <= 1, so
//   |σ̂ / σ − 1| <= |g| · 2^-23 + 2^-22 + 2^-24 + 2^-23 < |g| · 2^-23 + 2^-21.
// Below 2^-125 (g < -86.6) σ̂ may be flushed to 0 (.ftz: a denormal result is 0) or be a tiny
// normal: there the bound is absolute, |σ̂ − σ| <= 2^-125. Limits: σ(-inf) = 0, σ(+inf) = 1, and
// NaN stays NaN. Beside the bf16 outputs' unit roundoff (2^-8) the largest allowed error for the
// g the backward sees (|g| < 64: 2^-17) is nothing (tests/gpu/backward_util.hpp, the bounds).
#include <cmath>
#include <cstdint>
#include <string>

#include "common/swiglu_grad.cuh"
#include "gpu/gpu_util.hpp"

namespace moekit::test {
namespace {

struct SigmoidCounts {
  unsigned long long checked, over_bound, nan_lost;
  uint32_t first_bad_bits;
  float worst_ratio;  // the largest error / bound seen (atomicMax on the bits: both non-negative)
};

__global__ void sigmoid_exhaustive_kernel(SigmoidCounts* out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long checked = 0, over = 0, nan_lost = 0;
  uint32_t first_bad = 0;
  float worst = 0.0f;
  for (uint64_t b = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < (uint64_t(1) << 32); b += stride) {
    const float g = __uint_as_float(uint32_t(b));
    const float got = moekit::dev::sigmoid_approx(g);
    if (isnan(g)) {
      if (!isnan(got)) ++nan_lost, first_bad = uint32_t(b);
      continue;
    }
    // The ftz product flushes a denormal g to 0 first (σ = 1/2): the reference sees what it sees.
    const double gd = (fabsf(g) < 0x1p-126f) ? 0.0 : double(g);
    const double want = 1.0 / (1.0 + exp(-gd));
    double err, bound;
    if (want < 0x1p-125) {
      err = fabs(double(got) - want), bound = 0x1p-125;
    } else {
      err = fabs(double(got) / want - 1.0), bound = fabs(gd) * 0x1p-23 + 0x1p-21;
    }
    ++checked;
    const float ratio = float(err / bound);
    if (!(err <= bound)) ++over, first_bad = uint32_t(b);
    worst = fmaxf(worst, isnan(ratio) ? INFINITY : ratio);
  }
  atomicAdd(&out->checked, checked);
  atomicAdd(&out->over_bound, over);
  atomicAdd(&out->nan_lost, nan_lost);
  if (over + nan_lost) atomicExch(&out->first_bad_bits, first_bad);
  atomicMax(reinterpret_cast<unsigned*>(&out->worst_ratio), __float_as_uint(worst));
}

class SwigluGradTest : public GpuTest {};

TEST_F(SwigluGradTest, SigmoidApproxWithinItsBoundOnEveryFloat) {
  const SigmoidCounts h = device_result<SigmoidCounts>(
      stream, [&](SigmoidCounts* d) { sigmoid_exhaustive_kernel<<<1024, 256, 0, stream>>>(d); });
  // Every float but the NaNs: 2^32 − 2·(2^23 − 1).
  EXPECT_EQ(h.checked, (1ull << 32) - 2 * ((1ull << 23) - 1));
  EXPECT_EQ(h.nan_lost, 0ull) << "a NaN g gave a number; bits 0x" << std::hex << h.first_bad_bits;
  EXPECT_EQ(h.over_bound, 0ull) << "first g over the bound at bits 0x" << std::hex << h.first_bad_bits;
  EXPECT_LE(h.worst_ratio, 1.0f);
  RecordProperty("worst_error_over_bound", std::to_string(h.worst_ratio));
}

}  // namespace
}  // namespace moekit::test
