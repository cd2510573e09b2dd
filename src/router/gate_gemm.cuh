// gate_gemm.cuh — router logits x·w_gateᵀ on the tensor cores, for a bf16 w_gate: mma.sync
// m16n8k16, exact bf16 products, FP32 accumulation.
//
// One logit's summation order is fixed by H alone, never by T or the tile instance:
//   - H is cut into kGateSlices slices of gate_slice_width(H) columns (a multiple of 32);
//   - within a slice, 32-column steps go round-robin to kGateWarps warps (step s to warp
//     s % kGateWarps), each warp accumulating its steps in ascending order on the tensor cores;
//   - the warp partials are added in warp order, then the slice partials in slice order.
// So logits are deterministic and batch-invariant (a token's logits do not depend on the other
// tokens of the batch). They are not the CPU oracle's FP32 order: tests bound the difference,
// and the selection from them (router_kernel) is bitwise the oracle's selection from them.
//
// Work: a cluster of kGateSlices CTAs owns MT·16 tokens × NT·8 experts; CTA r of the cluster
// computes slice r, and the slice partials meet through distributed shared memory. Decode
// (T ≤ 16) spreads w_gate over E/8 × 8 CTAs, each with all its loads in flight at once; prefill
// tiles are larger so x and w_gate are re-read from L2 less often.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/async_copy.cuh"
#include "common/device.cuh"

