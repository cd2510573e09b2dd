// gate_quantize_test.cu — an FP8 layer's x quantized by the router's gate kernel as it reads x
// (RouterPlan::quantize_x, router/gate/x_quant.cuh):
//   - every gate tiling that quantizes (the decode clusters), at H = 336 and 2880 (a partial
//     last group), 1024, 2048, 4096, 7168 and 9000 (roles of two blocks), T across tile edges,
//     up to 256 tokens and beyond (several token tiles): x_q and x_scale bitwise
//     ref::quantize_tokens, the logits and the selection bitwise those of the same tiling without
//     quantizing (the logits' order is untouched), run to run and under graph replay;
//   - NaN, Inf, zero and tiny groups follow quantize_tokens' contract (the same bits);
//   - moe_forward of an FP8 plan, whose router quantizes x, gives bitwise the y of
//     experts_forward (which quantizes in its own pass) on the same routing.
#include <algorithm>
#include <cstring>
#include <limits>

#include "gpu_util.hpp"
#include "router/launch.hpp"
#include "tuning/planner.hpp"

namespace moekit::test {
namespace {

using fp8 = ref::fp8;

class GateQuantizeTest : public GpuTest {};

struct GateRun {
  std::vector<float> logits;
  std::vector<int32_t> ids;
  std::vector<fp8> x_q;
  std::vector<uint32_t> x_scale;  // bits
  bool quantized = false;
};


// Groups of x with the scale contract's special values: zeros, a tiny amax, a NaN and an Inf.
void patch_special_groups(std::vector<ref::bf16>& x, int64_t T, int64_t H) {
  const int64_t G = fp8_blocks(H);
  auto group = [&](int64_t t, int64_t g, float v, bool one_only) {
    if (t >= T) return;
    const int64_t c0 = (g % G) * kFp8Block, c1 = std::min<int64_t>(c0 + kFp8Block, H);
    for (int64_t c = c0; c < c1; ++c)
      if (!one_only || c == c0 + 3) x[size_t(t * H + c)] = ref::to_bf16(v);
  };
  group(0, 1, 0.0f, false);
  group(T - 1, G - 1, 1e-33f, false);
  group(T / 2, 2, std::numeric_limits<float>::quiet_NaN(), true);
  group(T / 3, 3, std::numeric_limits<float>::infinity(), true);
}

TEST_F(GateQuantizeTest, EveryQuantizingTilingBitwiseQuantizeTokensWithUnchangedLogits) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const DeviceInfo dev = query_device();
  struct Case {
    GateKernel gate;
    int64_t T, H, E;
  };
  const Case cases[] = {{GateKernel::cluster_16x8, 1, 7168, 256},  {GateKernel::cluster_16x8, 13, 2880, 64},
                        {GateKernel::cluster_32x8, 40, 4096, 8},   {GateKernel::cluster_32x32, 200, 2048, 128},
                        {GateKernel::cluster_32x32, 33, 1024, 40}, {GateKernel::cluster_32x8, 300, 4096, 8},
                        {GateKernel::cluster_32x32, 129, 7168, 256}, {GateKernel::cluster_32x32, 70, 2880, 33},
                        // past decode, where the planner keeps the cluster tilings (at most 128 tiles)
                        {GateKernel::cluster_32x32, 1000, 2048, 128}, {GateKernel::cluster_32x8, 2048, 4096, 8},
                        {GateKernel::cluster_32x32, 500, 7168, 256},
                        // H not a multiple of 128 (a partial last group) and roles of two blocks
                        {GateKernel::cluster_16x8, 3, 336, 16}, {GateKernel::cluster_32x32, 40, 9000, 64}};
  for (const Case& c : cases) {
    SCOPED_TRACE("gate " + std::to_string(int(c.gate)) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
                 " E=" + std::to_string(c.E));
    const int64_t T = c.T, H = c.H, E = c.E, G = fp8_blocks(H), k = std::min<int64_t>(4, E);
    std::vector<ref::bf16> x = random_bf16(size_t(T * H), rng);
    patch_special_groups(x, T, H);
    const std::vector<ref::bf16> wg = random_bf16(size_t(E * H), rng, 1.0f / 64);
    DeviceBuffer<ref::bf16> d_x(x), d_wg(wg);
    DeviceBuffer<float> d_logits(size_t(T * E)), d_w(size_t(T * k)), d_scale(size_t(T * G));
    DeviceBuffer<int32_t> d_ids(size_t(T * k));
    DeviceBuffer<fp8> d_q(size_t(T * H));
    RouterPlan plan;
    plan.gate = c.gate;
    plan.quantize_x = true;
    RouterOptions opt;
    const Tensor tx(d_x.ptr, DType::bf16, {T, H}), twg(d_wg.ptr, DType::bf16, {E, H});
    const kernels::router::Params p =
        detail::router_params(tx, twg, Tensor(), Tensor(), opt, d_ids.ptr, d_w.ptr, T, E, k);
    auto run = [&](bool quantize, int mode) {  // mode 0: eager; 1: a captured graph, replayed twice
      d_logits.poison(), d_ids.poison(), d_q.poison(), d_scale.poison();
      const detail::XQuant xq = quantize ? detail::XQuant{d_q.ptr, d_scale.ptr} : detail::XQuant{};
      GateRun r;
      if (mode == 0) {
        r.quantized = detail::launch_route(plan, p, DType::bf16, d_logits.ptr, stream, xq);
      } else {
        const CapturedGraph g(stream, [&] { r.quantized = detail::launch_route(plan, p, DType::bf16, d_logits.ptr, stream, xq); });
        g.launch(stream);
        d_q.poison(), d_scale.poison();
        g.launch(stream);
      }
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
      r.logits = d_logits.download(), r.ids = d_ids.download(), r.x_q = d_q.download();
      r.x_scale = float_bits(d_scale.download());
      return r;
    };
    const GateRun plain = run(false, 0), fused = run(true, 0), again = run(true, 0), graph = run(true, 1);
    ASSERT_FALSE(plain.quantized);
    ASSERT_TRUE(fused.quantized);
    std::vector<fp8> want_q(size_t(T * H));
    std::vector<float> want_s(size_t(T * G));
    ref::quantize_tokens(x.data(), T, H, want_q.data(), want_s.data());
    EXPECT_EQ(fused.x_q, want_q);
    EXPECT_EQ(fused.x_scale, float_bits(want_s));
    EXPECT_EQ(float_bits(fused.logits), float_bits(plain.logits)) << "quantizing changed the logits";
    EXPECT_EQ(fused.ids, plain.ids);
    EXPECT_EQ(again.x_q, fused.x_q);
    EXPECT_EQ(again.x_scale, fused.x_scale);
    EXPECT_EQ(graph.x_q, fused.x_q);
    EXPECT_EQ(graph.x_scale, fused.x_scale);
    EXPECT_EQ(float_bits(graph.logits), float_bits(fused.logits));
  }
}

// The planner asks the gate to quantize where it can; moe_forward then skips quantize_tokens' pass,
// and its y is bitwise experts_forward's (which runs the pass) on the routing moe_forward chose.
TEST_F(GateQuantizeTest, MoeForwardWithTheRoutersXqEqualsExpertsForward) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const MoeShape& s : {MoeShape{5, 1024, 256, 16, 4}, MoeShape{200, 2048, 128, 8, 2}}) {
    const ForwardPlan plan = plan_forward(s, query_device(), Precision::fp8);
    SCOPED_TRACE(plan.str());
    ASSERT_TRUE(plan.router.quantize_x);
    const int64_t T = s.tokens, H = s.hidden, F = s.inter, E = s.experts;
    DeviceBuffer<ref::bf16> d_x(random_bf16(size_t(T * H), rng)), d_wg(random_bf16(size_t(E * H), rng, 1.0f / 32));
    std::vector<fp8> w13(size_t(E * 2 * F * H)), w2(size_t(E * H * F));
    for (auto& q : w13) q = fp8(rng() % 0x7e);  // finite e4m3 (0x7f is NaN), both signs below
    for (auto& q : w2) q = fp8(rng() % 0x7e);
    for (size_t i = 0; i < w13.size(); i += 2) w13[i] |= 0x80;
    for (size_t i = 1; i < w2.size(); i += 2) w2[i] |= 0x80;
    DeviceBuffer<fp8> d_w13(w13), d_w2(w2);
    DeviceBuffer<float> d_s13(random_f32(size_t(E * w13_scale_rows(F) * fp8_blocks(H)), rng, 1.0f / 4096)),
        d_s2(random_f32(size_t(E * fp8_blocks(H) * fp8_blocks(F)), rng, 1.0f / 4096));
    const ExpertWeights w{Tensor(d_w13.ptr, DType::e4m3, {E, 2 * F, H}), Tensor(d_w2.ptr, DType::e4m3, {E, H, F}),
                          Tensor(d_s13.ptr, DType::f32, {E, w13_scale_rows(F), fp8_blocks(H)}),
                          Tensor(d_s2.ptr, DType::f32, {E, fp8_blocks(H), fp8_blocks(F)})};
    DeviceBuffer<unsigned char> ws_a(workspace_bytes(plan)), ws_b(workspace_bytes(plan));
    DeviceBuffer<ref::bf16> y_a(size_t(T * H)), y_b(size_t(T * H));
    ws_a.poison(), ws_b.poison(), y_a.poison(), y_b.poison();
    const Tensor tx(d_x.ptr, DType::bf16, {T, H});
    MoeInputs in{tx, Tensor(d_wg.ptr, DType::bf16, {E, H}), {}, {}, w.w13, w.w2, w.w13_scale, w.w2_scale};
    RouterOptions opt;
    opt.renormalize = true;
    moe_forward(plan, in, opt, Tensor(y_a.ptr, DType::bf16, {T, H}), ws_a.ptr, ws_a.count, stream);
    const Workspace wa = carve_workspace(plan, ws_a.ptr, ws_a.count);
    experts_forward(plan, tx, w, Tensor(wa.topk_ids.data, DType::i32, {T, s.topk}),
                    Tensor(wa.topk_weights.data, DType::f32, {T, s.topk}), Tensor(y_b.ptr, DType::bf16, {T, H}),
                    ws_b.ptr, ws_b.count, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<ref::bf16> a = y_a.download(), b = y_b.download();
    EXPECT_EQ(a, b);
    EXPECT_TRUE(std::none_of(a.begin(), a.end(), [](ref::bf16 v) { return v == 0xffff; })) << "y left unwritten";
  }
}

}  // namespace
}  // namespace moekit::test
