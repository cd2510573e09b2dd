// moekit/moe.hpp — the public host API of one MoE layer's forward pass.
//
// Pipeline (docs/design.md): route -> align -> expert_up -> expert_down -> combine.
// A MoeShape and the device's DeviceInfo go to plan_forward(), the one config chooser; the
// ForwardPlan it returns fixes the tile configs and the workspace layout. Every stage entry
// validates its arguments (moekit::Error names the argument) and enqueues on the caller's
// stream: no allocation, no host synchronisation, safe to capture in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit {

// T tokens of hidden size H; E experts of intermediate size F; top-k routing.
struct MoeShape {
  int64_t tokens = 0;   // T
  int64_t hidden = 0;   // H
  int64_t inter = 0;    // F
  int64_t experts = 0;  // E
  int64_t topk = 0;     // k
  int64_t assignments() const { return tokens * topk; }
};

// Limits the router's kernels are built for (E up to 512 experts, top-k up to 16).
inline constexpr int64_t kMaxExperts = 512;
inline constexpr int64_t kMaxTopk = 16;
// Largest H and F a shape may have: moekit's bound (no kernel needs more), chosen so that every
// tensor of a layer and every workspace size (forward and backward, split-K partials included)
// fits a 64-bit byte count with room to spare once T·k is within 32-bit assignment ids.
inline constexpr int64_t kMaxHidden = int64_t(1) << 20;
inline constexpr int64_t kMaxInter = int64_t(1) << 20;
// Largest worst-case layout (worst_case_rows at the largest block_m): sorted_ids are int32 and
// hold the padding sentinel T·k, so every row index and the sentinel stay below 2^31 - 1.
inline constexpr int64_t kMaxLayoutRows = int64_t(2147483647) - 1;

enum class Scoring : int { softmax, sigmoid };

struct RouterOptions {
  Scoring scoring = Scoring::softmax;
  bool renormalize = false;            // divide the k weights by their sum
  int64_t n_group = 0;                 // grouped top-k (DeepSeek-V3); 0 = off
  int64_t topk_group = 0;              // groups kept when n_group > 0
  float routed_scaling_factor = 1.0f;  // multiplies the final weights
};

// What the config chooser needs to know of the GPU; read from the device, never hard-coded.
struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int64_t smem_per_block_optin = 0;  // bytes
  int64_t l2_bytes = 0;
};
DeviceInfo query_device(int device = -1);  // -1: the current device

// The precision of the expert GEMMs (docs/design.md, "FP8"), a property of each GEMM config:
//   bf16 — bf16 weights and activations, FP32 accumulation;
//   fp8  — DeepSeek-V3's format: e4m3 weights with one FP32 scale per 128 x 128 block of each
//          projection (the checkpoint's weight_scale_inv, the dequantizing multiplier), e4m3
//          activations with one FP32 scale per token row and 128 columns, computed on the device
//          (x by quantize_tokens, act in the up GEMM's epilogue); products on the FP8 tensor cores,
//          each 128-deep K block's sum scaled and added in FP32 (promotion).
enum class Precision : int { bf16, fp8 };
const char* precision_name(Precision p);
// The FP8 block: weights are scaled per kFp8Block x kFp8Block block, activations per 1 x kFp8Block
// group of columns; a dimension that is not a multiple has a partial last block.
inline constexpr int64_t kFp8Block = 128;
inline constexpr int64_t fp8_blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }
// Shapes of the block scales of FP8 weights (f32): w13 [E, 2F, H] -> [E, 2·ceil(F/128), ceil(H/128)]
// (gate's blocks, then up's: each projection keeps its own, also when F is not a multiple of 128);
// w2 [E, H, F] -> [E, ceil(H/128), ceil(F/128)].
inline constexpr int64_t w13_scale_rows(int64_t inter) { return 2 * fp8_blocks(inter); }

// The two expert-GEMM kernel families: mma.sync with a cp.async pipeline (every tile size; the
// decode path), and Hopper wgmma fed by TMA in a warp-specialised pipeline (128-row prefill tiles).
enum class GemmKernel : int { mma_sync, wgmma };

