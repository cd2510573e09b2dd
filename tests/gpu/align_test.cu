// align_test.cu — stage 2 on the GPU against the CPU oracle, bitwise, over adversarial routings.
#include <optional>

#include "gpu_util.hpp"

namespace moekit::test {
namespace {

class AlignTest : public GpuTest {
 protected:
  // Aligns `ids` on the GPU (poisoned workspace) and compares every output with ref::align.
  // `kernel`: the align kernel to run instead of the planner's.
  void check(const std::vector<int32_t>& ids, int64_t T, int64_t k, int64_t E, const GemmConfig& cfg,
             int expect_status = 0, std::optional<AlignKernel> kernel = std::nullopt) {
    SCOPED_TRACE("T=" + std::to_string(T) + " k=" + std::to_string(k) + " E=" + std::to_string(E) +
                 " block_m=" + std::to_string(cfg.block_m));
    ForwardPlan plan = plan_forward_with({T, 64, 64, E, k}, cfg, cfg);
    if (kernel) plan.align = *kernel;
    DeviceBuffer<unsigned char> ws_buf(workspace_bytes(plan));
    ws_buf.poison();
    const Workspace ws = carve_workspace(plan, ws_buf.ptr, ws_buf.count);
    DeviceBuffer<int32_t> d_ids(ids);
    align(plan, Tensor(d_ids.ptr, DType::i32, {T, k}), ws, stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));

    const ref::Aligned want = ref::align(ids.data(), T, k, E, plan.block_m(), plan.max_blocks());
    auto dl = [](const Tensor& t) {
      std::vector<int32_t> h(static_cast<size_t>(t.numel()));
      if (!h.empty()) MK_CUDA_CHECK(cudaMemcpy(h.data(), t.data, h.size() * 4, cudaMemcpyDeviceToHost));
      return h;
    };
    const auto num = dl(ws.num_rows_padded);
    ASSERT_EQ(num[0], want.num_rows_padded);
    const auto sorted = dl(ws.sorted_ids);
    for (int32_t r = 0; r < want.num_rows_padded; ++r) ASSERT_EQ(sorted[size_t(r)], want.sorted_ids[size_t(r)]) << "row " << r;
    EXPECT_EQ(dl(ws.block_expert), want.block_expert);
    EXPECT_EQ(dl(ws.expert_counts), want.expert_counts);
    EXPECT_EQ(dl(ws.status)[0], expect_status);
    EXPECT_EQ(want.status, expect_status);
    if (expect_status) EXPECT_THROW(check_status(ws, stream), Error);
    else EXPECT_NO_THROW(check_status(ws, stream));
  }
};

TEST_F(AlignTest, RandomRoutingsEveryBlockM) {
  std::mt19937_64 rng(fresh_seed());
  for (const GemmConfig& cfg : compiled_gemm_configs())
    for (int64_t E : {1, 8, 64, 256, 512})
      for (int64_t T : {1, 7, 1000})
        for (int64_t k : {1, 2, 8}) {
          if (k > E) continue;
          check(make_routing(RoutingKind::Uniform, T, k, E, rng), T, k, E, cfg);
        }
}

TEST_F(AlignTest, AdversarialRoutings) {
  std::mt19937_64 rng(fresh_seed());
  for (const GemmConfig& cfg : compiled_gemm_configs()) {
    check(make_routing(RoutingKind::AllOnOne, 513, 1, 16, rng), 513, 1, 16, cfg);
    check(make_routing(RoutingKind::AllOnOne, 300, 4, 16, rng), 300, 4, 16, cfg);
    check(make_routing(RoutingKind::EmptyExperts, 200, 2, 64, rng), 200, 2, 64, cfg);
    check(make_routing(RoutingKind::SingleToken, 1, 8, 256, rng), 1, 8, 256, cfg);
    // Past kAlignGridMinAssignments: the cooperative multi-CTA kernel.
    check(make_routing(RoutingKind::AllOnOne, 5000, 1, 16, rng), 5000, 1, 16, cfg);
    check(make_routing(RoutingKind::EmptyExperts, 3000, 2, 64, rng), 3000, 2, 64, cfg);
    // Per-expert counts 0, 1, BLOCK_M, BLOCK_M+1 (and 0 at both ends).
    const int64_t bm = cfg.block_m;
    const std::vector<int64_t> counts = {0, 1, bm, bm + 1, 0, 2 * bm - 1, 1, 0};
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    const int64_t k = 1;
    check(routing_with_counts(counts, k), total / k, k, int64_t(counts.size()), cfg);
  }
}

// The one-warp (decode) and one-CTA kernels around their switch (256 assignments), every block_m,
// with E past 32 experts per lane's share, and an out-of-range id in the warp kernel's last round.
TEST_F(AlignTest, WarpAndCtaKernelsAroundTheSwitch) {
  std::mt19937_64 rng(fresh_seed());
  for (const GemmConfig& cfg : compiled_gemm_configs())
    for (int64_t n : {1, 31, 32, 33, 255, 256, 257, 511, 512, 513})
      for (int64_t E : {1, 8, 33, 256, 512}) {
        check(make_routing(RoutingKind::Uniform, n, 1, E, rng), n, 1, E, cfg);
        check(make_routing(RoutingKind::AllOnOne, n, 1, E, rng), n, 1, E, cfg);
      }
  const GemmConfig cfg = compiled_gemm_configs().front();
  for (int64_t n : {256, 257}) {
    std::vector<int32_t> ids = make_routing(RoutingKind::Uniform, n, 1, 64, rng);
    ids[size_t(n - 1)] = -3;
    check(ids, n, 1, 64, cfg, kStatusExpertIdOutOfRange);
  }
}

// Both kernels around the switch (kAlignGridMinAssignments), and the grid kernel with as many
// CTAs as it may use, with out-of-range ids reported from any CTA.
TEST_F(AlignTest, OneCtaAndGridKernelsAroundTheSwitch) {
  std::mt19937_64 rng(fresh_seed());
  const GemmConfig cfg = compiled_gemm_configs().front();
  for (int64_t n : {kAlignGridMinAssignments, kAlignGridMinAssignments + 1, int64_t(40000), int64_t(700000)})
    for (int64_t E : {8, 256, 512}) check(make_routing(RoutingKind::Uniform, n, 1, E, rng), n, 1, E, cfg);
  std::vector<int32_t> ids = make_routing(RoutingKind::Uniform, 600000, 1, 64, rng);
  ids[size_t(599999)] = 64;  // in the last CTA's chunk
  check(ids, 600000, 1, 64, cfg, kStatusExpertIdOutOfRange);
}

// The one-CTA kernel past the planner's range: it keeps pass 1's slots only where every warp's
// segment is at most kRoundsInFlight rounds (4096 ids), and walks the segments again past that.
TEST_F(AlignTest, OneCtaKernelPastThePlannersRange) {
  std::mt19937_64 rng(fresh_seed());
  const GemmConfig cfg = compiled_gemm_configs().front();
  for (int64_t n : {int64_t(4097), int64_t(5000), int64_t(40000)})
    for (int64_t E : {8, 256}) check(make_routing(RoutingKind::Uniform, n, 1, E, rng), n, 1, E, cfg, 0, AlignKernel::cta);
  std::vector<int32_t> ids = make_routing(RoutingKind::Uniform, 6000, 1, 64, rng);
  ids[size_t(5999)] = -1;
  check(ids, 6000, 1, 64, cfg, kStatusExpertIdOutOfRange, AlignKernel::cta);
}

TEST_F(AlignTest, LargeAssignmentCount) {
  std::mt19937_64 rng(fresh_seed());
  const GemmConfig cfg = compiled_gemm_configs().back();
  check(make_routing(RoutingKind::Uniform, 65536, 8, 256, rng), 65536, 8, 256, cfg);
}

// The kernel sizes its work from n = T*k: ceil(n/32) warps of one round each up to n = 1024,
// then 32 warps with longer segments (kRoundsInFlight rounds loaded at a time). Cover each side
// of every boundary: n < 32, n = 32 and 33, 32*32 - 1, 32*32, 32*32 + 1, and segments that end
// inside a group of rounds.
TEST_F(AlignTest, AssignmentCountsAroundWarpAndRoundBoundaries) {
  std::mt19937_64 rng(fresh_seed());
  for (const GemmConfig& cfg : compiled_gemm_configs())
    for (int64_t E : {8, 256, 512})
      for (int64_t n : {1, 2, 5, 31, 32, 33, 63, 500, 1023, 1024, 1025, 2047, 4095, 4096, 4097, 4255, 33000}) {
        const int64_t k = 1;
        check(make_routing(RoutingKind::Uniform, n / k, k, E, rng), n / k, k, E, cfg);
      }
}

TEST_F(AlignTest, MaxExpertsAllRoutings) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t E = kMaxExperts;
  for (const GemmConfig& cfg : compiled_gemm_configs()) {
    check(make_routing(RoutingKind::Uniform, 64, 8, E, rng), 64, 8, E, cfg);
    check(make_routing(RoutingKind::AllOnOne, 700, 2, E, rng), 700, 2, E, cfg);
    check(make_routing(RoutingKind::EmptyExperts, 3, 16, E, rng), 3, 16, E, cfg);
    check(make_routing(RoutingKind::SingleToken, 1, 16, E, rng), 1, 16, E, cfg);
  }
}

