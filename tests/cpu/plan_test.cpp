// plan_test.cpp — the config chooser (plan_forward, plan_forward_with) and the workspace layout
// (workspace_bytes, carve_workspace): pure host functions, checked on a hand-made H200.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/validate.hpp"
#include "cpu_test_util.hpp"
#include "moekit/presets.hpp"  // tools/: the layers `moekit bench --preset` knows
#include "moekit/tuning.hpp"
#include "tuning/cost_model.hpp"
#include "tuning/planner.hpp"

namespace moekit::testing {
namespace {

const GemmConfig& compiled_with_block_m(int block_m) {
  for (const GemmConfig& c : compiled_gemm_configs())
    if (c.block_m == block_m) return c;
  throw std::logic_error("no compiled config with block_m " + std::to_string(block_m));
}

// Without a table entry (kH200's name is not the table's), the plan takes the cost model's
// cheapest candidate (tuning::cheapest_tiles; its own tests: cost_model_test.cpp), one block_m for
// both GEMMs, and the tiles grow with T: 16-row decode tiles at T = 1, the wgmma kernel for
// prefill, never back to a smaller block_m as T grows.
void expect_heuristic_plans(const MoeShape& shape, const DeviceInfo& device, Precision precision, int& last_block_m) {
  const ForwardPlan plan = plan_forward(shape, device, precision);
  const tuning::TileChoice c = tuning::cheapest_tiles(shape, device, precision);
  EXPECT_EQ(plan.source, "heuristic");
  EXPECT_EQ(plan.up, c.up);
  EXPECT_EQ(plan.down, c.down);
  EXPECT_EQ(plan.down_splits, c.down_splits);
  const int bm = plan.block_m();
  EXPECT_EQ(plan.up.block_m, bm);
  EXPECT_EQ(plan.down.block_m, bm);
  EXPECT_GE(bm, last_block_m) << "a larger T never takes a smaller tile";
  last_block_m = bm;
  EXPECT_EQ(plan.max_rows(), worst_case_rows(shape.tokens, shape.topk, shape.experts, bm));
  EXPECT_EQ(plan.max_rows() % bm, 0);
  EXPECT_EQ(plan.max_blocks(), plan.max_rows() / bm);
  EXPECT_EQ(plan.shape.tokens, shape.tokens);
}

TEST(Plan, HeuristicTakesTheCostModelsChoiceForThePresets) {
  for (const Preset& p : kPresets)
    for (const Precision precision : {Precision::bf16, Precision::fp8}) {
      int last_block_m = 0;
      for (int64_t T = 1; T <= 65536; T *= 2) {
        SCOPED_TRACE(::testing::Message() << p.name << " T=" << T << " " << precision_name(precision));
        expect_heuristic_plans(shape_of(p, T), kH200, precision, last_block_m);
        if (T == 1) EXPECT_EQ(last_block_m, 16) << "decode: 16-row tiles";
        if (T == 65536) EXPECT_EQ(plan_forward(shape_of(p, T), kH200, precision).up.kernel, GemmKernel::wgmma);
      }
    }
  // T = 0 plans (an empty batch is valid) on the smallest tiles.
  EXPECT_EQ(plan_forward(shape_of(kPresets[0], 0), kH200).block_m(), 16);
}

// The models beyond the presets (issue: any model shape, with no table entry) at every T of the
// sweep, 2^0 .. 2^14, in both precisions: on the H200's own name, so a table entry would be found
// if there were one (the presets' are: the check that the lookup is live), the plan comes from the
// heuristic, fits the device and sizes a workspace; the models cover E not a power of two, H not a
// multiple of 128, F not a multiple of 256 and k = 1 .. 8.
TEST(Plan, ModelsBeyondThePresetsArePlannedByTheHeuristicAtEveryT) {
  DeviceInfo h200 = kH200;
  h200.name = "NVIDIA H200";
  EXPECT_EQ(plan_forward(shape_of(kPresets[0], 4096), h200).source.rfind("table:", 0), 0u);
  bool e_not_pow2 = false, h_not_128 = false, f_not_256 = false;
  std::set<int64_t> ks;
  for (const cli::KnownLayer& l : cli::known_layers()) {
    if (l.tuned) continue;
    const MoeShape& m = l.spec.shape;
    e_not_pow2 |= (m.experts & (m.experts - 1)) != 0;
    h_not_128 |= m.hidden % 128 != 0;
    f_not_256 |= m.inter % 256 != 0;
    ks.insert(m.topk);
    auto shape_at = [&](int64_t T) { return MoeShape{T, m.hidden, m.inter, m.experts, m.topk}; };
    for (const Precision precision : {Precision::bf16, Precision::fp8}) {
      int last_block_m = 0;
      for (int64_t T = 1; T <= 16384; T *= 2) {
        SCOPED_TRACE(::testing::Message() << l.spec.name << " T=" << T << (precision == Precision::fp8 ? " fp8" : " bf16"));
        const ForwardPlan plan = plan_forward(shape_at(T), h200, precision);
        EXPECT_EQ(plan.precision(), precision);
        expect_heuristic_plans(shape_at(T), h200, precision, last_block_m);
        EXPECT_LE(tuning::gemm_smem_bytes(plan.up), h200.smem_per_block_optin);
        EXPECT_LE(tuning::gemm_smem_bytes(plan.down), h200.smem_per_block_optin);
        EXPECT_GT(workspace_bytes(plan), size_t(0));
        // What `moekit tune` would time for the model: candidates exist, and each plans.
        const std::vector<tuning::TileChoice> cands = tuning::tune_candidates(shape_at(T), h200, precision);
        EXPECT_FALSE(cands.empty());
        for (const tuning::TileChoice& c : cands)
          EXPECT_NO_THROW(tuning::plan_with(shape_at(T), c.up, c.down, c.down_splits, h200.smem_per_block_optin, h200.sm_count));
      }
    }
  }
  EXPECT_TRUE(e_not_pow2 && h_not_128 && f_not_256);
  EXPECT_EQ(ks, (std::set<int64_t>{1, 2, 4, 6, 8}));
}

TEST(Plan, MaxRowsByHand) {
  // Mixtral, T 100, k 2: block_m 128 (25 rows per expert); 200 + 8*127 = 1216, rounded up to
  // 1280 = 10 blocks of 128.
  const ForwardPlan a = plan_forward(shape_of(kPresets[0], 100), kH200);
  EXPECT_EQ(a.block_m(), 128);
  EXPECT_EQ(a.max_rows(), 1280);
  EXPECT_EQ(a.max_blocks(), 10);
  // DeepSeek-V3, T 1: block_m 16; 8 + 256*15 = 3848, rounded up to 3856 = 241 blocks.
  const ForwardPlan b = plan_forward(shape_of(kPresets[2], 1), kH200);
  EXPECT_EQ(b.max_rows(), 3856);
  EXPECT_EQ(b.max_blocks(), 241);
}

TEST(Plan, DeviceMustBeHopperWithEnoughSharedMemory) {
  const MoeShape s = shape_of(kPresets[1], 64);
  for (int major : {7, 8, 10, 12}) {
    DeviceInfo d = kH200;
    d.cc_major = major;
    EXPECT_TRUE(throws_naming([&] { plan_forward(s, d); }, "device")) << "cc " << major;
  }
  DeviceInfo small = kH200;
  small.smem_per_block_optin = 32 * 1024;  // below every compiled config's pipeline (the smallest: 48 KB)
  EXPECT_TRUE(throws_naming([&] { plan_forward(s, small); }, "device"));
  DeviceInfo none = kH200;
  none.smem_per_block_optin = 0;
  EXPECT_TRUE(throws_naming([&] { plan_forward(s, none); }, "device"));
}

TEST(Plan, PlanForwardWithTakesCompiledConfigsOnly) {
  const MoeShape s = shape_of(kPresets[1], 4096);
  // Every compiled config, as both GEMMs' (an fp8 down-only config with an fp8 up config of its
  // block_m: the up epilogue quantizes whole 128-column groups, tuning::up_config_ok).
  auto fp8_up_of = [](const GemmConfig& c) {
    for (const GemmConfig& u : compiled_gemm_configs(Precision::fp8))
      if (u.kernel == c.kernel && u.block_m == c.block_m && tuning::up_config_ok(u)) return u;
    ADD_FAILURE() << "no fp8 up config for " << c.str();
    return c;
  };
  std::vector<GemmConfig> every = compiled_gemm_configs();
  for (const GemmConfig& c : compiled_gemm_configs(Precision::fp8)) {
    EXPECT_EQ(c.precision, Precision::fp8);
    every.push_back(c);
  }
  for (const GemmConfig& c : every) {
    const bool down_only = !tuning::up_config_ok(c);
    const GemmConfig up = down_only ? fp8_up_of(c) : c;
    const ForwardPlan plan = plan_forward_with(s, up, c);
    EXPECT_EQ(plan.block_m(), c.block_m);
    EXPECT_EQ(plan.up, up);
    EXPECT_EQ(plan.down, c);
    EXPECT_EQ(plan.precision(), c.precision);
    if (down_only) EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, c, c); }, "up"));
    EXPECT_EQ(plan.max_rows(), worst_case_rows(s.tokens, s.topk, s.experts, c.block_m));
  }
  const GemmConfig c16 = compiled_with_block_m(16), c64 = compiled_with_block_m(64);
  GemmConfig odd = c64;
  odd.stages += 7;
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, odd, c64); }, "up"));
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, c64, odd); }, "down"));
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, GemmConfig{}, GemmConfig{}); }, "up"));
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, c16, c64); }, "down"));  // block_m differs
  for (const GemmConfig& c : compiled_gemm_configs(Precision::fp8))  // precisions differ
    if (c.block_m == 16) EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, c16, c); }, "down"));
  MoeShape bad = s;
  bad.hidden = 100;
  EXPECT_TRUE(throws_naming([&] { plan_forward_with(bad, c16, c16); }, "shape.hidden"));
}

