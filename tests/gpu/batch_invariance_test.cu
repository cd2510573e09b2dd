// batch_invariance_test.cu — a token's outputs are a function of its own inputs, the weights and
// the plan's kernels, and of nothing else in the batch (docs/design.md, "Rules every kernel
// keeps"): the same token in two batches of different sizes, whose other tokens differ in value
// and routing (so its rows sit at other positions of other blocks), gets bitwise the same y (bf16
// and FP8, every compiled tile pair and down split), the same routing and y through the whole layer
// (router included), and bitwise the same dx, d_topk_weights and d_router_logits from the
// backward, as long as both batches run the same kernels. The planner picks kernels from T, so
// the second batch is planned with the first one's configs (plan_forward_with; the backward's
// kernels and dx split pinned likewise).
//   build/tests/moekit_gpu_tests --gtest_filter='BatchInvarianceTest.*'
#include <cstdio>
#include <string>

#include "backward_run.hpp"

namespace moekit::test {
namespace {

// The shared tokens: kShared of them, first in batch A (then kOthersA others) and last in batch B
// (after kOthersB others). kOthersB is a multiple of none of the block sizes (16, 32, 64, 128), so
// in B each shared row moves within its block, not only to another block.
constexpr int64_t kShared = 100, kOthersA = 60, kOthersB = 300;
constexpr int64_t kTa = kShared + kOthersA, kTb = kOthersB + kShared;
constexpr int64_t kFirstSharedB = kOthersB;  // batch B's row of shared token 0
// Partial tiles and FP8 blocks: H = 384 (1.5 column tiles of 256), F = 320 (2.5 blocks of 128).
constexpr int64_t kH = 384, kF = 320, kE = 8, kK = 2;

MoeShape shape_of(int64_t T) { return {T, kH, kF, kE, kK}; }

// Rows [begin, begin + n) of a row-major [*, width] array.
template <class T>
std::vector<T> rows(const std::vector<T>& v, int64_t width, int64_t begin, int64_t n) {
  return std::vector<T>(v.begin() + begin * width, v.begin() + (begin + n) * width);
}
template <class T>
void put_rows(std::vector<T>& v, int64_t width, int64_t begin, const std::vector<T>& src) {
  std::copy(src.begin(), src.end(), v.begin() + begin * width);
}

// One batch of the forward: x, routing, the shared tokens at row `shared0`.
struct Batch {
  int64_t T = 0, shared0 = 0;
  std::vector<ref::bf16> x;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// A (shared first, uniform others) and B (others first, every one on experts E-1 and 0, then the
// shared tokens): the shared tokens' x, ids and weights equal in both.
std::pair<Batch, Batch> make_batches(std::mt19937_64& rng) {
  auto random_batch = [&](int64_t T, RoutingKind kind) {
    Batch b;
    b.T = T;
    b.x = random_bf16(size_t(T * kH), rng);
    b.ids = make_routing(kind, T, kK, kE, rng);
    b.weights.resize(size_t(T * kK));
    for (float& w : b.weights) w = float(rng() % 1000 + 1) / 1000.0f;
    return b;
  };
  Batch a = random_batch(kTa, RoutingKind::Uniform), b = random_batch(kTb, RoutingKind::AllOnOne);
  a.shared0 = 0, b.shared0 = kFirstSharedB;
  put_rows(b.x, kH, kFirstSharedB, rows(a.x, kH, 0, kShared));
  put_rows(b.ids, kK, kFirstSharedB, rows(a.ids, kK, 0, kShared));
  put_rows(b.weights, kK, kFirstSharedB, rows(a.weights, kK, 0, kShared));
  return {std::move(a), std::move(b)};
}

// The expert weights on the device, bf16 and their FP8 form (the checkpoint quantizer's).
struct Weights {
  DeviceBuffer<ref::bf16> w13, w2;
  DeviceBuffer<ref::fp8> w13_q, w2_q;
  DeviceBuffer<float> w13_s, w2_s;
  explicit Weights(std::mt19937_64& rng) {
    const std::vector<ref::bf16> h13 = random_bf16(size_t(kE * 2 * kF * kH), rng, 1.0f / std::sqrt(float(kH)));
    const std::vector<ref::bf16> h2 = random_bf16(size_t(kE * kH * kF), rng, 1.0f / std::sqrt(float(kF)));
    std::vector<ref::fp8> q13(h13.size()), q2(h2.size());
    std::vector<float> s13(size_t(kE * w13_scale_rows(kF) * fp8_blocks(kH)));
    std::vector<float> s2(size_t(kE * fp8_blocks(kH) * fp8_blocks(kF)));
    ref::quantize_weight_blocks(to_float(h13).data(), 2 * kE, kF, kH, q13.data(), s13.data());
    ref::quantize_weight_blocks(to_float(h2).data(), kE, kH, kF, q2.data(), s2.data());
    w13 = DeviceBuffer<ref::bf16>(h13), w2 = DeviceBuffer<ref::bf16>(h2);
    w13_q = DeviceBuffer<ref::fp8>(q13), w2_q = DeviceBuffer<ref::fp8>(q2);
    w13_s = DeviceBuffer<float>(s13), w2_s = DeviceBuffer<float>(s2);
  }
  ExpertWeights of(Precision p) const {
    if (p == Precision::bf16)
      return {Tensor(w13.ptr, DType::bf16, {kE, 2 * kF, kH}), Tensor(w2.ptr, DType::bf16, {kE, kH, kF}), {}, {}};
    return {Tensor(w13_q.ptr, DType::e4m3, {kE, 2 * kF, kH}), Tensor(w2_q.ptr, DType::e4m3, {kE, kH, kF}),
            Tensor(w13_s.ptr, DType::f32, {kE, w13_scale_rows(kF), fp8_blocks(kH)}),
            Tensor(w2_s.ptr, DType::f32, {kE, fp8_blocks(kH), fp8_blocks(kF)})};
  }
};

class BatchInvarianceTest : public GpuTest {
 protected:
  // The shared tokens' y rows of one experts_forward of `b` under `plan` (poisoned y and workspace).
  std::vector<ref::bf16> shared_y(const ForwardPlan& plan, const Batch& b, const Weights& w) {
    const int64_t T = b.T;
    DeviceBuffer<ref::bf16> x(b.x), y(size_t(T * kH));
    DeviceBuffer<int32_t> ids(b.ids);
    DeviceBuffer<float> wts(b.weights);
    DeviceBuffer<unsigned char> ws(workspace_bytes(plan));
    ws.poison(), y.poison();
    experts_forward(plan, Tensor(x.ptr, DType::bf16, {T, kH}), w.of(plan.precision()),
                    Tensor(ids.ptr, DType::i32, {T, kK}), Tensor(wts.ptr, DType::f32, {T, kK}),
                    Tensor(y.ptr, DType::bf16, {T, kH}), ws.ptr, ws.count, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    return rows(y.download(), kH, b.shared0, kShared);
  }
};

// experts_forward: every compiled (up, down) pair of one block_m and down split 1, 2 and 4 where
// the pair allows it, bf16 and FP8; batch B planned with batch A's kernels.
TEST_F(BatchInvarianceTest, ExpertsForwardRowsDependOnTheTokenAndTheKernelsAlone) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto [a, b] = make_batches(rng);
  const Weights w(rng);
  int ran[2][2] = {};  // [precision][wgmma down]
  int split_runs = 0;
  for (Precision prec : {Precision::bf16, Precision::fp8}) {
    const std::vector<GemmConfig>& configs = compiled_gemm_configs(prec);
    for (const GemmConfig& up : configs)
      for (const GemmConfig& down : configs)
        for (int splits : {1, 2, 4}) {
          if (up.block_m != down.block_m) continue;
          ForwardPlan pa, pb;
          try {
            pa = plan_forward_with(shape_of(kTa), up, down, splits);
            pb = plan_forward_with(shape_of(kTb), up, down, splits);
          } catch (const Error&) {
            continue;  // a pair or split the kernels do not take (fp8 up tiles, wgmma splits)
          }
          SCOPED_TRACE(pa.str());
          const std::vector<ref::bf16> ya = shared_y(pa, a, w), yb = shared_y(pb, b, w);
          ASSERT_EQ(ya, yb) << "a shared token's y differs between batches of " << kTa << " and " << kTb << " tokens";
          ++ran[int(prec)][int(down.kernel == GemmKernel::wgmma)];
          split_runs += splits > 1;
        }
  }
  // Not vacuous: both precisions on both kernel families, and split-K downs.
  for (int p = 0; p < 2; ++p)
    for (int k = 0; k < 2; ++k) EXPECT_GT(ran[p][k], 0) << "precision " << p << (k ? " wgmma" : " mma.sync");
  EXPECT_GT(split_runs, 0);
}

// moe_forward, the router included (logits from w_gate on the tensor cores, whose gate kernel the
// plan picks from T: batch-invariant by its own contract): the shared tokens' logits, routing and
// y, bitwise, each batch's planner configs run on both batches, bf16 and FP8.
TEST_F(BatchInvarianceTest, WholeLayerRowsDependOnTheTokenAlone) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto [a, b] = make_batches(rng);  // the routing comes from the router here, not these ids
  const Weights w(rng);
  const DeviceBuffer<ref::bf16> w_gate(random_bf16(size_t(kE * kH), rng, 1.0f / std::sqrt(float(kH))));
  RouterOptions opt;
  opt.renormalize = true;
  struct Out {
    std::vector<ref::bf16> y;
    std::vector<float> logits, weights;
    std::vector<int32_t> ids;
  };
  auto run = [&](const ForwardPlan& plan, const Batch& batch) {
    const int64_t T = batch.T;
    DeviceBuffer<ref::bf16> x(batch.x), y(size_t(T * kH));
    DeviceBuffer<unsigned char> ws_buf(workspace_bytes(plan));
    ws_buf.poison(), y.poison();
    MoeInputs in;
    in.x = Tensor(x.ptr, DType::bf16, {T, kH});
    in.w_gate = Tensor(w_gate.ptr, DType::bf16, {kE, kH});
    const ExpertWeights ew = w.of(plan.precision());
    in.w13 = ew.w13, in.w2 = ew.w2, in.w13_scale = ew.w13_scale, in.w2_scale = ew.w2_scale;
    moe_forward(plan, in, opt, Tensor(y.ptr, DType::bf16, {T, kH}), ws_buf.ptr, ws_buf.count, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    const Workspace ws = carve_workspace(plan, ws_buf.ptr, ws_buf.count);
    auto copy = [](auto& v, const Tensor& t) {
      v.resize(size_t(t.numel()));
      MK_CUDA_CHECK(cudaMemcpy(v.data(), t.data, size_t(t.bytes()), cudaMemcpyDeviceToHost));
    };
    Out o;
    copy(o.logits, ws.router_logits), copy(o.ids, ws.topk_ids), copy(o.weights, ws.topk_weights);
    o.y = rows(y.download(), kH, batch.shared0, kShared);
    o.logits = rows(o.logits, kE, batch.shared0, kShared);
    o.ids = rows(o.ids, kK, batch.shared0, kShared);
    o.weights = rows(o.weights, kK, batch.shared0, kShared);
    return o;
  };
  // Each batch's own planner choice of configs, run on both batches; bf16 and FP8 (whose x is
  // quantized by the gate where its tiling reads whole 128-column groups, else by its own pass).
  for (Precision prec : {Precision::bf16, Precision::fp8})
  for (const int64_t T : {kTa, kTb}) {
    const ForwardPlan planned = plan_forward(shape_of(T), query_device(), prec);
    const ForwardPlan pa = plan_forward_with(shape_of(kTa), planned.up, planned.down, planned.down_splits);
    const ForwardPlan pb = plan_forward_with(shape_of(kTb), planned.up, planned.down, planned.down_splits);
    SCOPED_TRACE(pa.str() + " | " + pb.str());
    const Out oa = run(pa, a), ob = run(pb, b);
    EXPECT_EQ(float_bits(oa.logits), float_bits(ob.logits)) << "router logits";
    EXPECT_EQ(oa.ids, ob.ids) << "topk_ids";
    EXPECT_EQ(float_bits(oa.weights), float_bits(ob.weights)) << "topk_weights";
    EXPECT_EQ(oa.y, ob.y) << "y";
  }
}

// moe_backward: the shared tokens' dx, d_topk_weights and (RouterGrad::logits) d_router_logits,
// bitwise, for both SavedActivations modes and every RouterGrad mode; batch B on batch A's forward
// configs and backward kernels (tile rows, wgmma GEMMs, dx split). dW and d_w_gate sum over the
// batch's tokens: not per-token outputs, so not compared.
TEST_F(BatchInvarianceTest, BackwardRowsDependOnTheTokenAndTheKernelsAlone) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (SavedActivations saved : {SavedActivations::recompute, SavedActivations::h})
    for (RouterGrad router : {RouterGrad::none, RouterGrad::logits, RouterGrad::gate})
      for (int block_m : {0, 16, 128}) {  // the planner's layout of A, then 16- and 128-row layouts
        BackwardOptions o = options(saved, router);
        // Case A, then case B from fresh values with A's weights and A's shared tokens copied in.
        Case ca = make_case(shape_of(kTa), rng, router, softmax_renorm());
        Case cb = make_case(shape_of(kTb), rng, router, softmax_renorm(), DType::bf16,
                            router == RouterGrad::none ? make_routing(RoutingKind::AllOnOne, kTb, kK, kE, rng)
                                                       : std::vector<int32_t>{});
        cb.w13 = ca.w13, cb.w2 = ca.w2, cb.w_gate = ca.w_gate;
        put_rows(cb.x, kH, kFirstSharedB, rows(ca.x, kH, 0, kShared));
        put_rows(cb.dy, kH, kFirstSharedB, rows(ca.dy, kH, 0, kShared));
        if (router == RouterGrad::none) {
          put_rows(cb.ids, kK, kFirstSharedB, rows(ca.ids, kK, 0, kShared));
          put_rows(cb.weights, kK, kFirstSharedB, rows(ca.weights, kK, 0, kShared));
        } else {  // B's logits (the gate's from its x, or A's shared rows), then its routing from them
          if (router == RouterGrad::gate)
            cb.logits = ref::router_logits(cb.x.data(), cb.w_gate_ptr(), DType::bf16, kTb, kH, kE);
          else
            put_rows(cb.logits, kE, kFirstSharedB, rows(ca.logits, kE, 0, kShared));
          const ref::Routing r = ref::route(cb.logits.data(), nullptr, kTb, kE, kK, cb.opt);
          cb.ids = r.ids, cb.weights = r.weights;
        }
        ForwardPlan fa = forward_plan(shape_of(kTa), block_m);
        ForwardPlan fb = plan_forward_with(shape_of(kTb), fa.up, fa.down, fa.down_splits);
        fa.save_h = fb.save_h = saved == SavedActivations::h;  // h from the training forward
        SCOPED_TRACE(name_of(shape_of(kTa), block_m, o, seed));
        BackwardRun ra(fa, o, std::move(ca), stream, rng);
        BackwardRun rb(fb, o, std::move(cb), stream, rng, true, PlanOverride::kernels_of(ra.plan));
        SCOPED_TRACE(ra.plan.str() + " | " + rb.plan.str());
        ASSERT_EQ(ra.plan.dx_splits, rb.plan.dx_splits);
        ASSERT_EQ(ra.plan.dx_wgmma, rb.plan.dx_wgmma);
        const Outputs oa = ra.run(stream), ob = rb.run(stream);
        EXPECT_EQ(rows(oa.dx, kH, 0, kShared), rows(ob.dx, kH, kFirstSharedB, kShared)) << "dx";
        EXPECT_EQ(float_bits(rows(oa.d_topk, kK, 0, kShared)), float_bits(rows(ob.d_topk, kK, kFirstSharedB, kShared)))
            << "d_topk_weights";
        if (router == RouterGrad::logits)
          EXPECT_EQ(float_bits(rows(oa.d_router_logits, kE, 0, kShared)),
                    float_bits(rows(ob.d_router_logits, kE, kFirstSharedB, kShared)))
              << "d_router_logits";
        if (saved == SavedActivations::h)  // the training forward's y, through the same kernels
          EXPECT_EQ(rows(ra.y.download(), kH, 0, kShared), rows(rb.y.download(), kH, kFirstSharedB, kShared)) << "y";
      }
}

}  // namespace
}  // namespace moekit::test
