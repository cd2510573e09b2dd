// ptx.cuh — the Hopper PTX the wgmma expert GEMM (this folder) is built from:
// shared-memory words, mbarriers, cp.async with mbarrier completion, TMA tile loads, wgmma and its
// fences, setmaxnreg.
// Thin wrappers, one instruction each; the protocol that combines them lives in the kernel.
// Needs sm_90a (wgmma, setmaxnreg).
#pragma once

#include <cuda.h>  // CUtensorMap (a plain 128-byte struct; no libcuda symbol is used)

#include <cstdint>

#include "common/async_copy.cuh"

namespace moekit::kernels::gemm::sm90::ptx {

// ---- shared memory words (the work-item channel) --------------------------------------------------
__device__ __forceinline__ void st_shared_u32(uint32_t addr, int32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ int32_t ld_shared_u32(uint32_t addr) {
  int32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_u64(uint32_t addr, uint64_t v) {
  asm volatile("st.shared.b64 [%0], %1;\n" ::"r"(addr), "l"(v) : "memory");
}
// Two consecutive 64-bit words (16-byte aligned): one LDS.128, a broadcast when a warp's lanes
// share addr.
__device__ __forceinline__ void ld_shared_v2_u64(uint32_t addr, uint64_t (&v)[2]) {
  asm volatile("ld.shared.v2.b64 {%0, %1}, [%2];\n" : "=l"(v[0]), "=l"(v[1]) : "r"(addr) : "memory");
}
// Four consecutive 32-bit words (16-byte aligned): one STS.128 / LDS.128 (a broadcast when a warp's
// lanes share addr).
__device__ __forceinline__ void st_shared_v4_u32(uint32_t addr, const int32_t (&v)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}
__device__ __forceinline__ void ld_shared_v4_u32(uint32_t addr, int32_t (&v)[4]) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// Four 8x8 matrices of 16-bit values (stmatrix .x4): register m of lane l holds row l / 4, columns
// 2(l % 4) and +1 of matrix m (an m16n8 accumulator fragment's layout); lanes 8m .. 8m + 7 give
// the addresses of matrix m's rows 0..7 (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// ---- mbarrier ----------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA complete_tx) and the cluster.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// One arrival plus `bytes` of expected transactions (the TMA loads of this phase).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// One test of the phase of parity `parity` (acquire at CTA scope); the hardware may suspend the
// thread for a while before it answers false.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Watchdog of every pipeline wait: a phase that never completes (a wrong arrival or byte count)
// would hang the kernel, and the whole device run with it. No wait of this kernel legitimately
// lasts a second; after kWaitTimeoutNs the kernel traps, and the launch fails with an error.
inline constexpr uint64_t kWaitTimeoutNs = 20ull * 1000 * 1000 * 1000;
// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  uint64_t start = 0;
  for (uint32_t tries = 1;; ++tries) {
    if (mbar_try_wait(bar, parity)) return;
    if ((tries & 1023u) == 0) {
      const uint64_t now = global_timer_ns();
      if (start == 0)
        start = now;
      else if (now - start > kWaitTimeoutNs)
        __trap();
    }
  }
}

// ---- cp.async (16-byte chunks, L2 only: common/async_copy.cuh) -----------------------------------
using dev::cp_async16;
using dev::cp_async4;
using dev::cp_async_wait_all;
// One arrival on `bar` once all of this thread's earlier cp.async have landed. .noinc: the arrival
// counts against the barrier's expected count (the barrier is initialised with it included).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Orders this thread's view of generic-proxy shared-memory writes (cp.async lands through the
// generic proxy) before its later async-proxy accesses (wgmma reads shared memory through it).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- TMA ---------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// 4-D tile load of the map's box at coordinates (c0 innermost) into `dst`; completes `bytes` of
// transactions on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// 4-D tile store of shared memory at `src` (laid out as the map's swizzle) to the map's box at
// coordinates (c0 innermost), in this thread's current bulk async-group; the box's parts outside
// the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int32_t c0, int32_t c1, int32_t c2,
                                             int32_t c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's bulk async-groups still read their shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Waits until at most kPending of this thread's bulk async-groups are incomplete (writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- register reallocation (sm_90a) --------------------------------------------------------------
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- wgmma -------------------------------------------------------------------------------------
// Orders earlier register/shared accesses of the warpgroup before the next wgmma.mma_async.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the asynchronous wgmma.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The wgmma instructions below are spelled out operand by operand (inline PTX has no vector
// operands): the register list as text, one line per 16, and the accumulators by MK_WGMMA_ACC64.
// The 64 accumulator operands d[o] .. d[o + 63] of one wgmma, in register order.
#define MK_WGMMA_ACC8(o)                                                                                         \
  "+f"(d[(o) + 0]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]), "+f"(d[(o) + 5]), \
      "+f"(d[(o) + 6]), "+f"(d[(o) + 7])
#define MK_WGMMA_ACC64(o)                                                                                        \
  MK_WGMMA_ACC8(o), MK_WGMMA_ACC8((o) + 8), MK_WGMMA_ACC8((o) + 16), MK_WGMMA_ACC8((o) + 24),                    \
      MK_WGMMA_ACC8((o) + 32), MK_WGMMA_ACC8((o) + 40), MK_WGMMA_ACC8((o) + 48), MK_WGMMA_ACC8((o) + 56)


// D[64x256] (+)= A[64x16]·B[256x16]ᵀ, both from shared memory, f32 accumulators; B K-major
// (kTransB = 0) or N-major (1: imm-trans-b, the backward's Dx and DGrad GEMMs); A K-major
// (kTransA = 0) or M-major (1: imm-trans-a, the weight gradients, whose K is the sorted rows).
template <int kTransB = 0, int kTransA = 0>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kTransB == 0 || kTransB == 1, "imm-trans-b is 0 or 1");
  static_assert(kTransA == 0 || kTransA == 1, "imm-trans-a is 0 or 1");
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, %128, %129, p, 1, 1, %132, %131;\n}\n"
      : MK_WGMMA_ACC64(0), MK_WGMMA_ACC64(64)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB), "n"(kTransA));
}

// D[64x128] (+)= A[64x16]·B[128x16]ᵀ, both from shared memory, f32 accumulators; A K-major, B
// K-major (kTransB = 0) or N-major (1: the ping-pong DGrad).
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kTransB == 0 || kTransB == 1, "imm-trans-b is 0 or 1");
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : MK_WGMMA_ACC64(0)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB));
}

// D[64x128] (+)= A[64x32]·B[128x32]ᵀ, e4m3 operands from shared memory (K-major, the only layout
// FP8 wgmma takes), f32 accumulators (QGMMA in SASS).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : MK_WGMMA_ACC64(0)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

#undef MK_WGMMA_ACC64
#undef MK_WGMMA_ACC8

}  // namespace moekit::kernels::gemm::sm90::ptx