// The wgmma kernel's launcher is unchecked; everything it cannot run is refused where a plan or a
// call is made, naming the argument, before any launch: block_m other than its 128-row tile, H or
// F not a multiple of 8 (16-byte rows), split-K past 4 slices or in fp8, a block_n not compiled. (Misaligned or missing
// operands and workspace buffers: the stage entries' tests, validation_stage_test.cpp.)
TEST(Sm90Preconditions, TheBoundaryRefusesWhatTheWgmmaKernelCannotRun) {
  const MoeShape s{16, 128, 128, 4, 2};
  std::vector<GemmConfig> wgmma;
  for (const GemmConfig& c : compiled_gemm_configs())
    if (c.kernel == GemmKernel::wgmma) wgmma.push_back(c);
  ASSERT_FALSE(wgmma.empty());
  const GemmConfig c64 = compiled_with_block_m(64);
  for (const GemmConfig& w : wgmma) {
    EXPECT_EQ(w.block_m, 128) << w.str();  // every compiled wgmma config is the kernel's tile
    EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, w, c64); }, "down")) << w.str();  // block_m differs
    // Split-K: 2 and 4 slices on the bf16 down GEMM, never 8 (nor any on the fp8 kernel: below).
    EXPECT_NO_THROW(plan_forward_with(s, w, w, 2)) << w.str();
    EXPECT_NO_THROW(plan_forward_with(s, w, w, 4)) << w.str();
    EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, w, w, 8); }, "down_splits")) << w.str();
    MoeShape odd = s;
    odd.hidden = 100;
    EXPECT_TRUE(throws_naming([&] { plan_forward_with(odd, w, w); }, "shape.hidden")) << w.str();
    odd = s;
    odd.inter = 100;
    EXPECT_TRUE(throws_naming([&] { plan_forward_with(odd, w, w); }, "shape.inter")) << w.str();
    GemmConfig n192 = w;
    n192.block_n = 192;
    EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, n192, n192); }, "up")) << w.str();
  }
  for (const GemmConfig& w : compiled_gemm_configs(Precision::fp8))
    if (w.kernel == GemmKernel::wgmma)
      EXPECT_TRUE(throws_naming([&] { plan_forward_with(s, w, w, 2); }, "down_splits")) << w.str();
}