// One expert-GEMM tile configuration (an instance the library compiles; see src/gemm/configs.hpp).
// For wgmma, warps_m x warps_n counts every warp of the CTA (2 consumer + 1 producer warpgroups).
struct GemmConfig {
  int block_m = 0, block_n = 0, block_k = 0;
  int warps_m = 0, warps_n = 0, stages = 0;
  GemmKernel kernel = GemmKernel::mma_sync;
  Precision precision = Precision::bf16;  // fp8: block_k counts e4m3 elements (one 128-deep scale block)
  int threads() const { return 32 * warps_m * warps_n; }
  std::string str() const;
  bool operator==(const GemmConfig&) const = default;
};

// The kernels of stage 1 (src/router). Logits of a bf16 w_gate, when the layer computes them, run
// on the tensor cores in one of these tilings (every one sums each logit in the same order, so
// the choice changes speed only): a cluster of 8 CTAs per tile (decode), one CTA per tile walking
// the H slices (prefill), or a pipelined CTA per 128 x 64 tile (prefill with many experts; 128 x
// 32 where 64-expert tiles would leave SMs idle).
enum class GateKernel : int {
  cluster_16x8,
  cluster_32x8,
  cluster_32x32,
  looped_64x8,
  looped_64x32,
  pipelined_128x64,
  pipelined_128x32
};
// The selection from logits: a warp per token (experts spread over its lanes), or a CTA per token
// (a thread per expert; decode with 128 < E <= 256, where one warp's chain is the latency).
enum class SelectKernel : int { warp, cta };
struct RouterPlan {
  GateKernel gate = GateKernel::cluster_16x8;
  SelectKernel select = SelectKernel::warp;
  // FP8 layers: the gate kernel quantizes the x it reads for the logits (ws.x_q, ws.x_scale), so
  // moe_forward reads x once: the decode (cluster) tilings, when H's slices hold whole 128-column
  // groups and the x tile fits shared memory; elsewhere quantize_tokens' pass runs.
  bool quantize_x = false;
  std::string str() const;
  bool operator==(const RouterPlan&) const = default;
};
// The kernel of stage 2 (src/align): one warp (decode's few ids), one CTA, or a cooperative grid
// (which needs ws.align_scratch).
enum class AlignKernel : int { warp, cta, grid };

// Rows of the aligned layout in the worst case: T·k assignments plus every expert's last block
// padded (E·(block_m − 1)), rounded up to whole blocks. Saturates at INT64_MAX for a shape whose
// rows do not fit 64 bits (plan_forward refuses those: kMaxLayoutRows).
int64_t worst_case_rows(const MoeShape& shape, int block_m);

// The plan of one forward pass: every kernel choice of the layer (made by plan_forward, the one
// chooser in src/tuning) and, derived from them, every buffer's size.
struct ForwardPlan {
  MoeShape shape;
  GemmConfig up, down;     // both of one block_m: the two GEMMs read one aligned layout
  // Split-K of the down GEMM (too few output tiles to fill the GPU: decode on the mma.sync
  // kernel; few experts at mid-size T on the bf16 wgmma kernel, up to 4 slices). With S > 1 the
  // down GEMM writes FP32 partial rows (ws.y_partials) and combine sums them in fixed order.
  int down_splits = 1;
  RouterPlan router;
  AlignKernel align = AlignKernel::warp;
  // The training forward (bf16 plans): the up GEMM also stores h = g | u, its gate and up values
  // before SwiGLU, in sorted order, to the caller's h [max_rows, 2F] bf16 (the last argument of
  // moe_forward, experts_forward and expert_up), for moe_backward with SavedActivations::h
  // (moekit/backward.hpp): the backward then skips h's recomputation, one up GEMM, for
  // 2·max_rows·2F bytes kept until it has run. Off: h is not taken. Set it after plan_forward (the
  // configs and the workspace do not change).
  bool save_h = false;
  // Where the GEMM configs came from: "table:configs/<device>.json(rows/expert<=B)" (a bucket of a
  // measured table), "heuristic", or "given" (plan_forward_with).
  std::string source = "given";

  int block_m() const { return up.block_m; }  // rows per block of the aligned layout
  Precision precision() const { return up.precision; }  // both configs have one
  int64_t max_rows() const { return worst_case_rows(shape, block_m()); }
  int64_t max_blocks() const { return max_rows() / block_m(); }
  std::string str() const;
};