namespace moekit::kernels::router {

constexpr int kGateSlices = 8;  // CTAs per cluster, one H slice each
constexpr int kGateWarps = 8;   // warps per CTA
constexpr int kGateStep = 32;   // columns of one warp step: 8 per lane of a quad (one 16-byte load)

// Columns of each slice: ceil(H / slices), rounded up to whole steps.
__host__ __device__ constexpr int64_t gate_slice_width(int64_t hidden) {
  return (hidden + int64_t(kGateSlices) * kGateStep - 1) / (int64_t(kGateSlices) * kGateStep) * kGateStep;
}

// Slice r of H: columns [begin, end) in steps(r) steps of 32 (the last one partial); slices past
// the end of H have none (begin and end are then meaningless).
struct GateSlicing {
  int64_t hidden, width;
  __device__ explicit GateSlicing(int64_t h) : hidden(h), width(gate_slice_width(h)) {}
  __device__ int64_t begin(int slice) const { return int64_t(slice) * width; }
  __device__ int64_t end(int slice) const { return min(hidden, begin(slice) + width); }
  __device__ int64_t steps(int slice) const {
    return end(slice) > begin(slice) ? (end(slice) - begin(slice) + kGateStep - 1) / kGateStep : 0;
  }
};

struct GateParams {
  const __nv_bfloat16* x;       // [T, H]
  const __nv_bfloat16* w_gate;  // [E, H]
  float* logits;                // [T, E]
  int64_t tokens, hidden;
  int experts;
};

// Loads go through shared memory with cp.async (common/async_copy.cuh): every load of a batch is
// issued before any is waited for (register loads issued in order behind an MMA would wait for
// the MMA's operands: one memory round trip per MMA group instead of one per batch). Out-of-range
// chunks are zero-filled (source size 0).

// u32 j (0..3) of a 16-byte vector.
__device__ __forceinline__ uint32_t word(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }
// Half j of a step (a lane's columns 4j..4j+3 of its 8) as one m16n8k16 MMA: x rows g and g + 8
// (x_lo, x_hi) against w_gate row g, the same k slots on both sides (warp_slice_partial).
__device__ __forceinline__ void mma_step_half(float (&acc)[4], const uint4& x_lo, const uint4& x_hi, const uint4& w,
                                              int j) {
  const uint32_t a[4] = {word(x_lo, 2 * j), word(x_hi, 2 * j), word(x_lo, 2 * j + 1), word(x_hi, 2 * j + 1)};
  dev::mma_bf16(acc, a, word(w, 2 * j), word(w, 2 * j + 1));
}

// Dynamic shared memory of an instance: the per-warp load staging, which the warp partials
// reuse after the main loop. MT: 16-token row tiles per CTA; NT: 8-expert column tiles.
template <int MT, int NT>
struct GateTile {
  static constexpr int kRows = MT * 16, kCols = NT * 8;
  // Steps a warp keeps in flight (loads issued together, then the MMAs): decode tiles are bound
  // by load latency, larger tiles by registers.
  static constexpr int kUnroll = MT * NT == 1 ? 4 : 2;
  static constexpr int kChunks = NT + 2 * MT;                           // 16-byte loads per lane per step
  static constexpr int kStageBytes = kUnroll * kChunks * 32 * 16;       // per warp
  static constexpr int kPartialBytes = kRows * kCols * 4;               // per warp
  static constexpr int kWarpBytes = kStageBytes > kPartialBytes ? kStageBytes : kPartialBytes;
  static constexpr int kSmemBytes = kGateWarps * kWarpBytes;
};

// This warp's partial of one slice for the CTA's tile (tokens t0.., experts e0..), written to
// its own part of `smem` as [kRows][kCols] floats: its steps s = warp, warp + kGateWarps, ... of
// the slice, in ascending order. The first call issues its first w_gate loads before the PDL
// wait: x may be the previous kernel's output, w_gate must not be. That holds for every moekit
// kernel (none writes a weight) and for any kernel that does not trigger its dependents early
// (griddepcontrol.launch_dependents): such a kernel completes before this one starts. A caller
// whose own PDL kernel writes w_gate right before route() must put a plain launch or an event
// between them.
template <int MT, int NT>
__device__ __forceinline__ void warp_slice_partial(const GateParams& p, int slice, int e0, int64_t t0,
                                                   unsigned char* smem, bool& waited) {
  using Tile = GateTile<MT, NT>;
  constexpr int kCols = Tile::kCols, kUnroll = Tile::kUnroll;
  const int warp = int(threadIdx.x >> 5), lane = dev::lane_id();
  const int g = lane >> 2, q = lane & 3;  // the mma fragment's row group and quad lane
  unsigned char* my_smem = smem + warp * Tile::kWarpBytes;
  // Staging: [u][chunk][lane] 16-byte slots; chunk nt (w rows) then NT + 2*mt + h (x rows).
  const uint32_t stage = uint32_t(__cvta_generic_to_shared(my_smem));
  auto slot = [&](int u, int chunk) { return stage + uint32_t(((u * Tile::kChunks + chunk) * 32 + lane) * 16); };
  const int64_t H = p.hidden;
  const GateSlicing sl(H);
  const int64_t k_begin = sl.begin(slice), k_end = sl.end(slice), steps = sl.steps(slice);

  // Rows this lane loads: tokens t0 + mt*16 + g (+8), experts e0 + nt*8 + g.
  const __nv_bfloat16* xr[MT][2];
  bool xok[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = t0 + mt * 16 + g + 8 * h;
      xok[mt][h] = t < p.tokens;
      xr[mt][h] = p.x + (xok[mt][h] ? t : 0) * H + q * 8;
    }
  const __nv_bfloat16* wr[NT];
  bool wok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int e = e0 + nt * 8 + g;
    wok[nt] = e < p.experts;
    wr[nt] = p.w_gate + int64_t(wok[nt] ? e : 0) * H + q * 8;
  }

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  for (int64_t s0 = warp; s0 < steps; s0 += int64_t(kGateWarps) * kUnroll) {
    __syncwarp();  // the previous batch's slots have been read by every lane
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k_begin + (s0 + int64_t(u) * kGateWarps) * kGateStep + q * 8;
      const bool in = s0 + int64_t(u) * kGateWarps < steps && k < k_end;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) dev::cp_async16(slot(u, nt), wr[nt] + (k - q * 8), in && wok[nt] ? 16u : 0u);
    }
    if (!waited) {
      dev::pdl_enter();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k_begin + (s0 + int64_t(u) * kGateWarps) * kGateStep + q * 8;
      const bool in = s0 + int64_t(u) * kGateWarps < steps && k < k_end;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) dev::cp_async16(slot(u, NT + 2 * mt + h), xr[mt][h] + (k - q * 8), in && xok[mt][h] ? 16u : 0u);
    }
    dev::cp_async_wait_all();  // each lane reads back only its own slots
    // A lane's 8 columns feed two k16 MMAs: columns 0-3 are the fragment's k slots {2q, 2q+1,
    // 2q+8, 2q+9} of the first, columns 4-7 of the second. A and B use the same assignment, so
    // each MMA still pairs x[t][c] with w[e][c].
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      uint4 wv[NT], xv[MT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) wv[nt] = *reinterpret_cast<const uint4*>(my_smem + (slot(u, nt) - stage));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          xv[mt][h] = *reinterpret_cast<const uint4*>(my_smem + (slot(u, NT + 2 * mt + h) - stage));
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_step_half(acc[mt][nt], xv[mt][0], xv[mt][1], wv[nt], j);
    }
  }
  __syncwarp();  // staging reads done before the partial overwrites it

  // C fragment: c0,c1 row g cols 2q,2q+1; c2,c3 row g+8.
  float (*part)[kCols] = reinterpret_cast<float (*)[kCols]>(my_smem);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = mt * 16 + g, c = nt * 8 + 2 * q;
      part[r][c] = acc[mt][nt][0];
      part[r][c + 1] = acc[mt][nt][1];
      part[r + 8][c] = acc[mt][nt][2];
      part[r + 8][c + 1] = acc[mt][nt][3];
    }
}