// Every kernel choice of the layer is in the plan: the router's logits tiling and selection, and
// align's kernel, by the rules of tuning/heuristic.cpp.
TEST(Plan, RecordsTheRouterAndAlignKernels) {
  const ForwardPlan mixtral1 = plan_forward(shape_of(kPresets[0], 1), kH200);
  EXPECT_EQ(mixtral1.router.gate, GateKernel::cluster_16x8);
  EXPECT_EQ(mixtral1.router.select, SelectKernel::warp);
  EXPECT_EQ(mixtral1.align, AlignKernel::warp);
  const ForwardPlan ds16 = plan_forward(shape_of(kPresets[2], 16), kH200);
  EXPECT_EQ(ds16.router.select, SelectKernel::cta);  // 128 < E <= 256 at decode
  EXPECT_EQ(ds16.align, AlignKernel::warp);           // 128 assignments
  const ForwardPlan qwen256 = plan_forward(shape_of(kPresets[1], 256), kH200);
  EXPECT_EQ(qwen256.router.gate, GateKernel::cluster_32x32);
  EXPECT_EQ(qwen256.router.select, SelectKernel::warp);  // E = 128
  EXPECT_EQ(qwen256.align, AlignKernel::cta);            // 2048 assignments
  const ForwardPlan ds4096 = plan_forward(shape_of(kPresets[2], 4096), kH200);
  EXPECT_EQ(ds4096.router.gate, GateKernel::pipelined_128x64);  // 128 of the 128 x 64 tiles: more than half the SMs
  EXPECT_EQ(ds4096.router.select, SelectKernel::warp);  // prefill: throughput, not latency
  EXPECT_EQ(ds4096.align, AlignKernel::grid);
  EXPECT_EQ(plan_forward(shape_of(kPresets[0], 4096), kH200).router.gate, GateKernel::looped_64x8);  // E = 8
  // Past T = 256 the cluster tiling while it has at most 128 tiles of 32 tokens x 32 experts (x 8
  // for E <= 8), up to T = 2048: the crossovers measured (tuning/heuristic.cpp, kGateClusterMaxTiles).
  const auto gate = [](int preset, int64_t T) { return plan_forward_heuristic(shape_of(kPresets[preset], T), kH200).router.gate; };
  for (int64_t T : {512, 1024, 2048}) EXPECT_EQ(gate(0, T), GateKernel::cluster_32x8) << T;  // Mixtral: 16-64 tiles
  EXPECT_EQ(gate(1, 512), GateKernel::cluster_32x32);                                       // Qwen3: 64 tiles
  EXPECT_EQ(gate(1, 1024), GateKernel::cluster_32x32);                                      // 128
  EXPECT_EQ(gate(1, 2048), GateKernel::looped_64x32);                                       // 256
  EXPECT_EQ(gate(2, 512), GateKernel::cluster_32x32);                                       // DeepSeek-V3: 128
  EXPECT_EQ(gate(2, 1024), GateKernel::looped_64x32);                                       // 256
  EXPECT_EQ(gate(0, 4096), GateKernel::looped_64x8);  // past the largest T measured
  // Not enough shared memory for the pipelined kernel's block table: the looped one.
  DeviceInfo small = kH200;
  small.smem_per_block_optin = 196700;  // the wgmma tiles' 196,608 bytes fit, the 196,832 of H = 7168 do not
  EXPECT_EQ(plan_forward_heuristic(shape_of(kPresets[2], 4096), small).router.gate, GateKernel::looped_64x32);
  // The plan prints them.
  EXPECT_NE(ds4096.str().find("router=gate=pipelined128x64 select=warp"), std::string::npos) << ds4096.str();
  const ForwardPlan ds2048 = plan_forward(shape_of(kPresets[2], 2048), kH200);  // 64 wide tiles: half the SMs
  EXPECT_EQ(ds2048.router.gate, GateKernel::pipelined_128x32);
  EXPECT_NE(ds2048.str().find("router=gate=pipelined128x32"), std::string::npos) << ds2048.str();
  EXPECT_NE(ds4096.str().find("align=grid"), std::string::npos) << ds4096.str();
}

