// silu_test.cu — dev::silu_group (common/silu.cuh), the GEMM epilogues' SiLU, against
// canon::silu: every one of the 2^32 floats, bit for bit.
#include <cstdint>

#include "common/canon.hpp"
#include "common/silu.cuh"
#include "gpu/gpu_util.hpp"

namespace moekit::test {
namespace {

struct SiluCounts {
  unsigned long long fast_path, fast_mismatch, group_mismatch;
  uint32_t first_mismatch_bits;
};

// Thread t checks the floats t, t + stride, ... (every bit pattern once): the fast path where
// silu_fast_path_ok holds, and silu_group on groups of 8 (fallback included) everywhere.
__global__ void silu_exhaustive_kernel(SiluCounts* out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long fast = 0, fast_bad = 0, group_bad = 0;
  uint32_t first_bad = 0;
  for (uint64_t b0 = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; b0 < (uint64_t(1) << 32); b0 += 8 * stride) {
    float x[8], got[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint64_t b = b0 + i * stride;
      x[i] = __uint_as_float(uint32_t(b < (uint64_t(1) << 32) ? b : 0));
    }
    moekit::dev::silu_group(x, got);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t want = __float_as_uint(canon::silu(x[i]));
      if (__float_as_uint(got[i]) != want) ++group_bad, first_bad = __float_as_uint(x[i]);
      if (moekit::dev::silu_fast_path_ok(x[i])) {
        ++fast;
        if (__float_as_uint(moekit::dev::silu_fast_path(x[i])) != want) ++fast_bad, first_bad = __float_as_uint(x[i]);
      }
    }
  }
  atomicAdd(&out->fast_path, fast);
  atomicAdd(&out->fast_mismatch, fast_bad);
  atomicAdd(&out->group_mismatch, group_bad);
  if (fast_bad + group_bad) atomicExch(&out->first_mismatch_bits, first_bad);
}

class GpuSilu : public GpuTest {};

TEST_F(GpuSilu, FastPathIsBitwiseCanonOnEveryFloat) {
  const SiluCounts h =
      device_result<SiluCounts>(stream, [&](SiluCounts* d) { silu_exhaustive_kernel<<<1024, 256, 0, stream>>>(d); });
  // |x| in [2^-64, 64], both signs: exponents 63 .. 132, 70 of them, 2^23 mantissas each, plus 64
  // itself (the two +-64 patterns are counted with exponent 133's first mantissa).
  const unsigned long long want_fast = 2ull * (70ull << 23) + 2;
  EXPECT_EQ(h.fast_path, want_fast) << "the range test covers the wrong floats";
  EXPECT_EQ(h.fast_mismatch, 0ull) << "first mismatch at bits 0x" << std::hex << h.first_mismatch_bits;
  EXPECT_EQ(h.group_mismatch, 0ull) << "first mismatch at bits 0x" << std::hex << h.first_mismatch_bits;
}

}  // namespace
}  // namespace moekit::test
