// ep_test.cu — expert parallelism over NCCL against the single-GPU layer.
//
// Every rank builds the same layer (hash-filled from one seed), runs the whole layer alone on its
// GPU as the reference (route + experts_forward over all T tokens, every expert), then its slice
// of the tokens through EpLayer with only its slots' weights, and compares bitwise:
//   - its own routing of its slice equals the slice of the whole batch's (batch invariance);
//   - prefill (counts first) and decode (fixed messages, captured in a CUDA graph and replayed)
//     outputs equal the reference's rows, with the same tile configs and down_splits = 1;
//   - a decode capacity too small: the overflow count is exactly the host plan's
//     (plan_decode_dispatch), check() names options.capacity, and every token none of whose
//     assignments overflowed is still bitwise the reference;
//   - the load counter (expert_load) gains the histogram of this rank's ids, through replicas too.
// R = 1 runs in this process (gpu-check, one GPU). R = 2 and R = #GPUs (<= 8) run as R processes
// (spawn_ranks re-executes this binary, filtered to EpMultiRank) and skip visibly below 2 GPUs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_util.hpp"
#include "gpu/hash_fill.hpp"
#include "moekit/ep.hpp"
#include "moekit/ep_nccl.hpp"
#include "moekit/moe.hpp"

namespace moekit::test {
namespace {

using ref::bf16;

bool nccl_missing(std::string* why) {
  try {
    ep::nccl_version();
    return false;
  } catch (const Error& e) {
    *why = e.what();
    return true;
  }
}

GemmConfig compiled(GemmKernel kind, int block_m) {
  for (const GemmConfig& c : compiled_gemm_configs())
    if (c.kernel == kind && c.block_m == block_m) return c;
  ADD_FAILURE() << "no compiled config with block_m " << block_m;
  return {};
}

struct Weights {
  MoeShape s;
  DeviceBuffer<bf16> x, w_gate, w13, w2;
  Weights(const MoeShape& shape, uint64_t seed)
      : s(shape),
        x(size_t(s.tokens * s.hidden)),
        w_gate(size_t(s.experts * s.hidden)),
        w13(size_t(s.experts * 2 * s.inter * s.hidden)),
        w2(size_t(s.experts * s.hidden * s.inter)) {
    hash_fill_device(x.ptr, int64_t(x.count), seed + 1, 1.0f);
    hash_fill_device(w_gate.ptr, int64_t(w_gate.count), seed + 2, 1.0f / std::sqrt(float(s.hidden)));
    hash_fill_device(w13.ptr, int64_t(w13.count), seed + 3, 1.0f / std::sqrt(float(s.hidden)));
    hash_fill_device(w2.ptr, int64_t(w2.count), seed + 4, 1.0f / std::sqrt(float(s.inter)));
    MK_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

struct Routing {
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> weights, logits;
  Routing(const bf16* x, int64_t tokens, const Weights& w, const RouterOptions& ro, cudaStream_t stream)
      : ids(size_t(tokens * w.s.topk)), weights(size_t(tokens * w.s.topk)), logits(size_t(tokens * w.s.experts)) {
    route(Tensor(x, DType::bf16, {tokens, w.s.hidden}), Tensor(w.w_gate.ptr, DType::bf16, {w.s.experts, w.s.hidden}),
          Tensor(), Tensor(), ro, Tensor(ids.ptr, DType::i32, {tokens, w.s.topk}),
          Tensor(weights.ptr, DType::f32, {tokens, w.s.topk}), stream,
          Tensor(logits.ptr, DType::f32, {tokens, w.s.experts}));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

// One case of the comparison (see the file comment).
struct Case {
  const char* name;
  ep::EpMode mode;
  int64_t tokens;           // the whole batch, split over the R ranks
  bool one_expert = false;  // adversarial: every token names experts 0..k-1 (given ids, not routed)
  int64_t spare_slots = 0;  // slots per rank beyond ceil(E/R): empty slots
  int replicas = 0;         // copies of hot experts (R > 1)
  ep::ReplicaRule rule = ep::ReplicaRule::token_modulo;
};

void check_case(const ep::Communicator& comm, const Case& c, uint64_t seed, cudaStream_t stream) {
  const int R = comm.ranks(), rank = comm.rank();
  const bool decode = c.mode == ep::EpMode::decode;
  const int64_t tokens = c.tokens;
  SCOPED_TRACE(::testing::Message() << "rank " << rank << "/" << R << ": " << c.name << ", T=" << tokens
                                    << " seed=" << seed);
  const MoeShape s{tokens, 1024, 512, 32, 4};
  RouterOptions ro;
  ro.renormalize = true;
  const Weights w(s, seed);
  const int64_t H = s.hidden, F = s.inter, E = s.experts, k = s.topk;
  const GemmConfig cfg = decode ? compiled(GemmKernel::mma_sync, 16) : compiled(GemmKernel::wgmma, 128);
  const std::vector<int64_t> split = ep::split_tokens(tokens, R);
  const int64_t t0 = split[size_t(rank)], T = split[size_t(rank + 1)] - t0;
  int64_t t_max = 0;
  for (int r = 0; r < R; ++r) t_max = std::max(t_max, split[size_t(r + 1)] - split[size_t(r)]);
  const bf16* x_local = w.x.ptr + t0 * H;

  // The reference: the whole layer on this GPU from the current w.x. It also (re)writes this
  // rank's routing into `ids`/`wts` (the buffers a captured graph reads).
  DeviceBuffer<int32_t> ids(size_t(std::max<int64_t>(1, T * k)));
  DeviceBuffer<float> wts(size_t(std::max<int64_t>(1, T * k)));
  std::vector<int32_t> ids_all, ids_local;
  std::vector<bf16> y_all;
  const ForwardPlan ref_plan = plan_forward_with(s, cfg, cfg, 1);
  DeviceBuffer<unsigned char> ref_ws(workspace_bytes(ref_plan));
  auto reference = [&] {
    DeviceBuffer<int32_t> all_ids(size_t(tokens * k));
    DeviceBuffer<float> all_w(size_t(tokens * k));
    if (c.one_expert) {
      std::vector<int32_t> hi(size_t(tokens * k));
      std::vector<float> hw(size_t(tokens * k));
      for (int64_t a = 0; a < tokens * k; ++a) hi[size_t(a)] = int32_t(a % k), hw[size_t(a)] = 1.0f / float(1 + a % k);
      all_ids.upload(hi);
      all_w.upload(hw);
    } else {
      const Routing all(w.x.ptr, tokens, w, ro, stream);
      MK_CUDA_CHECK(cudaMemcpy(all_ids.ptr, all.ids.ptr, all_ids.count * 4, cudaMemcpyDeviceToDevice));
      MK_CUDA_CHECK(cudaMemcpy(all_w.ptr, all.weights.ptr, all_w.count * 4, cudaMemcpyDeviceToDevice));
    }
    DeviceBuffer<bf16> y_ref(size_t(tokens * H));
    y_ref.poison();
    experts_forward(ref_plan, Tensor(w.x.ptr, DType::bf16, {tokens, H}), Tensor(w.w13.ptr, DType::bf16, {E, 2 * F, H}),
                    Tensor(w.w2.ptr, DType::bf16, {E, H, F}), Tensor(all_ids.ptr, DType::i32, {tokens, k}),
                    Tensor(all_w.ptr, DType::f32, {tokens, k}), Tensor(y_ref.ptr, DType::bf16, {tokens, H}), ref_ws.ptr,
                    ref_ws.count, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    ids_all = all_ids.download();
    y_all = y_ref.download();
    const std::vector<float> w_all = all_w.download();
    if (T == 0) return;
    if (c.one_expert) {  // given ids: this rank's slice of them
      MK_CUDA_CHECK(cudaMemcpy(ids.ptr, all_ids.ptr + t0 * k, size_t(T * k) * 4, cudaMemcpyDeviceToDevice));
      MK_CUDA_CHECK(cudaMemcpy(wts.ptr, all_w.ptr + t0 * k, size_t(T * k) * 4, cudaMemcpyDeviceToDevice));
    } else {  // this rank routes its own tokens: must equal the slice of the batch's routing
      const Routing mine(x_local, T, w, ro, stream);
      MK_CUDA_CHECK(cudaMemcpy(ids.ptr, mine.ids.ptr, size_t(T * k) * 4, cudaMemcpyDeviceToDevice));
      MK_CUDA_CHECK(cudaMemcpy(wts.ptr, mine.weights.ptr, size_t(T * k) * 4, cudaMemcpyDeviceToDevice));
    }
    ids_local = ids.download(size_t(T * k));
    const std::vector<float> w_local = wts.download(size_t(T * k));
    EXPECT_TRUE(std::equal(ids_local.begin(), ids_local.end(), ids_all.begin() + t0 * k) &&
                std::memcmp(w_local.data(), w_all.data() + t0 * k, w_local.size() * 4) == 0)
        << "routing a slice differs from the slice of the batch's routing";
  };
  reference();

  // Placement: replicas of the hottest experts by the batch's own histogram, empty slots.
  ep::PlacementOptions po{.experts = E, .ranks = R};
  po.slots_per_rank = c.spare_slots ? (E + R - 1) / R + c.spare_slots : 0;
  if (R > 1 && c.replicas) {
    po.expert_load.assign(size_t(E), 0.0);
    for (int32_t e : ids_all) po.expert_load[size_t(e)] += 1;
    po.replicas = c.replicas;
    po.rule = c.rule;
  }
  const ep::Placement p = ep::plan_placement(po);
  const int64_t S = p.slots_per_rank;
  DeviceBuffer<bf16> w13_local(size_t(S * 2 * F * H)), w2_local(size_t(S * H * F));
  w13_local.poison();  // an empty slot's weights are never read
  w2_local.poison();
  ep::copy_local_experts(p, rank, Tensor(w.w13.ptr, DType::bf16, {E, 2 * F, H}), Tensor(w.w2.ptr, DType::bf16, {E, H, F}),
                         Tensor(w13_local.ptr, DType::bf16, {S, 2 * F, H}), Tensor(w2_local.ptr, DType::bf16, {S, H, F}),
                         stream);

  const Tensor xt(x_local, DType::bf16, {T, H}), idt(ids.ptr, DType::i32, {T, k}), wt(wts.ptr, DType::f32, {T, k});
  const Tensor w13t(w13_local.ptr, DType::bf16, {S, 2 * F, H}), w2t(w2_local.ptr, DType::bf16, {S, H, F});
  DeviceBuffer<bf16> y(size_t(std::max<int64_t>(1, T * H)));
  const Tensor yt(y.ptr, DType::bf16, {T, H});
  auto expect_rows_equal = [&](const std::vector<uint8_t>* skip, const char* what) {
    const std::vector<bf16> got = y.download(size_t(T * H));
    int64_t bad = 0, first = -1;
    for (int64_t t = 0; t < T; ++t) {
      if (skip && (*skip)[size_t(t)]) continue;
      if (std::memcmp(got.data() + t * H, y_all.data() + (t0 + t) * H, size_t(H) * 2) != 0) {
        if (first < 0) first = t;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << T << " tokens differ from the single-GPU layer (first: "
                      << "local token " << first << ")";
  };
  auto sent_per_destination = [&](const std::vector<int32_t>& slot_counts) {
    std::vector<int64_t> out(size_t(R), 0);
    for (int64_t slot = 0; slot < R * S; ++slot) out[size_t(slot / S)] += slot_counts[size_t(slot)];
    return out;
  };

  DeviceBuffer<int64_t> load(std::vector<int64_t>(size_t(E), 0));  // the counter, zeroed
  const Tensor loadt(load.ptr, DType::i64, {E});
  ep::EpOptions opt{.shape = MoeShape{t_max, H, F, E, k}, .mode = c.mode, .capacity = 0, .up = cfg, .down = cfg};
  ep::EpLayer layer(comm, p, opt);
  const ep::DispatchLayout plan = ep::plan_dispatch(p, ids_local.data(), T, k, t0, rank);
  if (!decode) {
    y.poison();
    layer.forward(xt, idt, wt, w13t, w2t, yt, t0, stream, loadt);
    EXPECT_NO_THROW(layer.check(stream));
    expect_rows_equal(nullptr, "prefill");
    EXPECT_EQ(load.download(), expert_histogram(ids_local, E)) << "expert_load";
    EXPECT_EQ(layer.stats(stream).rows_sent, sent_per_destination(plan.slot_counts)) << "rows sent per destination";
    y.poison();  // a second step on the same buffers gives the same bits
    layer.forward(xt, idt, wt, w13t, w2t, yt, t0, stream);
    expect_rows_equal(nullptr, "prefill, second step");
    return;
  }
  {
    layer.forward(xt, idt, wt, w13t, w2t, yt, t0, stream);  // eager first: NCCL sets up its connections
    CapturedGraph graph(stream, [&] { layer.forward(xt, idt, wt, w13t, w2t, yt, t0, stream, loadt); });
    y.poison();
    graph.launch(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_rows_equal(nullptr, "decode graph");
    EXPECT_NO_THROW(layer.check(stream));
    EXPECT_EQ(layer.stats(stream).overflow, 0);
    // New inputs in the same buffers: the replay must follow them (no host state baked in).
    const std::vector<int32_t> ids_first = ids_local;
    hash_fill_device(w.x.ptr, int64_t(w.x.count), seed + 77, 1.0f);
    MK_CUDA_CHECK(cudaDeviceSynchronize());
    reference();
    y.poison();
    graph.launch(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_rows_equal(nullptr, "decode graph replayed on new inputs");
    std::vector<int32_t> both = ids_first;  // the two replays' routings
    both.insert(both.end(), ids_local.begin(), ids_local.end());
    EXPECT_EQ(load.download(), expert_histogram(both, E)) << "expert_load after two replays";
  }
  {
    // Capacity 2 rows per destination: overflow, counted exactly as the host plan says.
    ep::EpOptions small = opt;
    small.capacity = 2;
    ep::EpLayer tight(comm, p, small);
    y.poison();
    tight.forward(xt, idt, wt, w13t, w2t, yt, t0, stream);
    const ep::DecodeDispatch dd =
        ep::plan_decode_dispatch(ep::decode_geometry(p, 2), ep::plan_dispatch(p, ids_local.data(), T, k, t0, rank));
    const ep::EpStats st = tight.stats(stream);
    EXPECT_EQ(st.overflow, dd.overflow);
    EXPECT_EQ(st.rows_sent, sent_per_destination(dd.sent_counts)) << "rows that fit, per destination";
    if (dd.overflow > 0) EXPECT_TRUE(throws_naming([&] { tight.check(stream); }, "options.capacity"));
    std::vector<uint8_t> touched(size_t(T), 0);
    for (int64_t a = 0; a < T * k; ++a)
      if (dd.send_row[size_t(a)] < 0) touched[size_t(a / k)] = 1;
    expect_rows_equal(&touched, "decode with overflow, tokens that kept all their rows");
  }
}

void run_all_cases(const ep::Communicator& comm, uint64_t seed, cudaStream_t stream) {
  const int R = comm.ranks();
  using ep::EpMode;
  using ep::ReplicaRule;
  const Case cases[] = {
      {"prefill, slices differ by one token", EpMode::prefill, 96 * R + 5, false, 0, 4, ReplicaRule::prefer_home},
      {"prefill, grid align over the slots (T*k > 4096 per rank), empty slots", EpMode::prefill, 1100 * R + 3, false, 2,
       0},
      {"prefill, one token: R - 1 ranks send nothing", EpMode::prefill, 1},
      {"prefill, all tokens on experts 0..k-1 (BLOCK_M + 1 rows each)", EpMode::prefill, 129, true, 0, 4,
       ReplicaRule::prefer_home},
      {"decode", EpMode::decode, 6 * R + 1, false, 0, 4, ReplicaRule::token_modulo},
      {"decode, one token", EpMode::decode, 1},
      // Two spare slots per rank, two of them taken by copies: empty slots remain.
      {"decode, all tokens on experts 0..k-1 (BLOCK_M + 1 rows each), empty slots", EpMode::decode, 17, true, 2, 2,
       ReplicaRule::prefer_home},
  };
  for (size_t i = 0; i < std::size(cases); ++i) check_case(comm, cases[i], seed + 1000 * i, stream);
}

class EpTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    std::string why;
    if (nccl_missing(&why)) GTEST_SKIP() << "EP needs NCCL at run time: " << why;
  }
};

TEST_F(EpTest, OneRankMatchesSingleGpuLayerBitwise) {
  const ep::Communicator comm(ep::nccl_unique_id(), 0, 1);
  run_all_cases(comm, fresh_seed(), stream);
}

TEST_F(EpTest, BadArgumentsAreNamed) {
  const ep::Communicator comm(ep::nccl_unique_id(), 0, 1);
  const MoeShape s{8, 1024, 512, 32, 4};
  const ep::Placement one = ep::plan_placement({.experts = 32, .ranks = 1});
  const ep::Placement two = ep::plan_placement({.experts = 32, .ranks = 2});
  auto expect_names = [](const char* arg, auto&& f) { EXPECT_TRUE(throws_naming(f, arg)); };
  expect_names("placement", [&] { ep::EpLayer l(comm, two, {.shape = s}); });
  expect_names("options.shape.experts", [&] { ep::EpLayer l(comm, one, {.shape = MoeShape{8, 1024, 512, 16, 4}}); });
  expect_names("options.shape.tokens", [&] { ep::EpLayer l(comm, one, {.shape = MoeShape{0, 1024, 512, 32, 4}}); });
  expect_names("options.capacity", [&] { ep::EpLayer l(comm, one, {.shape = s, .capacity = 4}); });
  expect_names("options.capacity",
               [&] { ep::EpLayer l(comm, one, {.shape = s, .mode = ep::EpMode::decode, .capacity = -1}); });
  ep::EpLayer layer(comm, one, {.shape = s});
  // What a step reports needs a step first.
  expect_names("this", [&] { layer.stats(stream); });
  expect_names("this", [&] { layer.exchange_only(stream); });
  DeviceBuffer<bf16> x(size_t(16 * 1024)), w13(size_t(32 * 1024 * 1024)), w2(size_t(32 * 1024 * 512)),
      y(size_t(16 * 1024));
  DeviceBuffer<int32_t> ids(64);
  DeviceBuffer<float> wts(64);
  const Tensor w13t(w13.ptr, DType::bf16, {32, 1024, 1024}), w2t(w2.ptr, DType::bf16, {32, 1024, 512});
  expect_names("x", [&] {  // more tokens than the layer was built for
    layer.forward(Tensor(x.ptr, DType::bf16, {16, 1024}), Tensor(ids.ptr, DType::i32, {16, 4}),
                  Tensor(wts.ptr, DType::f32, {16, 4}), w13t, w2t, Tensor(y.ptr, DType::bf16, {16, 1024}), 0, stream);
  });
  expect_names("topk_weights", [&] {
    layer.forward(Tensor(x.ptr, DType::bf16, {8, 1024}), Tensor(ids.ptr, DType::i32, {8, 4}),
                  Tensor(wts.ptr, DType::i32, {8, 4}), w13t, w2t, Tensor(y.ptr, DType::bf16, {8, 1024}), 0, stream);
  });
  expect_names("w2", [&] {
    layer.forward(Tensor(x.ptr, DType::bf16, {8, 1024}), Tensor(ids.ptr, DType::i32, {8, 4}),
                  Tensor(wts.ptr, DType::f32, {8, 4}), w13t, w13t, Tensor(y.ptr, DType::bf16, {8, 1024}), 0, stream);
  });
  expect_names("token_offset", [&] {
    layer.forward(Tensor(x.ptr, DType::bf16, {8, 1024}), Tensor(ids.ptr, DType::i32, {8, 4}),
                  Tensor(wts.ptr, DType::f32, {8, 4}), w13t, w2t, Tensor(y.ptr, DType::bf16, {8, 1024}), -1, stream);
  });
  expect_names("options.down",
               [&] { ep::EpLayer l(comm, one, {.shape = s, .up = compiled(GemmKernel::mma_sync, 16)}); });
  // Prefill syncs for the counts: capturing it is refused before anything is enqueued.
  const Tensor x8(x.ptr, DType::bf16, {8, 1024}), ids8(ids.ptr, DType::i32, {8, 4}), w8(wts.ptr, DType::f32, {8, 4});
  const Tensor y8(y.ptr, DType::bf16, {8, 1024});
  hash_fill_device(x.ptr, int64_t(x.count), 11, 1.0f);
  hash_fill_device(w13.ptr, int64_t(w13.count), 12, 1.0f / 32);
  hash_fill_device(w2.ptr, int64_t(w2.count), 13, 1.0f / 23);
  wts.upload(std::vector<float>(64, 0.25f));
  MK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  expect_names("options.mode", [&] { layer.forward(x8, ids8, w8, w13t, w2t, y8, 0, stream); });
  cudaGraph_t g = nullptr;
  MK_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  if (g) cudaGraphDestroy(g);

  // An expert id out of range is skipped on the device and reported by check(); every other
  // token is untouched, also when a larger earlier step left stale entries in the buffers.
  std::vector<int32_t> good(32);
  for (int i = 0; i < 32; ++i) good[size_t(i)] = (7 * i) % 32;
  std::vector<int32_t> bad = good;
  bad[5] = 32;  // token 1
  ids.upload(good);
  layer.forward(x8, ids8, w8, w13t, w2t, y8, 0, stream);
  EXPECT_NO_THROW(layer.check(stream));
  const std::vector<bf16> y_good = y.download(8 * 1024);
  ids.upload(bad);
  y.poison();
  layer.forward(x8, ids8, w8, w13t, w2t, y8, 0, stream);
  expect_names("topk_ids", [&] { layer.check(stream); });
  const std::vector<bf16> y_bad = y.download(8 * 1024);
  for (int t = 0; t < 8; ++t)
    if (t != 1) EXPECT_EQ(std::memcmp(y_bad.data() + t * 1024, y_good.data() + t * 1024, 2048), 0) << "token " << t;

  // Decode with a tight capacity (the sanitizer runs of gpu-check cover the decode kernels here).
  ep::EpLayer tight(comm, one, {.shape = s, .mode = ep::EpMode::decode, .capacity = 2});
  ids.upload(good);
  tight.forward(x8, ids8, w8, w13t, w2t, y8, 0, stream);
  expect_names("options.capacity", [&] { tight.check(stream); });
}

// R processes, one GPU each: the parent spawns, each child (MOEKIT_EP_RANK set) is one rank.
TEST(EpMultiRank, MatchesSingleGpuLayerBitwise) {
  if (const std::optional<ep::RankEnv> env = ep::rank_from_env()) {
    MK_CUDA_CHECK(cudaSetDevice(env->rank));
    cudaStream_t stream = nullptr;
    MK_CUDA_CHECK(cudaStreamCreate(&stream));
    const char* seed = std::getenv("MOEKIT_EP_TEST_SEED");
    {
      const ep::Communicator comm(env->id, env->rank, env->ranks);
      run_all_cases(comm, seed ? std::strtoull(seed, nullptr, 10) : 1, stream);
    }
    cudaStreamDestroy(stream);
    return;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) cudaGetLastError(), gpus = 0;
  if (gpus < 2)
    GTEST_SKIP() << "needs 2 or more GPUs (this machine has " << gpus << "): run on a multi-GPU device kind";
  std::string why;
  if (nccl_missing(&why)) GTEST_SKIP() << "EP needs NCCL at run time: " << why;
  const uint64_t seed = fresh_seed();
  setenv("MOEKIT_EP_TEST_SEED", std::to_string(seed).c_str(), 1);
  std::vector<int> sizes{2};
  if (gpus > 2) sizes.push_back(std::min(gpus, 8));
  for (int R : sizes) {
    SCOPED_TRACE(::testing::Message() << "R=" << R << " seed=" << seed);
    const std::vector<int> status = ep::spawn_ranks(R, {"--gtest_filter=EpMultiRank.MatchesSingleGpuLayerBitwise"});
    for (int r = 0; r < R; ++r) EXPECT_EQ(status[size_t(r)], 0) << "rank " << r << " failed (its output is above)";
  }
}

}  // namespace
}  // namespace moekit::test