// Validates the shape (clear errors) and picks the configs for it on this device: from the
// measured table of this device (configs/*.json, compiled in; DeviceInfo::name matched exactly)
// when one has a bucket for the shape in `precision` (moekit/tuning.hpp), else from
// plan_forward_heuristic.
// FP8 plans need H and F multiples of 16 (16-byte rows of e4m3).
ForwardPlan plan_forward(const MoeShape& shape, const DeviceInfo& device, Precision precision = Precision::bf16);
// The rule that serves shapes with no table: tile rows from rows per expert, split-K by occupancy.
ForwardPlan plan_forward_heuristic(const MoeShape& shape, const DeviceInfo& device,
                                   Precision precision = Precision::bf16);
// As plan_forward, but with the tile configs given (tuning, tests); they must be compiled ones,
// of one precision.
ForwardPlan plan_forward_with(const MoeShape& shape, const GemmConfig& up, const GemmConfig& down,
                              int down_splits = 1);
inline constexpr int kMaxDownSplits = 8;
// The planner's align switch: one CTA (or one warp) up to this many assignments (decode: a chain
// of latencies); above it, one cooperative launch of up to kAlignMaxCtas CTAs (one per SM) with a
// grid-wide barrier (plan.align = AlignKernel::grid).
inline constexpr int64_t kAlignGridMinAssignments = 4096;
// The align grid's CTA cap, a row each in ws.align_scratch: at least the SM count of every Hopper
// part (H100 SXM and H200: 132, H100 PCIe: 114); a larger device would use 160 of its SMs.
inline constexpr int kAlignMaxCtas = 160;
// The tile configs the library compiles for a precision; plan_forward picks among these.
const std::vector<GemmConfig>& compiled_gemm_configs(Precision precision = Precision::bf16);

// Workspace: one caller-owned device buffer, carved into the intermediate tensors.
struct Workspace {
  Tensor router_logits;    // [T, E] f32: route()'s logits_scratch
  Tensor topk_ids;         // [T, k] i32
  Tensor topk_weights;     // [T, k] f32
  Tensor sorted_ids;       // [max_rows] i32: assignment a = t*k+j, or T*k on padding rows; in
                           // each expert's rows its assignments come first, its padding after
                           // (the wgmma GEMM skips a 64-row half whose first row is padding)
  Tensor block_expert;     // [max_blocks] i32: expert of each block_m-row block; -1 past the end
  Tensor num_rows_padded;  // [1] i32: rows actually used (a multiple of block_m)
  Tensor expert_counts;    // [E] i32: assignments per expert
  Tensor act;              // [max_rows, F] bf16 (fp8 plans: e4m3): silu(gate)*up in sorted order
  Tensor act_scale;        // [max_rows, ceil(F/128)] f32: act's scales (fp8 plans; else empty)
  Tensor x_q;              // [T, H] e4m3: x quantized per token and 128 columns (fp8; else empty)
  Tensor x_scale;          // [T, ceil(H/128)] f32: x_q's scales (fp8; else empty)
  Tensor y_rows;           // [T*k, H] bf16: weighted expert output per assignment (S = 1)
  Tensor y_partials;       // [S, T*k, H] f32: its split-K partial sums (S > 1; else empty)
  Tensor status;           // [1] i32: error bits set by kernels (see check_status)
  Tensor align_scratch;    // [kAlignMaxCtas, E+1] i32: the align grid's per-CTA counts (plan.align
                           // is AlignKernel::grid; else empty)
  Tensor gemm_counter;     // [1] i32: the prefill (wgmma) GEMMs' work-item counter; each GEMM
                           // zeroes it first (a memset on the stream)
};
size_t workspace_bytes(const ForwardPlan& plan);
// Views into `base` (at least workspace_bytes(plan) bytes, 256-byte aligned).
Workspace carve_workspace(const ForwardPlan& plan, void* base, size_t bytes);

// Caller-given expert ids are checked on the device (a host check would need a sync): align
// skips an id outside [0, E) and sets a bit in ws.status. check_status() synchronises `stream`
// and throws moekit::Error naming the argument if any bit is set; call it outside hot loops.
enum StatusBits : int32_t { kStatusExpertIdOutOfRange = 1 };
void check_status(const Workspace& ws, cudaStream_t stream);

