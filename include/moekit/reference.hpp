// moekit/reference.hpp — the CPU oracle: a plain C++ reference of every stage of the forward pass
// and of the backward's gradients (library moekit_reference, apart from moekit_lib: plain C++, no
// CUDA runtime).
//
// Every GPU test compares with these functions, `moekit check --cpu` runs them on a machine with
// no GPU, and `moekit bench` checks against them before it times. Router, align and combine
// follow the exact operation order of the kernels (src/common/canon.hpp) and must match them bit
// for bit; the expert FFN is the naive per-expert loop of docs/design.md in double precision,
// the ground truth the GEMMs are measured against.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moekit/moe.hpp"

namespace moekit::ref {

using bf16 = uint16_t;  // raw bf16 bits on the host

float to_float(bf16 b);
bf16 to_bf16(float f);

// logits[t, e] = x[t]·w_gate[e] in FP32, in the kernels' fixed accumulation order.
// w_gate is bf16 bits or f32, as `w_gate_dtype` says.
std::vector<float> router_logits(const bf16* x, const void* w_gate, DType w_gate_dtype,
                                 int64_t tokens, int64_t hidden, int64_t experts);

// The tensor-core router (a bf16 w_gate with a logits scratch: route(), moe_forward) sums in
// another fixed order: its logits are checked against router_logits within
// |got - want| <= kTensorCoreLogitTol * sum_i |x_i * w_i| per entry, and its selection is
// checked bitwise as route() of its own logits. Returns the entries beyond the bound; `first`
// (if given) describes the first one.
inline constexpr double kTensorCoreLogitTol = 1.0 / 4096;
int64_t logits_beyond_bound(const float* got, const bf16* x, const bf16* w_gate, int64_t tokens, int64_t hidden,
                            int64_t experts, std::string* first = nullptr);

struct Routing {
  std::vector<int32_t> ids;    // [T, k]
  std::vector<float> weights;  // [T, k]
};
// Scoring, optional bias and grouped top-k, top-k, renormalize, scaling (docs/design.md, stage 1).
Routing route(const float* logits, const float* score_bias, int64_t tokens, int64_t experts,
              int64_t topk, const RouterOptions& opt);

struct Aligned {
  std::vector<int32_t> sorted_ids;    // [num_rows_padded]; padding rows hold T*k
  std::vector<int32_t> block_expert;  // [max_blocks]; -1 past the used blocks
  int32_t num_rows_padded = 0;
  std::vector<int32_t> expert_counts;  // [E]
  int32_t status = 0;                  // kStatusExpertIdOutOfRange if an id was outside [0, E)
};
// Stable counting sort of the assignments by expert, each expert padded to block_m rows.
Aligned align(const int32_t* topk_ids, int64_t tokens, int64_t topk, int64_t experts,
              int64_t block_m, int64_t max_blocks);

// y[t] = Σ_j y_rows[t*k + j] in FP32, slot order, rounded to bf16.
std::vector<bf16> combine(const bf16* y_rows, int64_t tokens, int64_t topk, int64_t hidden);

// Split-K's combine: y[t] = Σ_j Σ_s partials[s][t*k + j] (j outer, s inner), FP32, bf16 out.
std::vector<bf16> combine_partials(const float* partials, int64_t splits, int64_t tokens,
                                   int64_t topk, int64_t hidden);

// The activation of one assignment row: silu(x·W_gateᵀ) ⊙ (x·W_upᵀ), in double. [F]
std::vector<double> expert_act(const bf16* x_row, const bf16* w13_expert, int64_t hidden,
                               int64_t inter);
// One output row of the down projection of a given activation row (bf16, as the GPU stores it):
// weight · act·W2ᵀ, in double. [H]
std::vector<double> expert_down_row(const bf16* act_row, const bf16* w2_expert, float weight,
                                    int64_t hidden, int64_t inter);

// The naive loop of docs/design.md for the listed tokens: y[t] = Σ_j w_j · FFN_{e_j}(x[t]), double.
// Returns [tokens.size(), H]. Tokens are independent, so callers check a sample of a large T.
std::vector<double> moe_tokens(const MoeShape& shape, const bf16* x, const bf16* w13,
                               const bf16* w2, const int32_t* topk_ids, const float* topk_weights,
                               const std::vector<int64_t>& tokens);

// ---- FP8 (docs/design.md, "FP8") -------------------------------------------------------------
// The quantization of FP8 plans, bit for bit as the kernels do it (FP32, no FMA contraction), and
// the expert FFN on the quantized values in double.
using fp8 = uint8_t;  // raw e4m3 bits (OCP E4M3FN)
inline constexpr float kFp8Max = 448.0f;       // the largest finite e4m3
inline constexpr float kFp8AmaxFloor = 0x1p-100f;  // amax below this quantizes as if it were this
// Exact value of an e4m3 (0x7F / 0xFF: NaN).
float e4m3_to_float(fp8 q);
// Round to nearest even; finite values beyond ±448 and ±Inf saturate to ±448 (PTX cvt
// .satfinite); NaN -> 0x7F.
fp8 to_e4m3(float f);
// One group of n values (n <= 128) quantized as quantize_tokens and the up GEMM's epilogue do:
// amax = max |v| (NaN if any v is NaN), a = max(amax, kFp8AmaxFloor), q[i] = to_e4m3(v[i] · (448 / a));
// returns the scale a / 448 (the dequantizing multiplier).
float quantize_group(const float* v, int64_t n, fp8* q);
// x [T, H] bf16 -> q [T, H] e4m3 and scale [T, ceil(H/128)] f32: bitwise moekit::quantize_tokens.
void quantize_tokens(const bf16* x, int64_t tokens, int64_t hidden, fp8* q, float* scale);
// The quantizer of weights (bf16 checkpoints -> DeepSeek-V3's format): each of `projections`
// matrices [rows, cols] of w (float values) -> q, and scale [projections, ceil(rows/128),
// ceil(cols/128)], per 128 x 128 block as quantize_group does per group (amax over the block).
// w13 [E, 2F, H] is 2E projections of [F, H]; w2 [E, H, F] is E of [H, F].
void quantize_weight_blocks(const float* w, int64_t projections, int64_t rows, int64_t cols, fp8* q, float* scale);

// FP8 expert weights as the FP8 entries take them (shapes: moekit/moe.hpp, MoeInputs).
struct Fp8Experts {
  const fp8* w13 = nullptr;
  const float* w13_scale = nullptr;
  const fp8* w2 = nullptr;
  const float* w2_scale = nullptr;
};
// The fidelity oracle of the FP8 path for the listed tokens, in double on the same quantized
// values: x from (x_q, x_scale), the weights dequantized (q · block scale), act = silu(g) ⊙ u of
// each assignment in double, rounded to float and quantized per 128-column group by
// quantize_group (the up epilogue's quantization reproduced), dequantized, the down projection
// in double times the routing weight, summed over the k slots. Returns [tokens.size(), H].
std::vector<double> moe_tokens_fp8(const MoeShape& shape, const fp8* x_q, const float* x_scale, const Fp8Experts& w,
                                   const int32_t* topk_ids, const float* topk_weights,
                                   const std::vector<int64_t>& tokens);

// ---- Backward (docs/design.md, "Backward") ---------------------------------------------------
// The gradients of the layer in double, the ground truth the backward kernels are measured
// against. With dy = dL/dy [T, H], for every assignment a = (t, j) of expert e = topk_ids[t, j],
// w = topk_weights[t, j], h = x_t·W13_eᵀ = g|u, act = silu(g) ⊙ u:
//   D = dy_t·W2_e [F];  dw_tj = ⟨D, act⟩;  dact = w·D;
//   dg = dact ⊙ u ⊙ silu'(g),  du = dact ⊙ silu(g),  dh = dg|du [2F];
//   dx_t = Σ_j dh·W13_e;  dW2_e = Σ_{a of e} (w·dy_t)ᵀ·act;  dW13_e = Σ_{a of e} dhᵀ·x_t.
// An assignment whose id is outside [0, E) has no row (align skips it) and no gradient.
struct MoeGrads {
  std::vector<double> dx;              // [n, H]: the experts' part of dx of the listed tokens, in list order
  std::vector<double> d_topk_weights;  // [n, k]: dL/dtopk_weights of the listed tokens
  std::vector<double> dw13;            // [E, 2F, H]: gate rows, then up rows; an expert with no rows is 0
  std::vector<double> dw2;             // [E, H, F]
};
// The gradients of the loss Σ_t ⟨dy_t, y_t⟩ over the listed (distinct) tokens alone: dx and
// d_topk_weights are the rows of those tokens (tokens are independent, so a check of a large T
// samples them), dW sums over their assignments only — the whole dW when every token is listed,
// and the dW a GPU backward computes when dy is zero outside the list (a cheap check of dW at a
// large T). dW sums each expert's assignments in list order, j inner. weight_grads = false leaves
// dw13 and dw2 empty (dx and d_topk_weights alone: no E·3·H·F doubles to hold and fill).
MoeGrads moe_backward(const MoeShape& shape, const bf16* x, const bf16* w13, const bf16* w2, const int32_t* topk_ids,
                      const float* topk_weights, const bf16* dy, const std::vector<int64_t>& tokens,
                      bool weight_grads = true);
// Every token, 0..T-1.
MoeGrads moe_backward(const MoeShape& shape, const bf16* x, const bf16* w13, const bf16* w2, const int32_t* topk_ids,
                      const float* topk_weights, const bf16* dy);

// The router's gate, when the layer computed logits = x·w_gateᵀ (moe_forward with w_gate): give
// it to router_backward for d_w_gate and the router's part of dx. Absent (x null): logits given.
struct GateOperands {
  const bf16* x = nullptr;       // [T, H]
  const void* w_gate = nullptr;  // [E, H] bf16 bits or f32, as w_gate_dtype says
  DType w_gate_dtype = DType::bf16;
  int64_t hidden = 0;            // H
  const float* d_logits_aux = nullptr;  // [T, E], optional: the caller's losses' gradient at the logits
};
struct RouterGrads {
  std::vector<double> d_logits;  // [T, E] (with the gate's d_logits_aux added, when given)
  std::vector<double> d_w_gate;  // [E, H]: Σ_t d_logits[t, e]·x_t (gate given; else empty)
  std::vector<double> dx;        // [T, H]: the router's part of dx, d_logits·w_gate (gate given; else empty)
};
// The gradient of route()'s weights with respect to the logits, given dL/dtopk_weights [T, k]
// and the routing the forward chose (topk_ids [T, k]): the selection (top-k, grouped top-k, the
// score bias, which only selects) is a constant of the backward, so the gradient flows only
// through the chosen experts' weights, w_j = r·s_j/S (S = Σ_i s_i with renormalize, else 1; r
// the routed scaling factor) of the unbiased scores s = softmax(logits) over all E experts or
// sigmoid(logits):
//   ds_j = r·(dw_j − [renormalize] Σ_i dw_i·s_i/S)/S;  dp_e = ds_j for e = e_j, 0 for unchosen e;
//   softmax: d_logits_e = p_e·(dp_e − Σ_e' p_e'·dp_e');  sigmoid: d_logits_e = dp_e·p_e·(1 − p_e).
// So an unchosen expert gets 0 with sigmoid and with renormalised softmax (there Σ_j ds_j·s_j = 0);
// with plain softmax it gets −p_e·Σ_j ds_j·s_j, as every expert shares the softmax's sum.
// In double from the FP32 logits the forward scored.
RouterGrads router_backward(const double* d_topk_weights, const float* logits, const int32_t* topk_ids,
                            int64_t tokens, int64_t experts, int64_t topk, const RouterOptions& opt,
                            const GateOperands& gate = {});

// DeepGEMM's calc_diff of two tensors: 1 − 2·Σxy / (Σx² + Σy²) (0 when equal).
double calc_diff(const std::vector<double>& x, const std::vector<double>& y);

// ‖a − b‖ / ‖b‖ over n values (b is the reference).
double rel_norm_error(const std::vector<double>& a, const std::vector<double>& b);

// Runs body(i) for i in [0, n) on the machine's cores.
void parallel_for(int64_t n, const std::function<void(int64_t)>& body);

}  // namespace moekit::ref
