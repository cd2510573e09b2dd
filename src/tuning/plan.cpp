// plan.cpp — the one config chooser (pure host code, unit-tested on the CPU) and the workspace
// layout. plan_forward maps (shape, device) to tile configs — a measured table's bucket
// (tuning/table.hpp) where there is one, the heuristic otherwise; carve_workspace maps a caller's
// buffer to the intermediate tensors of one forward pass.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "common/cuda_check.hpp"
#include "common/validate.hpp"
#include "gemm/configs.hpp"
#include "moekit/moe.hpp"
#include "tuning/table.hpp"

namespace moekit {

std::string GemmConfig::str() const {
  return std::string(kernel == GemmKernel::wgmma ? "wgmma-" : "") + "m" + std::to_string(block_m) + "n" + std::to_string(block_n) + "k" +
         std::to_string(block_k) + "w" + std::to_string(warps_m) + "x" + std::to_string(warps_n) +
         "s" + std::to_string(stages);
}

std::string ForwardPlan::str() const {
  return "T=" + std::to_string(shape.tokens) + " H=" + std::to_string(shape.hidden) +
         " F=" + std::to_string(shape.inter) + " E=" + std::to_string(shape.experts) +
         " k=" + std::to_string(shape.topk) + " block_m=" + std::to_string(block_m) +
         " up=" + up.str() + " down=" + down.str() +
         (down_splits > 1 ? " down_splits=" + std::to_string(down_splits) : "") + " source=" + source;
}

const std::vector<GemmConfig>& compiled_gemm_configs() {
#define MK_CONFIG_ENTRY(bm, bn, bk, wm, wn, st) GemmConfig{bm, bn, bk, wm, wn, st, GemmKernel::mma_sync},
#define MK_WGMMA_ENTRY(bn, st) GemmConfig{128, bn, 64, 12, 1, st, GemmKernel::wgmma},
  static const std::vector<GemmConfig> configs = {MOEKIT_GEMM_CONFIGS(MK_CONFIG_ENTRY)
                                                      MOEKIT_WGMMA_CONFIGS(MK_WGMMA_ENTRY)};
#undef MK_WGMMA_ENTRY
#undef MK_CONFIG_ENTRY
  return configs;
}

DeviceInfo query_device(int device) {
  if (device < 0) MK_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp p{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo d;
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.smem_per_block_optin = int64_t(p.sharedMemPerBlockOptin);
  d.l2_bytes = p.l2CacheSize;
  return d;
}

using tuning::gemm_smem_bytes;

ForwardPlan plan_forward_with(const MoeShape& shape, const GemmConfig& up, const GemmConfig& down,
                              int down_splits) {
  detail::expect_shape(shape, "plan_forward");
  const auto& compiled = compiled_gemm_configs();
  if (std::find(compiled.begin(), compiled.end(), up) == compiled.end())
    detail::fail("plan_forward", "up", "config " + up.str() + " is not compiled (see src/gemm/configs.hpp)");
  if (std::find(compiled.begin(), compiled.end(), down) == compiled.end())
    detail::fail("plan_forward", "down", "config " + down.str() + " is not compiled (see src/gemm/configs.hpp)");
  if (up.block_m != down.block_m)
    detail::fail("plan_forward", "down", "block_m must equal the up config's: both GEMMs read one aligned layout");
  if (down_splits < 1 || down_splits > kMaxDownSplits)
    detail::fail("plan_forward", "down_splits", "must be in [1, " + std::to_string(kMaxDownSplits) + "], got " + std::to_string(down_splits));
  if (down_splits > 1 && down.kernel != GemmKernel::mma_sync)
    detail::fail("plan_forward", "down_splits", "split-K is a decode technique of the mma.sync kernel; " + down.str() + " has none");
  ForwardPlan plan;
  plan.shape = shape;
  plan.down_splits = down_splits;
  plan.block_m = up.block_m;
  plan.up = up;
  plan.down = down;
  plan.max_rows = shape.tokens * shape.topk + shape.experts * (plan.block_m - 1);
  plan.max_rows = (plan.max_rows + plan.block_m - 1) / plan.block_m * plan.block_m;
  plan.max_blocks = plan.max_rows / plan.block_m;
  return plan;
}

// Decode leaves the down GEMM with few output tiles (Mixtral, T=1: 2 experts x 64 column tiles
// for 264 resident CTAs), so most SMs would idle. Split K until the expected tiles fill the
// resident CTAs twice over; each split needs at least 4 K-tiles to keep its pipeline busy.
static int choose_down_splits(const MoeShape& s, const GemmConfig& c, const DeviceInfo& device) {
  if (c.block_m != 16) return 1;  // prefill tiles fill the GPU
  const int64_t assignments = s.tokens * s.topk;
  const int64_t experts_touched = std::min(s.experts, assignments);
  const int64_t rows_per_expert = (assignments + experts_touched - 1) / std::max<int64_t>(experts_touched, 1);
  const int64_t blocks = experts_touched * ((rows_per_expert + c.block_m - 1) / c.block_m);
  const int64_t tiles = blocks * ((s.hidden + c.block_n - 1) / c.block_n);
  const int64_t resident = int64_t(device.sm_count) * std::max<int64_t>(1, device.smem_per_block_optin / gemm_smem_bytes(c));
  const int64_t k_tiles = (s.inter + c.block_k - 1) / c.block_k;
  int splits = 1;
  while (splits < kMaxDownSplits && tiles * splits < 2 * resident && k_tiles / (2 * splits) >= 4) splits *= 2;
  return splits;
}

static void expect_hopper(const DeviceInfo& device) {
  if (device.cc_major != 9)
    detail::fail("plan_forward", "device", "moekit's kernels are built for sm_90a (Hopper); got compute capability " +
                                               std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor));
}

ForwardPlan plan_forward(const MoeShape& shape, const DeviceInfo& device) {
  detail::expect_shape(shape, "plan_forward");
  expect_hopper(device);
  // A measured bucket for this device and shape first. Table entries that name configs no longer
  // compiled (or invalid here) are skipped, so a stale table falls back instead of failing.
  if (std::optional<ForwardPlan> plan = tuning::plan_from_table(tuning::compiled_tuning_table(), shape, device))
    return *plan;
  return plan_forward_heuristic(shape, device);
}

namespace {
// The largest rows per expert (T*k/E) the heuristic still plans with 16-row decode tiles.
constexpr int64_t kDecodeRowsPerExpert = 12;
}  // namespace

ForwardPlan plan_forward_heuristic(const MoeShape& shape, const DeviceInfo& device) {
  detail::expect_shape(shape, "plan_forward");
  expect_hopper(device);
  // Tile shape follows rows per expert, not T (DESIGN "Rules"): a few rows per expert is a
  // weight read (16-row mma.sync tiles, little padding); from about a dozen rows the wgmma
  // kernel's 128-row tiles win even half empty. `moekit tune` on the H200 (configs/, 2026-11-29)
  // bracketed the switch: 16-row tiles won at 8 rows per expert (Mixtral T=32, Qwen3 T=128,
  // DeepSeek-V3 T=256), the wgmma tiles at 16 (Mixtral T=64, Qwen3 T=256, DeepSeek-V3 T=512), by
  // 4-85%; the 64-row mma.sync tiles won nowhere. 12 is the middle of that bracket.
  const int64_t rows = shape.tokens * shape.topk;  // rows per expert = rows / E, compared exactly
  const int block_m = rows <= kDecodeRowsPerExpert * shape.experts ? 16 : 128;
  const GemmKernel kernel = block_m == 128 ? GemmKernel::wgmma : GemmKernel::mma_sync;
  const GemmConfig* pick = nullptr;
  for (const GemmConfig& c : compiled_gemm_configs())
    if (c.block_m == block_m && c.kernel == kernel && gemm_smem_bytes(c) <= device.smem_per_block_optin) {
      pick = &c;
      break;
    }
  if (!pick) detail::fail("plan_forward", "device", "no compiled GEMM config fits its shared memory");
  ForwardPlan plan = plan_forward_with(shape, *pick, *pick, choose_down_splits(shape, *pick, device));
  plan.source = "heuristic";
  return plan;
}

// ---- workspace ------------------------------------------------------------------------------

namespace {
constexpr int64_t kAlign = 256;
int64_t round_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

struct Layout {
  int64_t router_logits, topk_ids, topk_weights, sorted_ids, block_expert, num_rows_padded, expert_counts, status,
      act, y_rows, y_partials, align_scratch, gemm_counter, total;
};

Layout layout_of(const ForwardPlan& p) {
  const MoeShape& s = p.shape;
  const int64_t tk = s.tokens * s.topk;
  Layout l{};
  int64_t off = 0;
  auto take = [&](int64_t bytes) { int64_t at = off; off += round_up(bytes); return at; };
  l.router_logits = take(s.tokens * s.experts * 4);
  l.topk_ids = take(tk * 4);
  l.topk_weights = take(tk * 4);
  l.sorted_ids = take(p.max_rows * 4);
  l.block_expert = take(p.max_blocks * 4);
  l.num_rows_padded = take(4);
  l.expert_counts = take(s.experts * 4);
  l.status = take(4);
  l.act = take(p.max_rows * s.inter * 2);
  l.y_rows = take(tk * s.hidden * 2);
  l.y_partials = take(p.down_splits > 1 ? p.down_splits * tk * s.hidden * 4 : 0);
  l.align_scratch = take(tk > kAlignGridMinAssignments ? int64_t(kAlignMaxCtas) * (s.experts + 1) * 4 : 0);
  l.gemm_counter = take(4);
  l.total = off;
  return l;
}
}  // namespace

size_t workspace_bytes(const ForwardPlan& plan) { return size_t(layout_of(plan).total); }

Workspace carve_workspace(const ForwardPlan& p, void* base, size_t bytes) {
  return detail::carve_named(p, base, bytes, "carve_workspace", "base", "bytes");
}

Workspace detail::carve_named(const ForwardPlan& p, void* base, size_t bytes, const char* entry,
                              const char* base_arg, const char* bytes_arg) {
  const Layout l = layout_of(p);
  if (base == nullptr) detail::fail(entry, base_arg, "workspace pointer is null");
  if (reinterpret_cast<uintptr_t>(base) % kAlign != 0)
    detail::fail(entry, base_arg, "workspace must be 256-byte aligned");
  if (int64_t(bytes) < l.total)
    detail::fail(entry, bytes_arg, "workspace of " + std::to_string(bytes) + " bytes is smaller than workspace_bytes(plan) = " + std::to_string(l.total));
  char* b = static_cast<char*>(base);
  const MoeShape& s = p.shape;
  const int64_t tk = s.tokens * s.topk;
  Workspace ws;
  ws.router_logits = Tensor(b + l.router_logits, DType::f32, {s.tokens, s.experts});
  ws.topk_ids = Tensor(b + l.topk_ids, DType::i32, {s.tokens, s.topk});
  ws.topk_weights = Tensor(b + l.topk_weights, DType::f32, {s.tokens, s.topk});
  ws.sorted_ids = Tensor(b + l.sorted_ids, DType::i32, {p.max_rows});
  ws.block_expert = Tensor(b + l.block_expert, DType::i32, {p.max_blocks});
  ws.num_rows_padded = Tensor(b + l.num_rows_padded, DType::i32, {1});
  ws.expert_counts = Tensor(b + l.expert_counts, DType::i32, {s.experts});
  ws.status = Tensor(b + l.status, DType::i32, {1});
  ws.act = Tensor(b + l.act, DType::bf16, {p.max_rows, s.inter});
  ws.y_rows = Tensor(b + l.y_rows, DType::bf16, {tk, s.hidden});
  if (p.down_splits > 1)
    ws.y_partials = Tensor(b + l.y_partials, DType::f32, {int64_t(p.down_splits), tk, s.hidden});
  if (tk > kAlignGridMinAssignments)
    ws.align_scratch = Tensor(b + l.align_scratch, DType::i32, {int64_t(kAlignMaxCtas), s.experts + 1});
  ws.gemm_counter = Tensor(b + l.gemm_counter, DType::i32, {1});
  return ws;
}

}  // namespace moekit