// Element i of the tile summed over the warp partials, in warp order (after a __syncthreads).
template <int MT, int NT>
__device__ __forceinline__ float sum_warp_partials(const unsigned char* smem, int i) {
  using Tile = GateTile<MT, NT>;
  float v = reinterpret_cast<const float*>(smem)[i];
#pragma unroll
  for (int w = 1; w < kGateWarps; ++w) v = canon::add(v, reinterpret_cast<const float*>(smem + w * Tile::kWarpBytes)[i]);
  return v;
}

// Decode: a cluster of kGateSlices CTAs per tile, CTA r computing slice r; the slice partials
// meet in distributed shared memory. Many CTAs, each with one batch of loads in flight.
template <int MT, int NT>
__global__ void __cluster_dims__(kGateSlices, 1, 1) __launch_bounds__(32 * kGateWarps)
    gate_logits_kernel(GateParams p) {
  namespace cg = cooperative_groups;
  using Tile = GateTile<MT, NT>;
  constexpr int kRows = Tile::kRows, kCols = Tile::kCols;
  extern __shared__ __align__(16) unsigned char gate_smem[];
  __shared__ float s_slice[kRows * kCols];  // this slice's partial, read by the cluster
  const int slice = int(blockIdx.x % kGateSlices);
  const int e0 = int(blockIdx.x / kGateSlices) * kCols;
  const int64_t t0 = int64_t(blockIdx.y) * kRows;

  bool waited = false;
  warp_slice_partial<MT, NT>(p, slice, e0, t0, gate_smem, waited);
  if (!waited) dev::pdl_enter();
  __syncthreads();
  for (int i = int(threadIdx.x); i < kRows * kCols; i += 32 * kGateWarps) s_slice[i] = sum_warp_partials<MT, NT>(gate_smem, i);

  // Slice partials, in slice order: CTA r of the cluster sums and stores every kGateSlices-th
  // block of the tile's elements, reading the other CTAs' s_slice.
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const unsigned rank = cluster.block_rank();
  for (int i = int(rank) * 32 * kGateWarps + int(threadIdx.x); i < kRows * kCols; i += kGateSlices * 32 * kGateWarps) {
    const int64_t t = t0 + i / kCols;
    const int e = e0 + i % kCols;
    float v = *cluster.map_shared_rank(&s_slice[i], 0);
#pragma unroll
    for (int sl = 1; sl < kGateSlices; ++sl) v = canon::add(v, *cluster.map_shared_rank(&s_slice[i], sl));
    if (t < p.tokens && e < p.experts) p.logits[t * p.experts + e] = v;
  }
  cluster.sync();  // no CTA leaves while another still reads its s_slice
}

