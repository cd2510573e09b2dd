// waves.hpp — how many CTAs of the mma.sync expert GEMM's persistent grid take work items (host
// and device: the scheduler calls it with the item count it reads on the device; the CPU tests
// check it on the measured cases).
#pragma once

#include <cstdint>

#include "common/canon.hpp"  // MK_HD

namespace moekit::kernels::gemm::mma_sync {

// Even waves: a decode GEMM streams weights, and the CTAs that are running share the read. When
// the last wave holds a few CTAs (DeepSeek-V3 T=4: 1856 up tiles on 264 CTAs, 8 in the 8th wave)
// they stream alone at their own latency-bound rate; dealt to ceil(items / w) CTAs of w items
// each (232 x 8) no CTA is left alone. But fewer CTAs keep fewer bytes in flight, so this pays
// only when the grid would idle much of its last wave: it is used when the idle CTA-slots of the
// last wave exceed 6% of all w·grid slots. On the H200 (docs/perf/NOTES.md, "Decode GEMM") dealing
// evenly gained 1-7% at every point this picks and lost 0.2-1.5% at the points it leaves.
// Returns the stride of the item loop: the number of CTAs that take items (the rest exit).
MK_HD int64_t wave_stride(int64_t items, int64_t grid) {
  const int64_t waves = (items + grid - 1) / grid;
  const int64_t idle = waves * grid - items;  // CTA-slots of the last wave without an item
  if (waves == 0 || idle * 50 <= 3 * waves * grid) return grid;
  return (items + waves - 1) / waves;
}

}  // namespace moekit::kernels::gemm::mma_sync