// ---- Stage 1: router ------------------------------------------------------------------------
// Scores come from `logits` [T,E] f32 when given, else from x [T,H] bf16 · w_gate [E,H]ᵀ
// (w_gate bf16 or f32; FP32 accumulation in a fixed order). score_bias [E] f32 is optional.
// Writes topk_ids [T,k] i32 and topk_weights [T,k] f32, in descending order of the selection
// score; equal scores: the lower expert id wins.
// logits_scratch [T,E] f32 (optional, used when logits are computed): with it, the logits are
// computed first, over many SMs, and written there (moe_forward always passes one):
//   - bf16 w_gate: on the tensor cores (bf16 products, FP32 accumulation) in an order fixed by H
//     alone: deterministic and batch-invariant, within 2^-12 * sum|x_i * w_i| of the FP32 CPU
//     oracle (ref::logits_beyond_bound); the selection is bitwise the oracle's from these logits.
//   - f32 w_gate: on the CUDA cores, bitwise the oracle's (canon order), as without the scratch.
// Without it, one warp per token computes them in the canon order (bitwise the oracle's).
void route(const Tensor& x, const Tensor& w_gate, const Tensor& logits, const Tensor& score_bias,
           const RouterOptions& opt, const Tensor& topk_ids, const Tensor& topk_weights,
           cudaStream_t stream, const Tensor& logits_scratch = Tensor());

// ---- Stage 1b (fp8 plans): quantize the tokens ---------------------------------------------
// x [T, H] bf16 -> ws.x_q [T, H] e4m3 and ws.x_scale [T, ceil(H/128)] f32, each token row once:
// per 128-column group g, amax = max |x| (NaN if any element is NaN), a = max(amax, 2^-100),
// scale = a / 448 and q = e4m3_rn_satfinite(x · (448 / a)), all in FP32 (docs/design.md, "FP8":
// zero, tiny, huge and non-finite groups). The up GEMM of an fp8 plan reads x_q and x_scale.
void quantize_tokens(const ForwardPlan& plan, const Tensor& x, const Workspace& ws, cudaStream_t stream);

// The quantizer of bf16 checkpoints to DeepSeek-V3's format, on the device (outside the hot path):
// w [P, R, C] bf16 (P matrices; pass w13 [E, 2F, H] as [2E, F, H], w2 [E, H, F] as is) -> q [P, R, C]
// e4m3 and scale [P, ceil(R/128), ceil(C/128)] f32, per 128 x 128 block as quantize_tokens does per
// group (amax over the block). Bitwise ref::quantize_weight_blocks.
void quantize_weights(const Tensor& w, const Tensor& q, const Tensor& scale, cudaStream_t stream);

// ---- Load statistics (opt-in) ----------------------------------------------------------------
// expert_load [E] i64: a caller-owned device counter that align, moe_forward and experts_forward
// take as their last, optional argument. When it is given, each call adds its per-expert
// assignment counts (ws.expert_counts: the real assignments, not the padding rows; an id outside
// [0, E) is not counted) to it, on the device, inside align's kernel: no extra launch, no host
// sync, no allocation, so it captures in a CUDA graph and every replay adds again. Integer sums:
// exact, and the same whatever the order of calls (calls on several streams may share a counter).
// It must be 8-byte aligned and share no byte with the call's other buffers (moekit::Error names
// 'expert_load'). Absent (Tensor()), nothing is counted and the layer runs exactly its normal
// kernels. moekit never reads or clears it: zero it before the first call, then read or reset it
// when you choose, ordered after the calls on their stream, e.g.
//   cudaMemcpyAsync(host_counts, expert_load.data, E * 8, cudaMemcpyDeviceToHost, stream);  // read
//   cudaMemsetAsync(expert_load.data, 0, E * 8, stream);                                      // reset
// (The expert-parallel layer takes a counter of its own: moekit/ep_nccl.hpp, EpLayer::forward.)

// ---- Stage 2: align -------------------------------------------------------------------------
// topk_ids [T,k] i32 -> ws.sorted_ids, block_expert, num_rows_padded, expert_counts. One launch of
// plan.align's kernel (the grid needs ws.align_scratch, carved whenever the plan names it);
// expert_load (optional, see "Load statistics") gains ws.expert_counts.
void align(const ForwardPlan& plan, const Tensor& topk_ids, const Workspace& ws,
           cudaStream_t stream, const Tensor& expert_load = Tensor());

