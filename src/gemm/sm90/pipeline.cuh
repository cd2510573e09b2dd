// pipeline.cuh — the ring of shared-memory stages of the Hopper expert GEMM and the CTA's
// shared-memory map: where each stage's A and B tiles, their mbarriers and the work-item channel
// live (offsets from geometry.hpp's Config).
//
// Each stage has a "full" mbarrier (the producer's TMA bytes and cp.async copies have landed) and
// an "empty" one (every consumer warp is done reading it). Producer and consumers walk the same
// sequence of k-iterations, tile after tile, so each keeps its own Pipe in step with the other's.
#pragma once

#include <cstdint>

#include "common/async_copy.cuh"
#include "gemm/sm90/geometry.hpp"

namespace moekit::kernels::gemm::sm90 {

// Shared-memory addresses of one CTA (shared window, 1024-byte aligned base).
template <class Cfg>
struct Smem {
  uint32_t base;
  __device__ uint32_t a(uint32_t stage) const { return base + Cfg::kAOffset + stage * Cfg::kABytes; }
  __device__ uint32_t b(uint32_t stage) const { return base + Cfg::kBOffset + stage * Cfg::kBBytes; }
  // FP8: the stage's scales (geometry.hpp: a[kBlockM], then b[2]).
  __device__ uint32_t scales(uint32_t stage) const { return base + Cfg::kScaleOffset + stage * Cfg::kScaleFloats * 4; }
  __device__ uint32_t full(uint32_t stage) const { return base + Cfg::kBarOffset + stage * 8; }
  __device__ uint32_t empty(uint32_t stage) const { return base + Cfg::kBarOffset + (Cfg::kStages + stage) * 8; }
  __device__ uint32_t item_full(uint32_t slot) const { return base + Cfg::kItemBarOffset + slot * 8; }
  __device__ uint32_t item_empty(uint32_t slot) const { return base + Cfg::kItemBarOffset + (kItemSlots + slot) * 8; }
  __device__ uint32_t item_slot(uint32_t slot) const { return base + Cfg::kItemSlotOffset + slot * 8; }
  __device__ uint32_t turn(uint32_t wg) const { return base + Cfg::kTurnBarOffset + wg * 8; }  // ping-pong
};

// The map of the dynamic shared memory: its base rounded up to a 1024-byte swizzle atom
// (Config::kSmemBytes reserves the slack).
template <class Cfg>
__device__ __forceinline__ Smem<Cfg> smem_layout(const unsigned char* smem_raw) {
  return {(dev::smem_addr(smem_raw) + kSwizzleAtomBytes - 1) & ~uint32_t(kSwizzleAtomBytes - 1)};
}

}  // namespace moekit::kernels::gemm::sm90
