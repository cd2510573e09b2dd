// router_test.cu — stage 1 on the GPU against the CPU oracle, bitwise: ids and weights equal.
// (Tensor-core logits — a bf16 w_gate with a scratch — are bounded against the oracle's, and the
// selection is bitwise from them.)
#include <cmath>
#include <cstring>
#include <string>

#include "gpu_util.hpp"

namespace moekit::test {
namespace {

struct RouterCase {
  int64_t T, H, E, k;
  Scoring scoring;
  bool renormalize, bias, logits_given, w_gate_f32;
  int64_t n_group, topk_group;
  float scale;
};

class RouterTest : public GpuTest {
 protected:
  // Runs the GPU router and the oracle on the same inputs; returns nothing, asserts bitwise.
  void check(const RouterCase& c, std::vector<float> logits_override = {}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                 " k=" + std::to_string(c.k));
    std::mt19937_64 rng(seed);
    const auto x = random_bf16(size_t(c.T * c.H), rng);
    const auto wg_bf16 = random_bf16(size_t(c.E * c.H), rng, 1.0f / std::sqrt(float(c.H)));
    std::vector<float> wg_f32(static_cast<size_t>(c.E * c.H));
    for (size_t i = 0; i < wg_f32.size(); ++i) wg_f32[i] = ref::to_float(wg_bf16[i]) * 1.25f;
    auto logits = logits_override.empty() ? random_f32(size_t(c.T * c.E), rng, 2.0f) : logits_override;
    const auto bias = random_f32(size_t(c.E), rng, 0.5f);

    DeviceBuffer<ref::bf16> d_x(x);
    DeviceBuffer<ref::bf16> d_wg16(wg_bf16);
    DeviceBuffer<float> d_wg32(wg_f32), d_logits(logits), d_bias(bias);
    DeviceBuffer<int32_t> d_ids(static_cast<size_t>(c.T * c.k));
    DeviceBuffer<float> d_w(static_cast<size_t>(c.T * c.k));
    d_ids.poison();
    d_w.poison();

    RouterOptions opt;
    opt.scoring = c.scoring;
    opt.renormalize = c.renormalize;
    opt.n_group = c.n_group;
    opt.topk_group = c.topk_group;
    opt.routed_scaling_factor = c.scale;
    Tensor tx(d_x.ptr, DType::bf16, {c.T, c.H});
    Tensor twg = c.w_gate_f32 ? Tensor(d_wg32.ptr, DType::f32, {c.E, c.H}) : Tensor(d_wg16.ptr, DType::bf16, {c.E, c.H});
    Tensor tlog = c.logits_given ? Tensor(d_logits.ptr, DType::f32, {c.T, c.E}) : Tensor();
    Tensor tbias = c.bias ? Tensor(d_bias.ptr, DType::f32, {c.E}) : Tensor();
    // Logits computed from x and w_gate: both the fused path and the scratch (multi-CTA) path.
    DeviceBuffer<float> d_scratch(static_cast<size_t>(c.T * c.E));
    for (bool scratch : {false, true}) {
      if (scratch && c.logits_given) break;
      SCOPED_TRACE(scratch ? "logits through scratch" : "fused logits");
      d_ids.poison();
      d_w.poison();
      route(tx, c.logits_given ? Tensor() : twg, tlog, tbias, opt, Tensor(d_ids.ptr, DType::i32, {c.T, c.k}),
            Tensor(d_w.ptr, DType::f32, {c.T, c.k}), stream,
            scratch ? Tensor(d_scratch.ptr, DType::f32, {c.T, c.E}) : Tensor());
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (scratch && !c.w_gate_f32) {
        // Tensor-core logits: within the bound of the oracle's, and the selection bitwise the
        // oracle's selection from those logits.
        const std::vector<float> got = d_scratch.download();
        std::string first;
        EXPECT_EQ(ref::logits_beyond_bound(got.data(), x.data(), wg_bf16.data(), c.T, c.H, c.E, &first), 0) << first;
        RouterCase given = c;
        given.logits_given = true;
        expect_equal(given, got, bias, opt, d_ids.download(), d_w.download(), x, wg_bf16, wg_f32);
        continue;
      }
      expect_equal(c, logits, bias, opt, d_ids.download(), d_w.download(), x, wg_bf16, wg_f32);
    }
  }