// ---- Stages 3-4: expert GEMMs ---------------------------------------------------------------
// Both read the layout align wrote to ws. A caller that fills sorted_ids itself must keep
// align's order within each expert: its assignments first, its padding (T*k) after — the prefill
// (wgmma) kernel skips a 64-row half of a block whose first row is padding.
// act[r] = silu(x[t]·W_gateᵀ) ⊙ (x[t]·W_upᵀ) for every sorted row r of assignment a, t = a/k.
// fp8 plans: x is ws.x_q (e4m3, its scales in ws.x_scale: quantize_tokens), w13 is e4m3 with its
// block scales w13_scale [E, 2·ceil(F/128), ceil(H/128)] f32; act is stored as e4m3 with its
// scales in ws.act_scale (each row's 128-column group quantized as quantize_tokens does).
// plan.save_h (bf16): h [max_rows, 2F] bf16 gets g | u of every sorted row too (rows of padding
// are not written); it may share no byte with the other arguments or the workspace.
void expert_up(const ForwardPlan& plan, const Tensor& x, const Tensor& w13, const Workspace& ws,
               cudaStream_t stream, const Tensor& w13_scale = Tensor(), const Tensor& h = Tensor());
// y_rows[a] = topk_weights[a] · act[r]·W2ᵀ for every sorted row r of assignment a
// (plan.down_splits > 1: y_partials[s][a] = topk_weights[a] · the s-th K-slice of that product).
// fp8 plans: w2 is e4m3 with its block scales w2_scale [E, ceil(H/128), ceil(F/128)] f32.
void expert_down(const ForwardPlan& plan, const Tensor& w2, const Tensor& topk_weights,
                 const Workspace& ws, cudaStream_t stream, const Tensor& w2_scale = Tensor());

// ---- Stage 5: combine -----------------------------------------------------------------------
// y[t] = Σ_j y_rows[t*k+j] in slot order j = 0..k-1 (FP32 sum, bf16 out). No atomics.
void combine(const Tensor& y_rows, int64_t topk, const Tensor& y, cudaStream_t stream);
// y[t] = Σ_j Σ_s y_partials[s][t*k+j] (j outer, s inner; FP32, bf16 out): split-K's combine.
void combine_partials(const Tensor& y_partials, int64_t topk, const Tensor& y, cudaStream_t stream);

// ---- The whole layer ------------------------------------------------------------------------
struct MoeInputs {
  Tensor x;           // [T, H] bf16
  Tensor w_gate;      // [E, H] bf16/f32 (or give router_logits)
  Tensor router_logits;  // [T, E] f32
  Tensor score_bias;  // [E] f32, optional
  Tensor w13;         // [E, 2F, H] bf16 (fp8 plans: e4m3): gate rows then up rows
  Tensor w2;          // [E, H, F] bf16 (fp8 plans: e4m3)
  Tensor w13_scale;   // fp8 plans: [E, 2·ceil(F/128), ceil(H/128)] f32 block scales; else absent
  Tensor w2_scale;    // fp8 plans: [E, ceil(H/128), ceil(F/128)] f32 block scales; else absent
};
// expert_load [E] i64 (optional, see "Load statistics"): gains this call's assignments per expert.
// h [max_rows, 2F] bf16: required when plan.save_h (the training forward), refused otherwise; the up
// GEMM writes g | u of each sorted row there (BackwardInputs::h of this layer's backward, with the
// workspace's layout), sharing no byte with any other argument or the workspace.
void moe_forward(const ForwardPlan& plan, const MoeInputs& in, const RouterOptions& opt,
                 const Tensor& y, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                 const Tensor& expert_load = Tensor(), const Tensor& h = Tensor());
// Stages 2-5 with routing given by the caller (topk_ids [T,k] i32, topk_weights [T,k] f32);
// expert_load and h as in moe_forward (the histogram of the given topk_ids).
void experts_forward(const ForwardPlan& plan, const Tensor& x, const Tensor& w13, const Tensor& w2,
                     const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& y,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream,
                     const Tensor& expert_load = Tensor(), const Tensor& h = Tensor());
// The expert weights of any precision: bf16 w13/w2 without scales, or e4m3 with their block scales.
struct ExpertWeights {
  Tensor w13, w2;
  Tensor w13_scale, w2_scale;  // fp8 plans only
};
void experts_forward(const ForwardPlan& plan, const Tensor& x, const ExpertWeights& weights,
                     const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& y,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream,
                     const Tensor& expert_load = Tensor(), const Tensor& h = Tensor());

}  // namespace moekit
