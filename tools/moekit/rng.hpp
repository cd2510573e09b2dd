// rng.hpp — counter-based random numbers: value i of stream s is a pure function of
// (seed, s, i). The GPU fills GB-sized weights in parallel with it (no host copy, no state),
// and the CPU oracle (`moekit check --cpu`) draws its small layer from the same function.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MKCLI_HD __host__ __device__ __forceinline__
#else
#define MKCLI_HD inline
#endif

namespace moekit::cli {

// Streams: one per tensor, so that e.g. x does not change when a weight's size does.
enum RngStream : uint64_t {
  kStreamX = 1,
  kStreamWGate = 2,
  kStreamW13 = 3,
  kStreamW2 = 4,
  kStreamScoreBias = 5,
  kStreamCalibX = 6,   // tokens the --skew calibration routes (never the timed ones)
  kStreamCeiling = 7,  // ceiling buffers (streaming read, dense GEMM)
  kStreamSample = 8,   // which tokens the oracle checks
  kStreamSkew = 9,     // which expert is hot, and the order of the others' loads (and 10: its score draws)
  kStreamDy = 11,      // dy, the gradient `moekit bench --backward` feeds the backward
};

// splitmix64's finaliser: a bijection on 64 bits with full avalanche.
MKCLI_HD uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}

MKCLI_HD uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed * 0x9e3779b97f4a7c15ull + stream) + index * 0xd1b54a32d192ed03ull);
}

// A uniform in [0, 1) with 24 random bits.
MKCLI_HD float hash_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return float(hash3(seed, stream, index) >> 40) * 0x1p-24f;
}

// A standard normal by Box-Muller from the two halves of one hash. u1 is in (0, 1] so the log
// is finite; the result is never NaN or infinite (|z| < 5.8).
MKCLI_HD float hash_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = hash3(seed, stream, index);
  const float u1 = float((h >> 40) + 1) * 0x1p-24f;
  const float u2 = float(h & 0xffffffu) * 0x1p-24f;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647f * u2);
}

}  // namespace moekit::cli