  void expect_equal(const RouterCase& c, std::vector<float> logits, const std::vector<float>& bias,
                    const RouterOptions& opt, const std::vector<int32_t>& ids, const std::vector<float>& w,
                    const std::vector<ref::bf16>& x, const std::vector<ref::bf16>& wg_bf16,
                    const std::vector<float>& wg_f32) {
    if (!c.logits_given)
      logits = c.w_gate_f32 ? ref::router_logits(x.data(), wg_f32.data(), DType::f32, c.T, c.H, c.E)
                            : ref::router_logits(x.data(), wg_bf16.data(), DType::bf16, c.T, c.H, c.E);
    const ref::Routing want = ref::route(logits.data(), c.bias ? bias.data() : nullptr, c.T, c.E, c.k, opt);
    for (int64_t i = 0; i < c.T * c.k; ++i) {
      ASSERT_EQ(ids[size_t(i)], want.ids[size_t(i)]) << "token " << i / c.k << " slot " << i % c.k;
      uint32_t a, b;
      std::memcpy(&a, &w[size_t(i)], 4);
      std::memcpy(&b, &want.weights[size_t(i)], 4);
      ASSERT_EQ(a, b) << "weight bits differ at token " << i / c.k << " slot " << i % c.k << ": " << w[size_t(i)]
                      << " vs " << want.weights[size_t(i)];
    }
  }
};

TEST_F(RouterTest, SoftmaxFromLogitsEverySize) {
  for (int64_t E : {8, 32, 33, 64, 128, 256, 512})
    for (int64_t k : {1, 2, 8, 16})
      if (k <= E) check({37, 64, E, k, Scoring::softmax, true, false, true, false, 0, 0, 1.0f});
}

TEST_F(RouterTest, LogitsFromXAndWGate) {
  check({19, 4096, 8, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});    // mixtral-like
  check({21, 2048, 128, 8, Scoring::softmax, true, false, false, true, 0, 0, 1.0f});   // f32 w_gate
  check({5, 7168, 256, 8, Scoring::sigmoid, true, true, false, false, 8, 4, 2.5f});    // deepseek-like
  check({3, 72, 40, 3, Scoring::softmax, false, false, false, false, 0, 0, 1.0f});      // H not /256
}

// Every tile instance of the tensor-core logits (clusters: T <= 16, then 32-row tiles with E <= 8
// or more while they are at most 128, up to T = 2048; one CTA per tile walking the slices beyond;
// the pipelined tiles from 64 of them) on the model shapes, H not a multiple of a step or a slice,
// and experts not a multiple of a tile.
TEST_F(RouterTest, TensorCoreLogitsEveryInstance) {
  for (int64_t T : {1, 2, 16, 17, 100, 257, 300})
    for (int64_t H : {4096, 2056, 72, 8}) {
      check({T, H, 8, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});
      check({T, H, 40, 3, Scoring::softmax, false, false, false, false, 0, 0, 1.0f});
    }
  check({33, 7168, 256, 8, Scoring::sigmoid, true, true, false, false, 8, 4, 2.5f});
  check({70, 2048, 128, 8, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});
  check({9, 1024, 512, 16, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});
  check({1000, 7168, 256, 8, Scoring::sigmoid, true, true, false, false, 8, 4, 2.5f});  // deepseek-like: looped 64 x 32
  check({700, 4096, 8, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});      // mixtral-like: 22 cluster tiles
  check({2100, 2056, 8, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});     // looped 64 x 8: past T = 2048
  check({2100, 72, 40, 3, Scoring::softmax, false, false, false, false, 0, 0, 1.0f});     // looped 64 x 32: 132 cluster tiles
  // The pipelined tiles (from 64 of the 128 x 64 ones), 128 x 32 up to 66 of them: 16 x 7, the
  // last token tile and expert tile partial; then 128 x 64: 17 x 4 and 34 x 4.
  check({2000, 2048, 200, 8, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});
  check({2100, 2048, 200, 8, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});
  check({4300, 2048, 200, 8, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});
}

// Small cases of every tensor-core kernel for the sanitizers (gpu-check: memcheck, racecheck).
TEST_F(RouterTest, TensorCoreLogitsSmall) {
  for (int64_t T : {3, 40, 257})
    for (int64_t E : {8, 40}) check({T, 520, E, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});
  check({1950, 520, 250, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});  // pipelined 128 x 32: 16 x 8 tiles
  check({2050, 520, 300, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});  // pipelined 128 x 64: 17 x 5
  check({2100, 520, 8, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});    // looped 64 x 8
  check({2100, 520, 40, 2, Scoring::softmax, true, false, false, false, 0, 0, 1.0f});   // looped 64 x 32
}

// A token's tensor-core logits do not depend on the batch: the same rows give bitwise the same
// logits at T = 1, 16 (decode clusters), 17 and 300 (32-row clusters), 2000 and 4300 (E = 200,
// 256: the pipelined 128 x 32 and 128 x 64 tiles, the last token tile partial; E = 8, 64: a CTA
// walking the slices), and on a second run. The order's blocks (gate/order.cuh): H = 2048, 16
// blocks, two roles a slice; H = 7168, 56 blocks, role 7 of every slice empty; H = 72, one partial
// block, slices 1-7 empty; H = 9000, 71 blocks (the last partial), roles of two blocks (b, b + 64);
// the warps' split of a slice's roles (warp_partial.cuh): 4 warps a role at H = 2048, 2 at 4096,
// and at 2560 (20 blocks) 2 in slices 0-3 and 4 in slices 4-7.
TEST_F(RouterTest, TensorCoreLogitsBatchInvariantAndDeterministic) {
  for (int64_t H : {2048, 7168, 72, 9000, 4096, 2560})
  for (int64_t E : {8, 64, 200, 256}) {
    const int64_t Tmax = 4300;
    SCOPED_TRACE("H=" + std::to_string(H));
    std::mt19937_64 rng(fresh_seed());
    const auto x = random_bf16(size_t(Tmax * H), rng);
    const auto wg = random_bf16(size_t(E * H), rng, 1.0f / std::sqrt(float(H)));
    DeviceBuffer<ref::bf16> d_x(x), d_wg(wg);
    DeviceBuffer<int32_t> d_ids(size_t(Tmax * 2));
    DeviceBuffer<float> d_w(size_t(Tmax * 2)), d_logits(size_t(Tmax * E));
    std::vector<float> first;
    for (int64_t T : {Tmax, int64_t(1), int64_t(16), int64_t(17), int64_t(300), int64_t(2000), Tmax}) {
      SCOPED_TRACE("E=" + std::to_string(E) + " T=" + std::to_string(T));
      d_logits.poison();
      route(Tensor(d_x.ptr, DType::bf16, {T, H}), Tensor(d_wg.ptr, DType::bf16, {E, H}), Tensor(), Tensor(),
            RouterOptions{}, Tensor(d_ids.ptr, DType::i32, {T, 2}), Tensor(d_w.ptr, DType::f32, {T, 2}), stream,
            Tensor(d_logits.ptr, DType::f32, {T, E}));
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> got = d_logits.download();
      if (first.empty()) {
        first = got;
        continue;
      }
      ASSERT_EQ(std::memcmp(got.data(), first.data(), size_t(T * E) * 4), 0) << "logits differ from the first (T=4300) run";
    }
  }
}

TEST_F(RouterTest, SigmoidBiasGroupedScaled) {
  check({64, 64, 256, 8, Scoring::sigmoid, true, true, true, false, 8, 4, 2.5f});
  check({64, 64, 64, 6, Scoring::sigmoid, false, true, true, false, 4, 2, 1.0f});
  check({64, 64, 64, 4, Scoring::softmax, true, false, true, false, 8, 3, 1.0f});  // groups, no bias: max
  check({64, 64, 512, 16, Scoring::sigmoid, true, true, true, false, 32, 8, 1.5f});
}

TEST_F(RouterTest, TiedScoresLowerIdWins) {
  // Every logit equal: the k lowest ids, in order. Then pairs of ties scattered over the row.
  const int64_t T = 8, E = 64, k = 8;
  check({T, 64, E, k, Scoring::softmax, true, false, true, false, 0, 0, 1.0f}, std::vector<float>(size_t(T * E), 0.5f));
  std::vector<float> logits(static_cast<size_t>(T * E));
  for (int64_t i = 0; i < T * E; ++i) logits[size_t(i)] = float((i * 7) % 5);
  check({T, 64, E, k, Scoring::softmax, true, false, true, false, 0, 0, 1.0f}, logits);
  check({T, 64, E, k, Scoring::sigmoid, true, true, true, false, 8, 2, 1.0f}, logits);
}

TEST_F(RouterTest, NanLogitsStillGiveDistinctIds) {
  const int64_t T = 4, E = 16, k = 4;
  std::vector<float> logits(size_t(T * E), 1.0f);
  for (int64_t i = 0; i < T * E; i += 3) logits[size_t(i)] = NAN;
  check({T, 64, E, k, Scoring::sigmoid, false, false, true, false, 0, 0, 1.0f}, logits);
}

// The CTA-per-token selection (router_cta_kernel: logits in memory, 128 < E <= 256, T <= 1024) and
// the warp-per-token one on both sides of each switch, each bitwise the oracle: every group path
// (size 32 by warp reductions, other sizes by the scan), odd warp counts, ties, NaNs (whose weights
// are written as one NaN, canon::weight_out).
TEST_F(RouterTest, CtaPerTokenSelectionEveryPath) {
  for (int64_t T : {1, 1024, 1025}) check({T, 64, 256, 8, Scoring::sigmoid, true, true, true, false, 8, 4, 2.5f});
  check({7, 64, 160, 6, Scoring::sigmoid, true, true, true, false, 20, 5, 1.0f});   // groups of 8, bias
  check({7, 64, 160, 8, Scoring::softmax, true, false, true, false, 5, 2, 1.0f});   // 5 groups of 32, max
  check({5, 64, 200, 16, Scoring::softmax, false, false, true, false, 0, 0, 1.0f}); // 7 warps, k = 16
  check({3, 64, 129, 2, Scoring::sigmoid, true, true, true, false, 0, 0, 1.0f});    // one expert in warp 4
  check({3, 64, 128, 2, Scoring::sigmoid, true, true, true, false, 0, 0, 1.0f});    // the warp kernel
  check({4, 64, 256, 8, Scoring::sigmoid, true, true, true, false, 4, 2, 1.0f});     // groups of 64
  check({4, 64, 256, 8, Scoring::sigmoid, true, true, true, false, 32, 8, 1.0f});    // 32 groups of 8
  check({4, 64, 160, 8, Scoring::softmax, true, false, true, false, 1, 1, 1.0f});    // one group
  check({5, 64, 160, 8, Scoring::softmax, true, false, false, true, 0, 0, 1.0f});    // f32 w_gate via scratch
  // router_kernel<8, void> above the switch: softmax, the general group scan, E not a multiple of 32.
  check({1025, 64, 200, 8, Scoring::softmax, true, false, true, false, 0, 0, 1.0f});
  check({1025, 64, 160, 6, Scoring::sigmoid, true, true, true, false, 20, 5, 1.0f});
  const int64_t T = 6, E = 256, k = 8;
  // Finite ties inside and across warps (no bias): experts 30, 31, 62, 63, ... tie at the top.
  std::vector<float> ties(static_cast<size_t>(T * E));
  for (int64_t i = 0; i < T * E; ++i) ties[size_t(i)] = (i % E) % 32 >= 30 ? 1.0f : 0.0f;
  check({T, 64, E, k, Scoring::softmax, true, false, true, false, 0, 0, 1.0f}, ties);
  // Every score equal, no bias: the group keys tie too (lower groups, then lower ids win).
  check({T, 64, E, k, Scoring::sigmoid, true, false, true, false, 8, 4, 1.0f}, std::vector<float>(size_t(T * E), 0.25f));
  check({T, 64, E, k, Scoring::sigmoid, true, true, true, false, 8, 4, 1.0f}, std::vector<float>(size_t(T * E), 0.25f));
  // NaN logits: under softmax any NaN makes every weight NaN (the sum is NaN); under sigmoid NaNs
  // rank below every number.
  std::vector<float> logits(static_cast<size_t>(T * E), 1.0f);
  for (int64_t i = 0; i < T * E; i += 3) logits[size_t(i)] = NAN;
  check({T, 64, E, k, Scoring::softmax, true, false, true, false, 0, 0, 1.0f}, logits);
  check({T, 64, E, k, Scoring::sigmoid, false, true, true, false, 8, 3, 1.0f}, logits);
  check({T, 64, E, k, Scoring::sigmoid, false, false, true, false, 0, 0, 1.0f}, logits);
}

TEST_F(RouterTest, EmptyInputIsValid) {
  RouterOptions opt;
  route(Tensor(), Tensor(), Tensor(reinterpret_cast<void*>(256), DType::f32, {0, 8}), Tensor(), opt,
        Tensor(nullptr, DType::i32, {0, 2}), Tensor(nullptr, DType::f32, {0, 2}), stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace
}  // namespace moekit::test