// Prefill: one CTA per tile walks the slices itself, adding each slice's partial into a running
// sum in slice order: bitwise the cluster kernel's logits, without a cluster's launch and
// exchange per few hundred MMAs (at T = 16384 the cluster kernel ran 32768 CTAs).
template <int MT, int NT>
__global__ void __launch_bounds__(32 * kGateWarps) gate_logits_looped_kernel(GateParams p) {
  using Tile = GateTile<MT, NT>;
  constexpr int kRows = Tile::kRows, kCols = Tile::kCols;
  extern __shared__ __align__(16) unsigned char gate_smem[];
  __shared__ float s_sum[kRows * kCols];
  const int e0 = int(blockIdx.x) * kCols;
  const int64_t t0 = int64_t(blockIdx.y) * kRows;

  bool waited = false;
  for (int slice = 0; slice < kGateSlices; ++slice) {
    warp_slice_partial<MT, NT>(p, slice, e0, t0, gate_smem, waited);
    __syncthreads();
    for (int i = int(threadIdx.x); i < kRows * kCols; i += 32 * kGateWarps) {
      const float v = sum_warp_partials<MT, NT>(gate_smem, i);
      s_sum[i] = slice == 0 ? v : canon::add(s_sum[i], v);
    }
    __syncthreads();  // the partials are read before the next slice's loads overwrite them
  }
  if (!waited) dev::pdl_enter();
  for (int i = int(threadIdx.x); i < kRows * kCols; i += 32 * kGateWarps) {
    const int64_t t = t0 + i / kCols;
    const int e = e0 + i % kCols;
    if (t < p.tokens && e < p.experts) p.logits[t * p.experts + e] = s_sum[i];
  }
}

// ---- Prefill with many experts: a pipelined CTA per 128 x 64 tile ---------------------------------
// The looped kernel keeps the order's structure in its threads (warp w sums the steps s ≡ w mod
// kGateWarps of every slice, for a 64 x 32 tile): each CTA waits for 16 serial batches of loads at
// one CTA per SM, and x and w_gate are re-read from L2 for every 64 x 32 tile (ncu, DeepSeek-V3
// T=16384: 717 µs, 2.8 GB through L2, no eligible warp 70% of cycles).
//
// This kernel computes the same sums in the same order with the order's roles unrolled in time:
// every warp computes, for its own 32 x 32 outputs, the warp partials one after another —
//   for slice r: for w in 0..7: P = Σ_{s ≡ w (mod 8), ascending} (two k16 MMAs per step, as
//   above); V = w == 0 ? P : V + P;   then S = r == 0 ? V : S + V
// which is bitwise the looped and cluster kernels' logits (same MMAs on the same operands, the
// same additions in the same order). The CTA streams the steps in exactly that order through a
// ring of STAGES stages of G steps (32 columns of 128 x rows and 64 w_gate rows each), shared by
// its 8 warps (4 x 2 of them over the tile): one barrier per stage. The order's columns are a
// table in shared memory, written once per CTA, so a step's loads cost a table read.
// ncu (DeepSeek-V3 T=16384): with 2 warps per scheduler the kernel is bound by instruction issue
// (0.44 issued per cycle, tensor pipe ~19% active): 16 MMAs per warp and step against the
// loads' and the order's bookkeeping; 3 accumulator sets (P, V, S) keep the warp tile at 32 x 32.
constexpr int kGatePipeRows = 128, kGatePipeCols = 64;  // tokens x experts per CTA
constexpr int kGatePipeStepBytes = (kGatePipeRows + kGatePipeCols) * kGateStep * 2;  // 12 KB
template <int G, int STAGES>
struct GatePipe {
  static constexpr int kStageBytes = G * kGatePipeStepBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;  // then the table of the steps' columns
  static_assert(STAGES >= 3 && kSmemBytes <= 200 * 1024, "a ring of at least 3 stages that fits shared memory");
};
// Entries of the step table for H: at most ceil(H / 32) steps plus one partial step per slice.
__host__ __device__ constexpr int64_t gate_step_table_entries(int64_t hidden) {
  return (hidden + kGateStep - 1) / kGateStep + kGateSlices;
}