TEST(Plan, ConfigsPrintThemselves) {
  const GemmConfig c{16, 64, 128, 1, 4, 4};
  EXPECT_EQ(c.str(), "m16n64k128w1x4s4");
  EXPECT_EQ(c.threads(), 128);
  for (const GemmConfig& g : compiled_gemm_configs()) EXPECT_FALSE(g.str().empty());
  const ForwardPlan plan = plan_forward(shape_of(kPresets[0], 1000), kH200);
  const std::string s = plan.str();
  EXPECT_NE(s.find(plan.up.str()), std::string::npos) << s;
  EXPECT_NE(s.find(plan.down.str()), std::string::npos) << s;
  EXPECT_NE(s.find("block_m=" + std::to_string(plan.block_m())), std::string::npos) << s;
  EXPECT_NE(s.find("T=1000"), std::string::npos) << s;
  EXPECT_NE(s.find("E=8"), std::string::npos) << s;
}

TEST(Plan, CompiledConfigsCoverEveryBlockMTheChooserPicks) {
  for (int bm : {16, 64, 128}) EXPECT_NO_THROW(compiled_with_block_m(bm)) << bm;
  for (const GemmConfig& c : compiled_gemm_configs()) {
    EXPECT_GT(c.threads(), 0) << c.str();
    EXPECT_EQ(c.block_m % 16, 0) << c.str();  // whole mma tiles
  }
}

