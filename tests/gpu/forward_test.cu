// forward_test.cu — the whole layer (moe_forward) on the GPU against the naive per-expert loop:
// model-shaped presets, adversarial routings through the caller-given-ids entry, bitwise
// determinism, CUDA-graph capture and replay on new inputs, split-K down GEMMs (decode on mma.sync,
// prefill on wgmma), T = 0, and 64-bit offsets.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "gpu_util.hpp"
#include "hash_fill.hpp"

namespace moekit::test {
namespace {

// Three bf16 roundings (act, y_rows, y), each within 2^-9 relative, and act's rounding carried
// through the down GEMM: about 3·2^-9 ≈ 6e-3 at worst in norm; 1e-2 leaves margin for FP32
// accumulation without hiding a wrong row (a wrong row is O(1)).
constexpr double kLayerRelTol = 1e-2;

struct Seeds {
  uint64_t x, w_gate, w13, w2;
};

// One layer with hashed inputs: device buffers for everything, host slices on demand.
struct Layer {
  MoeShape s;
  RouterOptions opt;
  Seeds seeds;
  std::vector<float> bias;  // [E] or empty
  DeviceBuffer<ref::bf16> x, w_gate, w13, w2, y;
  DeviceBuffer<float> d_bias;
  ForwardPlan plan;
  DeviceBuffer<unsigned char> ws_buf;