// T*k = 3,000,000: segments of ~94k assignments per warp, starts far above 2^16.
TEST_F(AlignTest, MillionsOfAssignments) {
  std::mt19937_64 rng(fresh_seed());
  const GemmConfig cfg = compiled_gemm_configs().front();
  check(make_routing(RoutingKind::Uniform, 375000, 8, 256, rng), 375000, 8, 256, cfg);
  check(make_routing(RoutingKind::AllOnOne, 1500000, 2, 256, rng), 1500000, 2, 256, cfg);
}

TEST_F(AlignTest, OutOfRangeIdsAreSkippedAndReported) {
  std::mt19937_64 rng(fresh_seed());
  auto ids = make_routing(RoutingKind::Uniform, 50, 2, 8, rng);
  ids[3] = -1;
  ids[40] = 8;
  check(ids, 50, 2, 8, compiled_gemm_configs().front(), kStatusExpertIdOutOfRange);
  // Only in the last warp's last round, past the first group of rounds of a long segment.
  auto many = make_routing(RoutingKind::Uniform, 10000, 1, 512, rng);
  many.back() = 512;
  check(many, 10000, 1, 512, compiled_gemm_configs().front(), kStatusExpertIdOutOfRange);
}

TEST_F(AlignTest, EmptyInput) {
  check({}, 0, 2, 8, compiled_gemm_configs().front());
}

}  // namespace
}  // namespace moekit::test
