// moekit/reference.hpp — the CPU oracle: a plain C++ reference of every stage of the forward pass
// (library moekit_reference, apart from moekit_lib: plain C++, no CUDA runtime).
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

// ‖a − b‖ / ‖b‖ over n values (b is the reference).
double rel_norm_error(const std::vector<double>& a, const std::vector<double>& b);

// Runs body(i) for i in [0, n) on the machine's cores.
void parallel_for(int64_t n, const std::function<void(int64_t)>& body);

}  // namespace moekit::ref