  Layer(const MoeShape& shape, const RouterOptions& o, bool with_bias, uint64_t seed)
      : s(shape), opt(o), seeds{seed * 4 + 1, seed * 4 + 2, seed * 4 + 3, seed * 4 + 4},
        x(size_t(s.tokens * s.hidden)), w_gate(size_t(s.experts * s.hidden)),
        w13(size_t(s.experts * 2 * s.inter * s.hidden)), w2(size_t(s.experts * s.hidden * s.inter)),
        y(size_t(s.tokens * s.hidden)) {
    fill_x(seeds.x);
    hash_fill_device(w_gate.ptr, int64_t(w_gate.count), seeds.w_gate, 1.0f / std::sqrt(float(s.hidden)));
    hash_fill_device(w13.ptr, int64_t(w13.count), seeds.w13, 1.0f / std::sqrt(float(s.hidden)));
    hash_fill_device(w2.ptr, int64_t(w2.count), seeds.w2, 1.0f / std::sqrt(float(s.inter)));
    if (with_bias) {
      std::mt19937_64 rng(seed);
      bias = random_f32(size_t(s.experts), rng, 0.1f);
      d_bias = DeviceBuffer<float>(bias);
    }
    use_plan(plan_forward(s, query_device()));
    MK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The plan the layer runs, and a workspace of its size.
  void use_plan(const ForwardPlan& p) {
    plan = p;
    ws_buf = DeviceBuffer<unsigned char>(workspace_bytes(plan));
  }
  void fill_x(uint64_t seed) {
    seeds.x = seed;
    hash_fill_device(x.ptr, int64_t(x.count), seed, 1.0f);
  }
  MoeInputs inputs() const {
    MoeInputs in;
    in.x = Tensor(x.ptr, DType::bf16, {s.tokens, s.hidden});
    in.w_gate = Tensor(w_gate.ptr, DType::bf16, {s.experts, s.hidden});
    in.score_bias = bias.empty() ? Tensor() : Tensor(d_bias.ptr, DType::f32, {s.experts});
    in.w13 = Tensor(w13.ptr, DType::bf16, {s.experts, 2 * s.inter, s.hidden});
    in.w2 = Tensor(w2.ptr, DType::bf16, {s.experts, s.hidden, s.inter});
    return in;
  }
  Tensor y_view() const { return Tensor(y.ptr, DType::bf16, {s.tokens, s.hidden}); }
  Workspace ws() const { return carve_workspace(plan, ws_buf.ptr, ws_buf.count); }
  void forward(cudaStream_t stream) { moe_forward(plan, inputs(), opt, y_view(), ws_buf.ptr, ws_buf.count, stream); }

  template <class T>
  std::vector<T> download(const Tensor& t) const {
    std::vector<T> h(static_cast<size_t>(t.numel()));
    if (!h.empty()) MK_CUDA_CHECK(cudaMemcpy(h.data(), t.data, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

  // Checks routing (bitwise) and y (relative norm) of the sampled tokens against the oracle.
  void check_tokens(const std::vector<int64_t>& tokens) const {
    const Workspace w = ws();
    const auto ids = download<int32_t>(w.topk_ids);
    const auto wts = download<float>(w.topk_weights);
    const auto wg = hash_fill_host(0, s.experts * s.hidden, seeds.w_gate, 1.0f / std::sqrt(float(s.hidden)));
    // Host copies of the sampled rows and of the experts they touch (compacted and renumbered).
    std::vector<uint16_t> xs;
    std::map<int32_t, int32_t> local;
    std::vector<int32_t> local_ids;
    std::vector<float> local_w;
    for (int64_t t : tokens) {
      const auto row = hash_fill_host(t * s.hidden, s.hidden, seeds.x, 1.0f);
      xs.insert(xs.end(), row.begin(), row.end());
      for (int64_t j = 0; j < s.topk; ++j) {
        const int32_t e = ids[size_t(t * s.topk + j)];
        ASSERT_GE(e, 0);
        ASSERT_LT(e, s.experts);
        local.emplace(e, int32_t(local.size()));
        local_ids.push_back(local.at(e));
        local_w.push_back(wts[size_t(t * s.topk + j)]);
      }
    }
    const int64_t n = int64_t(tokens.size());
    // The layer's logits (tensor cores, in the workspace): within the bound of the oracle's; the
    // routing is then the oracle's selection from them, bitwise.
    std::vector<float> logits(size_t(n * s.experts));
    for (int64_t i = 0; i < n; ++i)
      MK_CUDA_CHECK(cudaMemcpy(logits.data() + i * s.experts, static_cast<const float*>(w.router_logits.data) + tokens[size_t(i)] * s.experts,
                               size_t(s.experts) * 4, cudaMemcpyDeviceToHost));
    std::string first;
    ASSERT_EQ(ref::logits_beyond_bound(logits.data(), xs.data(), wg.data(), n, s.hidden, s.experts, &first), 0) << first;
    const ref::Routing want = ref::route(logits.data(), bias.empty() ? nullptr : bias.data(), n, s.experts, s.topk, opt);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s.topk; ++j) {
        const size_t g = size_t(tokens[size_t(i)] * s.topk + j), l = size_t(i * s.topk + j);
        ASSERT_EQ(ids[g], want.ids[l]) << "token " << tokens[size_t(i)] << " slot " << j;
        ASSERT_EQ(std::memcmp(&wts[g], &want.weights[l], 4), 0) << "token " << tokens[size_t(i)] << " slot " << j;
      }

    const int64_t L = int64_t(local.size());
    std::vector<uint16_t> w13(static_cast<size_t>(L * 2 * s.inter * s.hidden)), w2(size_t(L * s.hidden * s.inter));
    for (const auto& [e, l] : local) {
      const int64_t n13 = 2 * s.inter * s.hidden, n2 = s.hidden * s.inter;
      const auto a = hash_fill_host(e * n13, n13, seeds.w13, 1.0f / std::sqrt(float(s.hidden)));
      const auto b = hash_fill_host(e * n2, n2, seeds.w2, 1.0f / std::sqrt(float(s.inter)));
      std::copy(a.begin(), a.end(), w13.begin() + l * n13);
      std::copy(b.begin(), b.end(), w2.begin() + l * n2);
    }
    std::vector<int64_t> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[size_t(i)] = i;
    const MoeShape ls{n, s.hidden, s.inter, L, s.topk};
    const auto ref_y = ref::moe_tokens(ls, xs.data(), w13.data(), w2.data(), local_ids.data(), local_w.data(), all);
    std::vector<double> got;
    for (int64_t t : tokens) {
      std::vector<uint16_t> row(static_cast<size_t>(s.hidden));
      MK_CUDA_CHECK(cudaMemcpy(row.data(), y.ptr + t * s.hidden, size_t(s.hidden) * 2, cudaMemcpyDeviceToHost));
      for (uint16_t v : row) got.push_back(ref::to_float(v));
    }
    EXPECT_LE(ref::rel_norm_error(got, ref_y), kLayerRelTol);
  }
};

std::vector<int64_t> sample_tokens(int64_t T, int64_t count, std::mt19937_64& rng) {
  std::vector<int64_t> t;
  if (T <= count) {
    for (int64_t i = 0; i < T; ++i) t.push_back(i);
    return t;
  }
  t = {0, 1, T / 2, T - 2, T - 1};
  while (int64_t(t.size()) < count) t.push_back(int64_t(rng() % uint64_t(T)));
  return t;
}

RouterOptions softmax_renorm() {
  RouterOptions o;
  o.renormalize = true;
  return o;
}
RouterOptions deepseek_router() {
  RouterOptions o;
  o.scoring = Scoring::sigmoid;
  o.renormalize = true;
  o.n_group = 8;
  o.topk_group = 4;
  o.routed_scaling_factor = 2.5f;
  return o;
}

class ForwardTest : public GpuTest {
 protected:
  // One forward on y poisoned, checked against the naive loop on `sampled` tokens; a second eager
  // forward, and the forward captured in a graph and replayed, each on y poisoned again: bitwise
  // the first y. Returns it.
  std::vector<ref::bf16> run_checked_then_replayed(Layer& layer, int64_t sampled, std::mt19937_64& rng) {
    layer.y.poison();
    layer.forward(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    check_status(layer.ws(), stream);
    layer.check_tokens(sample_tokens(layer.s.tokens, sampled, rng));
    const auto first = layer.y.download();
    layer.y.poison();
    layer.forward(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(layer.y.download(), first) << "the second run differs: " << layer.plan.str();
    const CapturedGraph graph(stream, [&] { layer.forward(stream); });
    layer.y.poison();
    graph.launch(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(layer.y.download(), first) << "the graph's replay differs: " << layer.plan.str();
    return first;
  }
};

TEST_F(ForwardTest, ModelPresetsAgainstNaiveLoop) {
  struct Preset { const char* name; MoeShape s; RouterOptions o; bool bias; };
  const Preset presets[] = {
      {"mixtral-8x7b", {0, 4096, 14336, 8, 2}, softmax_renorm(), false},
      {"qwen3-30b-a3b", {0, 2048, 768, 128, 8}, softmax_renorm(), false},
      {"deepseek-v3", {0, 7168, 2048, 256, 8}, deepseek_router(), true},
  };
  std::mt19937_64 rng(fresh_seed());
  for (const Preset& p : presets)
    for (int64_t T : {1, 16, 300, 2048}) {  // 2048: Mixtral on the wgmma prefill kernel
      const uint64_t seed = rng();
      SCOPED_TRACE(std::string(p.name) + " T=" + std::to_string(T) + " seed " + std::to_string(seed));
      MoeShape s = p.s;
      s.tokens = T;
      Layer layer(s, p.o, p.bias, seed);
      layer.y.poison();
      layer.forward(stream);
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
      check_status(layer.ws(), stream);
      layer.check_tokens(sample_tokens(T, 8, rng));
    }
}

TEST_F(ForwardTest, BitwiseDeterministicAcrossRuns) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Layer layer({2000, 1024, 512, 64, 6}, softmax_renorm(), false, seed);
  layer.forward(stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto first = layer.y.download();
  for (int run = 0; run < 3; ++run) {
    layer.y.poison();
    layer.forward(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    ASSERT_EQ(layer.y.download(), first) << "run " << run;
  }
}

// T=64: the decode kernels (cluster router, one-CTA align, 16-row tiles). T=1024: the prefill
// ones (looped router, the cooperative multi-CTA align, wgmma tiles).
TEST_F(ForwardTest, CudaGraphCaptureAndReplayOnNewInputs) {
  for (int64_t T : {64, 1024}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " T=" + std::to_string(T));
    std::mt19937_64 rng(seed);
    Layer layer({T, 2048, 768, 128, 8}, softmax_renorm(), false, seed);
    const CapturedGraph graph(stream, [&] { layer.forward(stream); });
    for (int replay = 0; replay < 3; ++replay) {
      layer.fill_x(rng());  // new inputs in the same buffers
      layer.y.poison();
      graph.launch(stream);
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
      const auto from_graph = layer.y.download();
      layer.check_tokens(sample_tokens(T, 64, rng));
      layer.forward(stream);  // the same inputs, eagerly: bitwise equal
      MK_CUDA_CHECK(cudaStreamSynchronize(stream));
      ASSERT_EQ(layer.y.download(), from_graph) << "replay " << replay;
    }
  }
}

// A decode layer with its down GEMM split along K (the planner's tiles, 4 splits given: its cost
// model no longer splits on this shape): the layer still matches the naive loop, bitwise run to
// run and through a CUDA graph.
TEST_F(ForwardTest, SplitKDecodeLayer) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Layer layer({4, 4096, 2048, 8, 2}, softmax_renorm(), false, seed);
  layer.use_plan(plan_forward_with(layer.s, layer.plan.up, layer.plan.down, 4));
  ASSERT_EQ(layer.plan.down_splits, 4) << layer.plan.str();
  run_checked_then_replayed(layer, 4, rng);
}

// A prefill layer with its wgmma down GEMM split along K (2 and 4 slices of a ragged F: 16
// K-tiles of F = 1000), for every compiled wgmma config: the naive loop's result, bitwise run to
// run and through a CUDA graph.
TEST_F(ForwardTest, SplitKOnWgmmaDown) {
  for (const GemmConfig& c : compiled_gemm_configs())
    for (int S : {2, 4}) {
      if (c.kernel != GemmKernel::wgmma) continue;
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE("seed " + std::to_string(seed) + " " + c.str() + " splits " + std::to_string(S));
      std::mt19937_64 rng(seed);
      Layer layer({1024, 1024, 1000, 8, 2}, softmax_renorm(), false, seed);
      layer.use_plan(plan_forward_with(layer.s, c, c, S));
      run_checked_then_replayed(layer, 16, rng);
    }
}

// k = 1: the down GEMM stores y itself (no combine launch) on both kernel families (T = 3:
// 16-row tiles; T = 700: wgmma), checked, run again and replayed from a graph.
TEST_F(ForwardTest, TopOneLayerStoresYFromTheDownGemm) {
  for (int64_t T : {3, 700}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " T=" + std::to_string(T));
    std::mt19937_64 rng(seed);
    Layer layer({T, 1024, 512, 16, 1}, softmax_renorm(), false, seed);
    layer.use_plan(plan_forward_with(layer.s, layer.plan.up, layer.plan.down, 1));  // split-K keeps its combine
    run_checked_then_replayed(layer, 16, rng);
  }
}

TEST_F(ForwardTest, EmptyBatchIsValid) {
  Layer layer({0, 256, 128, 8, 2}, softmax_renorm(), false, 1);
  layer.forward(stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// Element offsets past 2^31: x is T·H = 2.5e9 elements, y_rows T·k·H = 4.9e9.
TEST_F(ForwardTest, SixtyFourBitOffsets) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const MoeShape s{600000, 4096, 256, 8, 2};
  ASSERT_GT(s.tokens * s.hidden, int64_t(1) << 31);
  Layer layer(s, softmax_renorm(), false, seed);
  layer.y.poison();
  layer.forward(stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  layer.check_tokens(sample_tokens(s.tokens, 16, rng));
}

}  // namespace
}  // namespace moekit::test