TEST(Plan, NoTokensPlansFine) {
  for (const Preset& p : kPresets) {
    const ForwardPlan plan = plan_forward(shape_of(p, 0), kH200);
    EXPECT_EQ(plan.block_m(), 16);
    EXPECT_EQ(plan.max_rows(), worst_case_rows(0, p.k, p.E, 16));
    EXPECT_GT(workspace_bytes(plan), 0u);
    EXPECT_NO_THROW(carve_workspace(plan, fake_ptr(1), workspace_bytes(plan)));
  }
}

// ---- workspace ------------------------------------------------------------------------------

std::vector<View> views_of(const Workspace& ws) {
  return {{"router_logits", ws.router_logits},
          {"topk_ids", ws.topk_ids},          {"topk_weights", ws.topk_weights},
          {"sorted_ids", ws.sorted_ids},      {"block_expert", ws.block_expert},
          {"num_rows_padded", ws.num_rows_padded}, {"expert_counts", ws.expert_counts},
          {"act", ws.act},                    {"y_rows", ws.y_rows},
          {"status", ws.status},              {"gemm_counter", ws.gemm_counter}};
}

TEST(Workspace, ViewsAreAlignedDisjointAndInsideTheBuffer) {
  for (const Preset& p : kPresets)
    for (int64_t T : {0, 1, 17, 1000, 4096}) {
      SCOPED_TRACE(::testing::Message() << p.name << " T=" << T);
      const ForwardPlan plan = plan_forward(shape_of(p, T), kH200);
      const size_t bytes = workspace_bytes(plan);
      const Workspace ws = carve_workspace(plan, fake_ptr(1), bytes);
      const std::vector<View> views = views_of(ws);
      expect_views_in_buffer(views, fake_ptr(1), bytes);
      // The views are exactly what the stages validate against.
      EXPECT_NO_THROW(detail::expect_workspace(plan, ws, "test"));
      const MoeShape& s = plan.shape;
      EXPECT_TRUE(ws.router_logits.dtype == DType::f32 && ws.router_logits.rank == 2 && ws.router_logits.dim(0) == s.tokens && ws.router_logits.dim(1) == s.experts);
      EXPECT_TRUE(ws.topk_ids.dtype == DType::i32 && ws.topk_ids.rank == 2 && ws.topk_ids.dim(0) == s.tokens && ws.topk_ids.dim(1) == s.topk);
      EXPECT_TRUE(ws.topk_weights.dtype == DType::f32 && ws.topk_weights.dim(0) == s.tokens && ws.topk_weights.dim(1) == s.topk);
    }
}

// The training forward (save_h) writes h to a caller's tensor: its workspace is the plain plan's,
// byte for byte, and its plan says save_h.
TEST(Workspace, SaveHChangesNoWorkspaceByte) {
  for (const Preset& p : kPresets)
    for (int64_t T : {1, 1000, 4096}) {
      SCOPED_TRACE(::testing::Message() << p.name << " T=" << T);
      const ForwardPlan plain = plan_forward(shape_of(p, T), kH200);
      ForwardPlan training = plain;
      training.save_h = true;
      EXPECT_EQ(workspace_bytes(training), workspace_bytes(plain));
      EXPECT_NE(training.str().find(" save_h"), std::string::npos) << training.str();
      EXPECT_EQ(plain.str().find("save_h"), std::string::npos) << plain.str();
    }
}

TEST(Workspace, CarveRejectsBadBuffers) {
  const ForwardPlan plan = plan_forward(shape_of(kPresets[1], 256), kH200);
  const size_t bytes = workspace_bytes(plan);
  EXPECT_TRUE(throws_naming([&] { carve_workspace(plan, nullptr, bytes); }, "base"));
  for (uintptr_t off : {1, 16, 128}) {  // 16-byte alignment is not enough: views are 256-aligned
    void* p = static_cast<char*>(fake_ptr(1)) + off;
    EXPECT_TRUE(throws_naming([&] { carve_workspace(plan, p, bytes); }, "base")) << "offset " << off;
  }
  EXPECT_TRUE(throws_naming([&] { carve_workspace(plan, fake_ptr(1), bytes - 1); }, "bytes"));
  EXPECT_TRUE(throws_naming([&] { carve_workspace(plan, fake_ptr(1), 0); }, "bytes"));
  EXPECT_NO_THROW(carve_workspace(plan, fake_ptr(1), bytes + 4096));  // larger is fine
}

}  // namespace
}  // namespace moekit::testing
