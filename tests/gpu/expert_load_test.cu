// expert_load_test.cu — the opt-in load counter on the GPU (moe.hpp, "Load statistics"): over 20
// calls with fresh routings (uniform, every token on one expert, empty experts, one token, counts
// 0 / 1 / block_m / block_m + 1, T = 0) through each of align's three kernels, the counter is
// exactly the histogram of the routed ids summed over the calls, for caller-given ids
// (experts_forward) and for the layer's own routing (moe_forward, ids read from ws.topk_ids); y is
// bitwise the same with and without it; a CUDA graph captured once and replayed N times adds N
// times the counts; ids outside [0, E) are not counted; two streams may share one counter.
#include <algorithm>
#include <string>
#include <vector>

#include "gpu_util.hpp"
#include "hash_fill.hpp"

namespace moekit::test {
namespace {

// Small experts: the counter is under test, not the GEMMs (y is compared with itself, not an oracle).
constexpr int64_t kH = 256, kF = 128, kE = 64;

// One experts_forward call of a shape and a routing: device inputs, its plan and workspace.
struct Step {
  MoeShape s;
  ForwardPlan plan;
  DeviceBuffer<ref::bf16> x, w13, w2, y;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> weights;
  DeviceBuffer<unsigned char> ws;
  Step(int64_t T, int64_t k, const std::vector<int32_t>& topk_ids, uint64_t seed)
      : s{T, kH, kF, kE, k}, plan(plan_forward(s, query_device())), x(size_t(T * kH)),
        w13(size_t(kE * 2 * kF * kH)), w2(size_t(kE * kH * kF)), y(size_t(T * kH)),
        ids(size_t(std::max<int64_t>(1, T * k))), weights(size_t(std::max<int64_t>(1, T * k))),
        ws(workspace_bytes(plan)) {
    hash_fill_device(x.ptr, int64_t(x.count), seed + 1, 1.0f);
    hash_fill_device(w13.ptr, int64_t(w13.count), seed + 2, 0.0625f);
    hash_fill_device(w2.ptr, int64_t(w2.count), seed + 3, 0.09f);
    set_ids(topk_ids);
    std::vector<float> w(size_t(T * k));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0f / float(1 + i % 7);
    if (!w.empty()) weights.upload(w);
    MK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void set_ids(const std::vector<int32_t>& topk_ids) {
    if (!topk_ids.empty()) ids.upload(topk_ids);
  }
  void run(cudaStream_t stream, const Tensor& expert_load = Tensor()) {
    experts_forward(plan, Tensor(x.ptr, DType::bf16, {s.tokens, kH}), Tensor(w13.ptr, DType::bf16, {kE, 2 * kF, kH}),
                    Tensor(w2.ptr, DType::bf16, {kE, kH, kF}), Tensor(ids.ptr, DType::i32, {s.tokens, s.topk}),
                    Tensor(weights.ptr, DType::f32, {s.tokens, s.topk}), Tensor(y.ptr, DType::bf16, {s.tokens, kH}),
                    ws.ptr, ws.count, stream, expert_load);
  }
};

// A zeroed counter [E] i64 and its view.
struct Counter {
  DeviceBuffer<int64_t> buf{size_t(kE)};
  Counter() { MK_CUDA_CHECK(cudaMemset(buf.ptr, 0, kE * 8)); }
  Tensor view() const { return Tensor(buf.ptr, DType::i64, {kE}); }
  std::vector<int64_t> read() const { return buf.download(); }
};

void add_to(std::vector<int64_t>& total, const std::vector<int64_t>& h, int64_t times = 1) {
  for (size_t e = 0; e < total.size(); ++e) total[e] += times * h[e];
}

class ExpertLoadTest : public GpuTest {};

// The routings of the many-call tests: (T, k, ids), T*k on both sides of align's kernel switches
// (one warp up to 256 assignments, one CTA up to 4096, the cooperative grid above).
std::vector<int32_t> routing(int call, int64_t& T, int64_t& k, std::mt19937_64& rng) {
  struct Kind {
    int64_t T, k;
    RoutingKind kind;
  };
  static const Kind kinds[] = {
      {1, 4, RoutingKind::Uniform},        {1, 8, RoutingKind::SingleToken},   {50, 4, RoutingKind::AllOnOne},
      {64, 4, RoutingKind::EmptyExperts},  {65, 4, RoutingKind::Uniform},      {0, 4, RoutingKind::Uniform},
      {1000, 4, RoutingKind::AllOnOne},    {700, 2, RoutingKind::EmptyExperts}, {1025, 4, RoutingKind::Uniform},
      {3000, 2, RoutingKind::EmptyExperts}, {5000, 1, RoutingKind::AllOnOne},  {2048, 8, RoutingKind::Uniform},
  };
  if (call % 7 == 6) {  // counts 0, 1, block_m, block_m + 1 of both tile heights (16 and 128), k = 1
    std::vector<int64_t> counts(size_t(kE), 0);
    const int64_t c[] = {0, 1, 16, 17, 0, 128, 129, 1, 15, 0, 127};
    for (size_t i = 0; i < std::size(c); ++i) counts[size_t(rng() % uint64_t(kE))] += c[i];
    k = 1;
    T = 0;
    for (int64_t n : counts) T += n;
    return routing_with_counts(counts, k);
  }
  const Kind& kd = kinds[size_t(call) % std::size(kinds)];
  T = kd.T, k = kd.k;
  return make_routing(kd.kind, T, k, kE, rng);
}

TEST_F(ExpertLoadTest, ExpertsForwardAddsTheHistogramOfTheGivenIdsOverManyCalls) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Counter load;
  std::vector<int64_t> want(size_t(kE), 0);
  for (int call = 0; call < 20; ++call) {
    int64_t T = 0, k = 0;
    const std::vector<int32_t> ids = routing(call, T, k, rng);
    SCOPED_TRACE("call " + std::to_string(call) + ": T=" + std::to_string(T) + " k=" + std::to_string(k));
    Step step(T, k, ids, rng());
    step.y.poison();
    step.run(stream);  // without the counter: the normal path
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<ref::bf16> y_plain = step.y.download();
    step.y.poison();
    step.run(stream, load.view());
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    ASSERT_EQ(step.y.download(), y_plain) << "y with the counter differs from y without it";
    add_to(want, expert_histogram(ids, kE));
  }
  EXPECT_EQ(load.read(), want);
}

TEST_F(ExpertLoadTest, MoeForwardAddsTheHistogramOfItsRoutedIdsOverManyCalls) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t k = 6;
  DeviceBuffer<ref::bf16> w_gate(size_t(kE * kH)), w13(size_t(kE * 2 * kF * kH)), w2(size_t(kE * kH * kF));
  hash_fill_device(w_gate.ptr, int64_t(w_gate.count), rng(), 0.0625f);
  hash_fill_device(w13.ptr, int64_t(w13.count), rng(), 0.0625f);
  hash_fill_device(w2.ptr, int64_t(w2.count), rng(), 0.09f);
  Counter load;
  std::vector<int64_t> want(size_t(kE), 0);
  RouterOptions opt;
  opt.renormalize = true;
  const int64_t tokens[] = {1, 3, 16, 40, 300, 700, 2000};  // warp, CTA and grid align; decode and prefill tiles
  for (int call = 0; call < 20; ++call) {
    const int64_t T = tokens[size_t(call) % std::size(tokens)];
    SCOPED_TRACE("call " + std::to_string(call) + ": T=" + std::to_string(T));
    const MoeShape s{T, kH, kF, kE, k};
    const ForwardPlan plan = plan_forward(s, query_device());
    DeviceBuffer<ref::bf16> x(size_t(T * kH)), y(size_t(T * kH));
    DeviceBuffer<unsigned char> ws_buf(workspace_bytes(plan));
    hash_fill_device(x.ptr, int64_t(x.count), rng(), 1.0f);
    MK_CUDA_CHECK(cudaDeviceSynchronize());
    MoeInputs in;
    in.x = Tensor(x.ptr, DType::bf16, {T, kH});
    in.w_gate = Tensor(w_gate.ptr, DType::bf16, {kE, kH});
    in.w13 = Tensor(w13.ptr, DType::bf16, {kE, 2 * kF, kH});
    in.w2 = Tensor(w2.ptr, DType::bf16, {kE, kH, kF});
    const Tensor yt(y.ptr, DType::bf16, {T, kH});
    y.poison();
    moe_forward(plan, in, opt, yt, ws_buf.ptr, ws_buf.count, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<ref::bf16> y_plain = y.download();
    y.poison();
    moe_forward(plan, in, opt, yt, ws_buf.ptr, ws_buf.count, stream, load.view());
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    ASSERT_EQ(y.download(), y_plain) << "y with the counter differs from y without it";
    const Workspace ws = carve_workspace(plan, ws_buf.ptr, ws_buf.count);
    std::vector<int32_t> ids(size_t(T * k));
    MK_CUDA_CHECK(cudaMemcpy(ids.data(), ws.topk_ids.data, ids.size() * 4, cudaMemcpyDeviceToHost));
    add_to(want, expert_histogram(ids, kE));
  }
  EXPECT_EQ(load.read(), want);
}

// Captured once (after an eager call without the counter: the counting kernels need no setup of
// their own), replayed N times, then N' more on new ids in the same buffer: N·h + N'·h'.
TEST_F(ExpertLoadTest, GraphReplaysAddTheCountsEachTime) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const int64_t T : {16, 300, 2000}) {  // T*k = 64, 1200, 8000: warp, CTA and grid align
    SCOPED_TRACE("T=" + std::to_string(T));
    const int64_t k = 4;
    const std::vector<int32_t> first = make_routing(RoutingKind::Uniform, T, k, kE, rng);
    const std::vector<int32_t> second = make_routing(RoutingKind::AllOnOne, T, k, kE, rng);
    Step step(T, k, first, rng());
    Counter load;
    step.run(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    const CapturedGraph graph(stream, [&] { step.run(stream, load.view()); });
    EXPECT_EQ(load.read(), std::vector<int64_t>(size_t(kE), 0)) << "capture ran the counter";
    constexpr int kFirst = 5, kSecond = 3;
    for (int i = 0; i < kFirst; ++i) graph.launch(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<int64_t> want(size_t(kE), 0);
    add_to(want, expert_histogram(first, kE), kFirst);
    EXPECT_EQ(load.read(), want);
    step.set_ids(second);
    for (int i = 0; i < kSecond; ++i) graph.launch(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    add_to(want, expert_histogram(second, kE), kSecond);
    EXPECT_EQ(load.read(), want);
    // The caller's reset, on the stream, between replays.
    MK_CUDA_CHECK(cudaMemsetAsync(load.buf.ptr, 0, kE * 8, stream));
    graph.launch(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(load.read(), expert_histogram(second, kE));
  }
}

TEST_F(ExpertLoadTest, IdsOutsideTheExpertsAreNotCounted) {
  std::mt19937_64 rng(fresh_seed());
  for (const int64_t T : {20, 500, 1500}) {  // each align kernel
    std::vector<int32_t> ids = make_routing(RoutingKind::Uniform, T, 4, kE, rng);
    ids[0] = -1, ids[ids.size() / 2] = int32_t(kE), ids.back() = 1 << 30;
    Step step(T, 4, ids, rng());
    Counter load;
    step.run(stream, load.view());
    EXPECT_THROW(check_status(carve_workspace(step.plan, step.ws.ptr, step.ws.count), stream), Error);
    EXPECT_EQ(load.read(), expert_histogram(ids, kE)) << "T=" << T;
  }
}

// Layers on two streams that share one counter, with no order between them: every add lands.
TEST_F(ExpertLoadTest, TwoStreamsShareOneCounter) {
  std::mt19937_64 rng(fresh_seed());
  cudaStream_t other = nullptr;
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  const std::vector<int32_t> a = make_routing(RoutingKind::Uniform, 40, 4, kE, rng);
  const std::vector<int32_t> b = make_routing(RoutingKind::AllOnOne, 3000, 2, kE, rng);
  Step sa(40, 4, a, rng()), sb(3000, 2, b, rng());
  Counter load;
  constexpr int kCalls = 10;
  for (int i = 0; i < kCalls; ++i) {
    sa.run(stream, load.view());
    sb.run(other, load.view());
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(other));
  MK_CUDA_CHECK(cudaStreamDestroy(other));
  std::vector<int64_t> want(size_t(kE), 0);
  add_to(want, expert_histogram(a, kE), kCalls);
  add_to(want, expert_histogram(b, kE), kCalls);
  EXPECT_EQ(load.read(), want);
}

}  // namespace
}  // namespace moekit::test
