// hash_fill.hpp — index-hashed random bf16 data, identical on the device and the host.
//
// Model-sized weights (DeepSeek-V3: 22 GB) are generated on the GPU; the host recomputes only
// the slices the oracle needs (the touched experts, the sampled tokens) from the same hash.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/canon.hpp"
#include "common/cuda_check.hpp"
#include "moekit/reference.hpp"

namespace moekit::test {

// Uniform in [-scale·√3, scale·√3): variance scale², never all zeros.
MK_HD uint16_t hash_bf16(uint64_t seed, int64_t i, float scale) {
  uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = float(uint32_t(z >> 40)) - 8388608.0f;  // [-2^23, 2^23), exact
  return canon::float_to_bf16_bits(canon::mul(u, canon::mul(scale, 1.7320508f / 8388608.0f)));
}

#if defined(__CUDACC__)
// static: a header kernel, one copy per test file that fills.
static __global__ void hash_fill_kernel(uint16_t* out, int64_t n, int64_t offset, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = hash_bf16(seed, offset + i, scale);
}
inline void hash_fill_device(void* out, int64_t n, uint64_t seed, float scale, cudaStream_t stream = nullptr) {
  if (n == 0) return;
  hash_fill_kernel<<<4096, 256, 0, stream>>>(static_cast<uint16_t*>(out), n, 0, seed, scale);
  MK_LAUNCH_CHECK("hash_fill_kernel");
}
#endif

// Elements [begin, begin + n) of the same stream, on the host.
inline std::vector<uint16_t> hash_fill_host(int64_t begin, int64_t n, uint64_t seed, float scale) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = hash_bf16(seed, begin + i, scale);
  return v;
}

}  // namespace moekit::test
