// backward_workspace_test.cpp — the backward's workspace layout (backward_workspace_bytes,
// carve_backward_workspace): pure host functions, checked on a hand-made H200 — sizes by hand,
// alignment, no overlap, 64-bit sizes at a large T, bad buffers and plans named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backward_cpu_util.hpp"
#include "cpu_test_util.hpp"
#include "moekit/backward.hpp"
#include "tuning/backward_planner.hpp"
#include "tuning/planner.hpp"

namespace moekit::testing {
namespace {

// ---- workspace ------------------------------------------------------------------------------

std::vector<View> views_of(const BackwardWorkspace& ws) {
  return {{"h", ws.h},
          {"dh", ws.dh},
          {"act_w", ws.act_w},
          {"dw_partials", ws.dw_partials},
          {"d_topk_weights", ws.d_topk_weights},
          {"dx_rows", ws.dx_rows},
          {"dx_partials", ws.dx_partials},
          {"d_logits", ws.d_logits},
          {"gate_partials", ws.gate_partials},
          {"expert_row_start", ws.expert_row_start},
          {"dw13_partials", ws.dw13_partials},
          {"dw2_partials", ws.dw2_partials},
          {"gemm_counter", ws.gemm_counter}};
}

int64_t rounded(int64_t bytes) { return (bytes + 255) / 256 * 256; }
bool is(const Tensor& t, DType d, std::initializer_list<int64_t> shape) {
  if (t.dtype != d || t.rank != int(shape.size())) return false;
  int i = 0;
  for (int64_t s : shape)
    if (t.dim(i++) != s) return false;
  return true;
}

// The layout by hand: each piece that the plan uses, its bytes rounded up to 256.
int64_t bytes_by_hand(const BackwardPlan& p) {
  const MoeShape& s = p.shape;
  const BackwardOptions& o = p.options;
  const int64_t tk = s.tokens * s.topk, rows = p.max_rows(), F = s.inter, H = s.hidden, E = s.experts;
  const bool gate = o.router == RouterGrad::gate;
  int64_t n = 0;
  if (o.saved == SavedActivations::recompute) n += rounded(rows * 2 * F * 2);
  if (o.input_grad || o.weight_grads) n += rounded(rows * 2 * F * 2);
  if (o.weight_grads) n += rounded(rows * F * 2);
  n += rounded(p.d_col_tiles() * tk * 4) + rounded(tk * 4);
  if (o.input_grad) n += p.dx_splits == 1 ? rounded(tk * H * 2) : rounded(p.dx_splits * tk * H * 4);
  if (gate) n += rounded(s.tokens * 2 * ((E + 7) / 8 * 8) * 2);  // d_logits: bf16 hi | lo, E padded to 8
  if (gate && p.gate_splits > 1) n += rounded(p.gate_splits * E * H * 4);
  if (o.weight_grads) n += rounded((E + 1) * 4);
  if (o.weight_grads && p.dw_splits > 1) n += rounded(p.dw_splits * E * 2 * F * H * 4) + rounded(p.dw_splits * E * H * F * 4);
  return n + 256;  // gemm_counter
}

std::vector<BackwardOptions> option_sets() {
  std::vector<BackwardOptions> sets;
  for (SavedActivations saved : {SavedActivations::recompute, SavedActivations::h})
    for (RouterGrad router : {RouterGrad::none, RouterGrad::logits, RouterGrad::gate})
      for (int grads = 0; grads < 4; ++grads) {
        BackwardOptions o;
        o.saved = saved, o.router = router, o.input_grad = grads & 1, o.weight_grads = grads & 2;
        sets.push_back(o);
      }
  return sets;
}

TEST(BackwardWorkspace, ViewsAreWhatThePlanNeedsAlignedAndDisjoint) {
  for (const MoeShape& shape : {MoeShape{0, 256, 128, 4, 2}, MoeShape{1, 4096, 14336, 8, 2},
                                MoeShape{300, 2048, 768, 128, 8}, MoeShape{16384, 256, 128, 4, 2}})
    for (const BackwardOptions& o : option_sets()) {
      const BackwardPlan p = plan_backward(plan_forward(shape, kH200), kH200, o);
      SCOPED_TRACE(p.str());
      const size_t bytes = backward_workspace_bytes(p);
      EXPECT_EQ(int64_t(bytes), bytes_by_hand(p));
      const BackwardWorkspace ws = carve_backward_workspace(p, fake_ptr(1), bytes);
      const std::vector<View> views = views_of(ws);
      expect_views_in_buffer(views, fake_ptr(1), bytes);
      const int64_t T = shape.tokens, tk = T * shape.topk, H = shape.hidden, F = shape.inter, E = shape.experts;
      const int64_t rows = p.max_rows();
      const bool gate = o.router == RouterGrad::gate;
      EXPECT_EQ(ws.h.given(), o.saved == SavedActivations::recompute);
      if (ws.h.given()) EXPECT_TRUE(is(ws.h, DType::bf16, {rows, 2 * F}));
      EXPECT_EQ(ws.dh.given(), o.input_grad || o.weight_grads);
      if (ws.dh.given()) EXPECT_TRUE(is(ws.dh, DType::bf16, {rows, 2 * F}));
      EXPECT_EQ(ws.act_w.given(), o.weight_grads);
      if (ws.act_w.given()) EXPECT_TRUE(is(ws.act_w, DType::bf16, {rows, F}));
      EXPECT_TRUE(is(ws.dw_partials, DType::f32, {p.d_col_tiles(), tk}));
      EXPECT_TRUE(is(ws.d_topk_weights, DType::f32, {T, shape.topk}));
      EXPECT_EQ(ws.dx_rows.given(), o.input_grad && p.dx_splits == 1);
      if (ws.dx_rows.given()) EXPECT_TRUE(is(ws.dx_rows, DType::bf16, {tk, H}));
      EXPECT_EQ(ws.dx_partials.given(), o.input_grad && p.dx_splits > 1);
      if (ws.dx_partials.given()) EXPECT_TRUE(is(ws.dx_partials, DType::f32, {p.dx_splits, tk, H}));
      EXPECT_EQ(ws.d_logits.given(), gate);
      if (ws.d_logits.given()) EXPECT_TRUE(is(ws.d_logits, DType::bf16, {T, 2 * p.experts_padded()}));
      EXPECT_EQ(ws.gate_partials.given(), gate && p.gate_splits > 1);
      EXPECT_EQ(ws.expert_row_start.given(), o.weight_grads);
      if (ws.expert_row_start.given()) EXPECT_TRUE(is(ws.expert_row_start, DType::i32, {E + 1}));
      EXPECT_EQ(ws.dw13_partials.given(), o.weight_grads && p.dw_splits > 1);
      if (ws.dw13_partials.given()) EXPECT_TRUE(is(ws.dw13_partials, DType::f32, {p.dw_splits, E, 2 * F, H}));
      if (ws.dw2_partials.given()) EXPECT_TRUE(is(ws.dw2_partials, DType::f32, {p.dw_splits, E, H, F}));
      EXPECT_TRUE(is(ws.gemm_counter, DType::i32, {1}));
    }
}

TEST(BackwardWorkspace, CoversEverySplitKPiece) {
  // The shapes above reach each split-K piece at least once (else the layout test checks less).
  const BackwardPlan decode = plan_backward(plan_forward(MoeShape{1, 4096, 14336, 8, 2}, kH200), kH200, every_grad());
  EXPECT_GT(decode.dx_splits, 1) << decode.str();
  const BackwardPlan small = plan_backward(plan_forward(MoeShape{16384, 256, 128, 4, 2}, kH200), kH200, every_grad());
  EXPECT_GT(small.dw_splits, 1) << small.str();
  EXPECT_GT(small.gate_splits, 1) << small.str();
}

TEST(BackwardWorkspace, SizesAre64Bit) {
  // DeepSeek-V3 at T = 2^20 (a long prefill's batch): dx_rows alone is 2^20·8·7168·2 = 112 GiB,
  // h and dh 2 x (8 Mi + padding) rows x 4096 x 2 bytes: every piece and offset past 2^32.
  const MoeShape s = shape_of(kPresets[2], int64_t(1) << 20);
  const BackwardPlan p = plan_backward(plan_forward(s, kH200), kH200, every_grad());
  const size_t bytes = backward_workspace_bytes(p);
  EXPECT_EQ(int64_t(bytes), bytes_by_hand(p));
  EXPECT_GT(bytes, size_t(int64_t(1) << 37));
  const int64_t tk = s.tokens * s.topk;
  const BackwardWorkspace ws = carve_backward_workspace(p, fake_ptr(1), bytes);
  EXPECT_EQ(ws.dx_rows.bytes(), tk * s.hidden * 2);
  EXPECT_EQ(ws.h.bytes(), p.max_rows() * 2 * s.inter * 2);
  // The pieces follow each other: dx_rows starts after h, dh, act_w, dw_partials and d_topk_weights.
  const int64_t before = rounded(p.max_rows() * 2 * s.inter * 2) * 2 + rounded(p.max_rows() * s.inter * 2) +
                         rounded(p.d_col_tiles() * tk * 4) + rounded(tk * 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ws.dx_rows.data) - reinterpret_cast<uintptr_t>(fake_ptr(1)), uintptr_t(before));
}

TEST(BackwardWorkspace, RefusesBadBuffersAndBadPlans) {
  // On the wgmma tiles (block_m 128), whatever the planner's choice for the shape: the edits
  // below include the split-K that a wgmma dx config refuses.
  const GemmConfig& wgmma = *std::find_if(compiled_gemm_configs().begin(), compiled_gemm_configs().end(),
                                          [](const GemmConfig& c) { return c.kernel == GemmKernel::wgmma; });
  const BackwardPlan p = plan_backward(plan_forward_with(MoeShape{256, 2048, 768, 128, 8}, wgmma, wgmma), kH200);
  const size_t bytes = backward_workspace_bytes(p);
  EXPECT_TRUE(throws_naming([&] { carve_backward_workspace(p, nullptr, bytes); }, "base"));
  for (uintptr_t off : {1, 16, 128})
    EXPECT_TRUE(throws_naming([&] { carve_backward_workspace(p, static_cast<char*>(fake_ptr(1)) + off, bytes); }, "base"));
  EXPECT_TRUE(throws_naming([&] { carve_backward_workspace(p, fake_ptr(1), bytes - 1); }, "bytes"));
  EXPECT_TRUE(throws_naming([&] { carve_backward_workspace(p, fake_ptr(1), 0); }, "bytes"));
  EXPECT_NO_THROW(carve_backward_workspace(p, fake_ptr(1), bytes + 4096));
  // A plan not made by plan_backward is refused, not sized (a block_m of 0 would divide by 0).
  EXPECT_TRUE(throws_naming([] { backward_workspace_bytes(BackwardPlan{}); }, "shape.hidden"));
  for (auto edit : std::vector<void (*)(BackwardPlan&)>{
           [](BackwardPlan& b) { b.block_m = 0; }, [](BackwardPlan& b) { b.block_m = 7; },
           [](BackwardPlan& b) { b.d.block_m = 16; }, [](BackwardPlan& b) { b.dx.stages = 99; },
           [](BackwardPlan& b) { b.up.precision = Precision::fp8; }, [](BackwardPlan& b) { b.dx_splits = 0; },
           [](BackwardPlan& b) { b.dx_splits = 2; },  // a wgmma dx config (block_m 128) writes whole rows
           [](BackwardPlan& b) { b.dw_splits = kMaxWeightGradSplits + 1; },
           [](BackwardPlan& b) { b.gate_splits = 0; },
           [](BackwardPlan& b) { b.gate_splits = kMaxGateGradSplits + 1; }}) {
    BackwardPlan b = p;
    edit(b);
    EXPECT_TRUE(throws_naming([&] { backward_workspace_bytes(b); }, "plan")) << b.str();
    EXPECT_TRUE(throws_naming([&] { carve_backward_workspace(b, fake_ptr(1), bytes); }, "plan"));
  }
  BackwardPlan b = p;
  b.options.weight_grad_dtype = DType::i32;
  EXPECT_TRUE(throws_naming([&] { backward_workspace_bytes(b); }, "options.weight_grad_dtype"));
}

}  // namespace
}  // namespace moekit::testing