// Steps of role w in a slice of `steps` steps.
__device__ __forceinline__ int64_t gate_role_steps(int64_t steps, int w) {
  return steps > w ? (steps - w + kGateWarps - 1) / kGateWarps : 0;
}

template <int G, int STAGES>
__global__ void __launch_bounds__(32 * kGateWarps, 1) gate_logits_pipelined_kernel(GateParams p) {
  using Pipe = GatePipe<G, STAGES>;
  extern __shared__ __align__(128) unsigned char gate_smem[];
  constexpr int kXBytes = kGatePipeRows * kGateStep * 2;  // [128][32] bf16 per step, then w [64][32]
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  const int wm = warp % 4, wn = warp / 4;  // this warp's 32 x 32 of the tile
  const int e0 = int(blockIdx.x) * kGatePipeCols;
  const int64_t t0 = int64_t(blockIdx.y) * kGatePipeRows;
  const int64_t H = p.hidden;
  const uint32_t smem0 = dev::smem_addr(gate_smem);

  // This thread's 3 chunks of every step: 512 x chunks (row id/4, chunk id%4), then 256 w chunks.
  const __nv_bfloat16* src[3];
  bool row_ok[3];
  uint32_t dst[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const int id = tid + i * 32 * kGateWarps;
    const int c = id & 3;
    if (id < kGatePipeRows * 4) {
      const int64_t t = t0 + id / 4;
      row_ok[i] = t < p.tokens;
      src[i] = p.x + (row_ok[i] ? t : 0) * H + c * 8;
      dst[i] = uint32_t((id / 4) * kGateStep * 2 + c * 16);
    } else {
      const int e = e0 + (id - kGatePipeRows * 4) / 4;
      row_ok[i] = e < p.experts;
      src[i] = p.w_gate + int64_t(row_ok[i] ? e : 0) * H + c * 8;
      dst[i] = uint32_t(kXBytes + ((id - kGatePipeRows * 4) / 4) * kGateStep * 2 + c * 16);
    }
  }
  // The step table: entry n = the column where the n-th step of the order starts, and its slice's
  // end. Thread r < 8 writes slice r's steps: roles w in order, s = w, w + 8, ... .
  const GateSlicing sl(H);
  int32_t* s_k = reinterpret_cast<int32_t*>(gate_smem + Pipe::kSmemBytes);
  int32_t* s_end = s_k + gate_step_table_entries(H);
  int64_t total = 0;
  for (int r = 0; r < kGateSlices; ++r) total += sl.steps(r);
  if (tid < kGateSlices) {
    int64_t n = 0;
    for (int r = 0; r < tid; ++r) n += sl.steps(r);
    const int64_t steps = sl.steps(tid), b = sl.begin(tid);
    for (int w = 0; w < kGateWarps; ++w)
      for (int64_t st = w; st < steps; st += kGateWarps, ++n) {
        s_k[n] = int32_t(b + st * kGateStep);
        s_end[n] = int32_t(sl.end(tid));
      }
  }
  __syncthreads();
  int64_t n_load = 0;
  auto load_stage = [&](int slot) {
#pragma unroll
    for (int u = 0; u < G; ++u) {
      if (n_load >= total) break;
      const int64_t k = s_k[n_load], k_end = s_end[n_load];
      const uint32_t base = smem0 + uint32_t(slot * Pipe::kStageBytes + u * kGatePipeStepBytes);
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const int c = (tid + i * 32 * kGateWarps) & 3;
        const bool ok = row_ok[i] && k + c * 8 < k_end;
        dev::cp_async16(base + dst[i], src[i] + k, ok ? 16u : 0u);
      }
      ++n_load;
    }
    dev::cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };

  dev::pdl_enter();  // x may be the previous kernel's output
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) load_stage(st);

  float P[2][4][4], V[2][4][4], S[2][4][4];
  // f(mt, nt, i) for every accumulator element of this warp's 32 x 32.
  auto each_acc = [](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) f(mt, nt, i);
  };
  each_acc([&](int mt, int nt, int i) { P[mt][nt][i] = 0.0f; });
  // The consumer's place in the order: slice r, role w, `left` steps of the role to go. Closing a
  // role folds P into V (and, at the slice's end, V into S); roles without a step fold a zero P.
  int r = 0, w = 0;
  int64_t left = gate_role_steps(sl.steps(0), 0);
  auto close_roles = [&] {
    while (r < kGateSlices && left == 0) {
      each_acc([&](int mt, int nt, int i) {
        V[mt][nt][i] = w == 0 ? P[mt][nt][i] : canon::add(V[mt][nt][i], P[mt][nt][i]);
        P[mt][nt][i] = 0.0f;
      });
      if (++w == kGateWarps) {
        each_acc([&](int mt, int nt, int i) {
          S[mt][nt][i] = r == 0 ? V[mt][nt][i] : canon::add(S[mt][nt][i], V[mt][nt][i]);
        });
        w = 0, ++r;
      }
      if (r < kGateSlices) left = gate_role_steps(sl.steps(r), w);
    }
  };
  close_roles();

  int slot = 0;
  for (int64_t n = 0; n < total; n += G) {
    dev::cp_async_wait<STAGES - 2>();
    __syncthreads();  // the stage landed for every thread; the slot refilled next was read by all
    load_stage(slot == 0 ? STAGES - 1 : slot - 1);
#pragma unroll
    for (int u = 0; u < G; ++u) {
      if (n + u >= total) break;
      const unsigned char* xs = gate_smem + slot * Pipe::kStageBytes + u * kGatePipeStepBytes;
      const unsigned char* ws = xs + kXBytes;
      uint4 xv[2][2], wv[4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          xv[mt][h] = *reinterpret_cast<const uint4*>(xs + (wm * 32 + mt * 16 + g + 8 * h) * kGateStep * 2 + q * 16);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        wv[nt] = *reinterpret_cast<const uint4*>(ws + (wn * 32 + nt * 8 + g) * kGateStep * 2 + q * 16);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma_step_half(P[mt][nt], xv[mt][0], xv[mt][1], wv[nt], j);
      --left;
      close_roles();
    }
    slot = slot + 1 == STAGES ? 0 : slot + 1;
  }
  dev::cp_async_wait_all();

  // C fragment: c0,c1 row g cols 2q,2q+1; c2,c3 row g+8.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t t = t0 + wm * 32 + mt * 16 + g + 8 * h;
        const int e = e0 + wn * 32 + nt * 8 + 2 * q;
        if (t >= p.tokens) continue;
        if (e < p.experts) p.logits[t * p.experts + e] = S[mt][nt][2 * h];
        if (e + 1 < p.experts) p.logits[t * p.experts + e + 1] = S[mt][nt][2 * h + 1];
      }
}

}  // namespace moekit::kernels::router
