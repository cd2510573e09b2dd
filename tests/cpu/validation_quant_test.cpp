// validation_quant_test.cpp — the FP8 quantizers' entries (quantize_tokens, quantize_weights)
// reject bad arguments with a moekit::Error that names the argument.
//
// As in validation_stage_test.cpp: each case breaks one thing of a valid call on fake, aligned
// device pointers, and the check throws before any launch, so no GPU is needed. The valid starting
// points are checked where the entry returns before launching (nothing to quantize).
#include <gtest/gtest.h>

#include "cpu_test_util.hpp"

namespace moekit::testing {
namespace {

// ---- quantize_tokens ------------------------------------------------------------------------

struct TokensCall {
  ForwardPlan plan;
  Workspace ws;
  Tensor x;
  void operator()() const { quantize_tokens(plan, x, ws, nullptr); }
};
TokensCall valid_tokens(int64_t T, int64_t H = 336, Precision precision = Precision::fp8) {
  TokensCall c;
  c.plan = plan_forward(MoeShape{T, H, 256, 16, 4}, kH200, precision);
  c.ws = carve_workspace(c.plan, fake_ptr(8), workspace_bytes(c.plan));
  c.x = Tensor(fake_ptr(1), DType::bf16, {T, H});
  return c;
}
template <class Mutate>
BadCall bad_tokens(std::string what, Mutate mutate, std::string arg) {
  TokensCall c = valid_tokens(8);
  mutate(c);
  return {std::move(what), [c] { c(); }, std::move(arg)};
}

TEST(QuantizeTokensValidation, ValidStartingPointPasses) {
  EXPECT_NO_THROW(valid_tokens(0)());  // T = 0 returns before launching
  EXPECT_NO_THROW(valid_tokens(0, 7168)());
  const TokensCall c = valid_tokens(8);
  EXPECT_EQ(c.ws.x_scale.dim(1), 3);  // ceil(336 / 128): the partial last group has its scale
}

TEST(QuantizeTokensValidation, Plan) {
  expect_all_rejected({
      {"a bf16 plan", [] { valid_tokens(0, 336, Precision::bf16)(); }, "plan"},
      bad_tokens("hidden not a multiple of 16", [](TokensCall& c) { c.plan.shape.hidden = 328; }, "shape.hidden"),
      bad_tokens("tokens < 0", [](TokensCall& c) { c.plan.shape.tokens = -1; }, "shape.tokens"),
      bad_tokens("up and down of two precisions", [](TokensCall& c) { c.plan.down.precision = Precision::bf16; }, "plan"),
  });
}

TEST(QuantizeTokensValidation, Tensors) {
  expect_all_rejected({
      bad_tokens("x f32", [](TokensCall& c) { c.x.dtype = DType::f32; }, "x"),
      bad_tokens("x e4m3", [](TokensCall& c) { c.x.dtype = DType::e4m3; }, "x"),
      bad_tokens("x T+1 rows", [](TokensCall& c) { c.x = with_shape(c.x, {9, 336}); }, "x"),
      bad_tokens("x wrong hidden", [](TokensCall& c) { c.x = with_shape(c.x, {8, 352}); }, "x"),
      bad_tokens("x not given", [](TokensCall& c) { c.x = Tensor{}; }, "x"),
      bad_tokens("x null", [](TokensCall& c) { c.x = with_null_data(c.x); }, "x"),
      bad_tokens("x misaligned", [](TokensCall& c) { c.x = misaligned(c.x); }, "x"),
      bad_tokens("x_q bf16", [](TokensCall& c) { c.ws.x_q.dtype = DType::bf16; }, "ws.x_q"),
      bad_tokens("x_q wrong hidden", [](TokensCall& c) { c.ws.x_q = with_shape(c.ws.x_q, {8, 320}); }, "ws.x_q"),
      bad_tokens("x_q not given", [](TokensCall& c) { c.ws.x_q = Tensor{}; }, "ws.x_q"),
      bad_tokens("x_q misaligned", [](TokensCall& c) { c.ws.x_q = misaligned(c.ws.x_q); }, "ws.x_q"),
      bad_tokens("x_scale bf16", [](TokensCall& c) { c.ws.x_scale.dtype = DType::bf16; }, "ws.x_scale"),
      bad_tokens("x_scale floor(H/128) groups", [](TokensCall& c) { c.ws.x_scale = with_shape(c.ws.x_scale, {8, 2}); },
                 "ws.x_scale"),
      bad_tokens("x_scale flat", [](TokensCall& c) { c.ws.x_scale = with_shape(c.ws.x_scale, {24}); }, "ws.x_scale"),
      bad_tokens("x_scale null", [](TokensCall& c) { c.ws.x_scale = with_null_data(c.ws.x_scale); }, "ws.x_scale"),
  });
}

// ---- quantize_weights -----------------------------------------------------------------------

struct WeightsCall {
  Tensor w, q, scale;
  void operator()() const { quantize_weights(w, q, scale, nullptr); }
};
// P projections of [R, C] (scale [P, ceil(R/128), ceil(C/128)]).
WeightsCall valid_weights(int64_t P, int64_t R = 200, int64_t C = 336) {
  return {Tensor(fake_ptr(1), DType::bf16, {P, R, C}), Tensor(fake_ptr(2), DType::e4m3, {P, R, C}),
          Tensor(fake_ptr(3), DType::f32, {P, fp8_blocks(R), fp8_blocks(C)})};
}
template <class Mutate>
BadCall bad_weights(std::string what, Mutate mutate, std::string arg) {
  WeightsCall c = valid_weights(4);
  mutate(c);
  return {std::move(what), [c] { c(); }, std::move(arg)};
}

TEST(QuantizeWeightsValidation, ValidStartingPointPasses) {
  EXPECT_NO_THROW(valid_weights(0)());           // no projections: nothing to launch
  EXPECT_NO_THROW(valid_weights(4, 0, 336)());   // no rows
  EXPECT_NO_THROW(valid_weights(512, 0, 7168)());
}

TEST(QuantizeWeightsValidation, Weights) {
  expect_all_rejected({
      bad_weights("w f32", [](WeightsCall& c) { c.w.dtype = DType::f32; }, "w"),
      bad_weights("w e4m3", [](WeightsCall& c) { c.w.dtype = DType::e4m3; }, "w"),
      bad_weights("w rank 2", [](WeightsCall& c) { c.w = with_shape(c.w, {800, 336}); }, "w"),
      bad_weights("w rank 4", [](WeightsCall& c) { c.w = with_shape(c.w, {2, 2, 200, 336}); }, "w"),
      bad_weights("w not given", [](WeightsCall& c) { c.w = Tensor{}; }, "w"),
      bad_weights("w null", [](WeightsCall& c) { c.w = with_null_data(c.w); }, "w"),
      bad_weights("w misaligned", [](WeightsCall& c) { c.w = misaligned(c.w); }, "w"),
      bad_weights("w negative rows", [](WeightsCall& c) { c.w = with_shape(c.w, {4, -200, 336}); }, "w"),
      bad_weights("columns not a multiple of 16",
                  [](WeightsCall& c) {
                    c.w = with_shape(c.w, {4, 200, 328});
                    c.q = with_shape(c.q, {4, 200, 328});
                  },
                  "w"),
  });
}

TEST(QuantizeWeightsValidation, Outputs) {
  expect_all_rejected({
      bad_weights("q bf16", [](WeightsCall& c) { c.q.dtype = DType::bf16; }, "q"),
      bad_weights("q transposed", [](WeightsCall& c) { c.q = with_shape(c.q, {4, 336, 200}); }, "q"),
      bad_weights("q one projection short", [](WeightsCall& c) { c.q = with_shape(c.q, {3, 200, 336}); }, "q"),
      bad_weights("q not given", [](WeightsCall& c) { c.q = Tensor{}; }, "q"),
      bad_weights("q null", [](WeightsCall& c) { c.q = with_null_data(c.q); }, "q"),
      bad_weights("q misaligned", [](WeightsCall& c) { c.q = misaligned(c.q); }, "q"),
      bad_weights("scale bf16", [](WeightsCall& c) { c.scale.dtype = DType::bf16; }, "scale"),
      bad_weights("scale floor(R/128) rows", [](WeightsCall& c) { c.scale = with_shape(c.scale, {4, 1, 3}); }, "scale"),
      bad_weights("scale floor(C/128) columns", [](WeightsCall& c) { c.scale = with_shape(c.scale, {4, 2, 2}); }, "scale"),
      bad_weights("scale flat", [](WeightsCall& c) { c.scale = with_shape(c.scale, {24}); }, "scale"),
      bad_weights("scale not given", [](WeightsCall& c) { c.scale = Tensor{}; }, "scale"),
      bad_weights("scale null", [](WeightsCall& c) { c.scale = with_null_data(c.scale); }, "scale"),
      bad_weights("scale misaligned", [](WeightsCall& c) { c.scale = misaligned(c.scale); }, "scale"),
  });
}

}  // namespace
}  // namespace moekit::testing
