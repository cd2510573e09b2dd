// fast_div.hpp — unsigned division by a divisor fixed for a whole launch (a layer's top-k): a
// multiply-high, an add and a shift (Granlund and Montgomery's round-up method), where nvcc's
// division by a value it cannot see is ~20 instructions with a reciprocal on the SFU. Exact for
// every dividend n < 2^31 and divisor 1 <= d < 2^31 (moekit divides int32 ids >= 0): with
// l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1 < 2^32, n / d = (mulhi(n, m) + n) >> l,
// and mulhi(n, m) <= n keeps the sum below 2^32. The host makes it (a 64-bit division); the
// device only divides.
#pragma once

#include <cstdint>

#include "common/canon.hpp"  // MK_HD

namespace moekit::dev {

struct FastDivU32 {
  uint32_t magic = 1, shift = 0;  // d = 1

  FastDivU32() = default;
  explicit FastDivU32(uint32_t d) {
    while ((uint64_t(1) << shift) < d) ++shift;
    magic = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d) / d + 1);
  }
  MK_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

}  // namespace moekit::dev
