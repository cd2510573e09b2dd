// cost_model.cpp — the planner's estimate of a tile choice's time (cost_model.hpp): the expected
// blocks of a uniform random routing, then per GEMM a memory time (the touched experts' weights
// from HBM at the bandwidth the CTAs in flight can pull, plus the re-reads of an expert's weights
// by its further blocks at L2 bandwidth) and a math time (the rows the tensor cores compute at the
// kernel's rate, on the share of the SMs the grid fills), combined as a p-norm (the larger where
// the other is small, more where they are close), plus a fixed cost per wave of work items and
// per launch.
#include "tuning/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/validate.hpp"
#include "gemm/sm90/geometry.hpp"
#include "tuning/planner.hpp"

namespace moekit::tuning {

int ctas_per_sm(const GemmConfig& c, bool up, const DeviceInfo& device) {
  if (c.kernel == GemmKernel::wgmma) return 1;
  const bool fp8 = c.precision == Precision::fp8;
  for (const OccupancyEntry& o : compiled_occupancy_table())
    if (o.fp8 == fp8 && o.up == up && o.block_m == c.block_m && o.block_n == c.block_n && o.block_k == c.block_k &&
        o.warps_m == c.warps_m && o.warps_n == c.warps_n && o.stages == c.stages)
      return o.ctas;
  return int(std::max<int64_t>(1, device.smem_per_block_optin / std::max<int64_t>(1, gemm_smem_bytes(c))));
}

BlockEstimate expected_blocks(int64_t tokens, int64_t experts, int64_t topk, int block_m) {
  BlockEstimate e;
  if (tokens <= 0 || experts <= 0 || topk <= 0) return e;
  const double p = std::min(1.0, double(topk) / double(experts));
  const double T = double(tokens);
  auto ceil_blocks = [&](int64_t x) { return double((x + block_m - 1) / block_m); };
  if (p >= 1.0) return {double(experts), double(experts) * ceil_blocks(tokens)};
  // Σ_x pmf(x) · ceil(x / block_m) over mean ± 12 standard deviations (the rest weighs < 1e-30),
  // pmf in log space (lgamma) so that T = 16384 neither under- nor overflows.
  const double mean = T * p, sd = std::sqrt(T * p * (1 - p));
  const int64_t lo = std::max<int64_t>(0, int64_t(std::floor(mean - 12 * sd - 1)));
  const int64_t hi = std::min<int64_t>(tokens, int64_t(std::ceil(mean + 12 * sd + 1)));
  const double lp = std::log(p), lq = std::log1p(-p), lg_t = std::lgamma(T + 1);
  double per_expert = 0;
  for (int64_t x = lo; x <= hi; ++x) {
    const double lpmf = lg_t - std::lgamma(double(x) + 1) - std::lgamma(T - double(x) + 1) + double(x) * lp +
                        (T - double(x)) * lq;
    per_expert += std::exp(lpmf) * ceil_blocks(x);
  }
  e.touched = double(experts) * -std::expm1(T * lq);  // 1 - (1 - p)^T
  e.blocks = double(experts) * per_expert;
  return e;
}

namespace {

// One GEMM of the layer as the model sees it.
struct GemmCost {
  double weight_bytes_per_expert;  // B of one expert (w13 for up, w2 for down)
  double flops_per_row;            // of one row of A (a block's padding rows count: they are computed)
  int64_t tiles;                   // column tiles a block has
  double in_bytes, out_bytes;      // A rows gathered and rows written, once each, through HBM
};

// `b` counts the config's blocks; `math_rows` the rows its tensor cores compute (the wgmma kernel
// skips a consumer warpgroup whose 64 rows are all padding, so it computes 64-row halves).
double gemm_us(const GemmCost& g, const GemmConfig& c, bool up, int splits, const BlockEstimate& b, double math_rows,
               const DeviceInfo& device, const MachineModel& m) {
  const bool fp8 = c.precision == Precision::fp8;
  const double weight_elem = fp8 ? 1.0 : 2.0;
  const double items = b.blocks * double(g.tiles) * splits;
  if (!(items > 0)) return m.launch_us;  // no rows (T = 0): the launch alone
  const double slots = double(std::max(1, device.sm_count)) * ctas_per_sm(c, up, device);
  const double waves = std::max(1.0, std::ceil(items / slots));
  // Bytes in flight: a CTA keeps its pipeline's B stages loading (the mma.sync loader one stage
  // short of the ring, the wgmma producer the whole ring), so it pulls at most that much per
  // latency; fewer CTAs than it takes to cover the HBM's latency leave bandwidth unused.
  const double stages_loading = c.kernel == GemmKernel::wgmma ? c.stages : c.stages - 1;
  const double cta_bytes = stages_loading * double(c.block_n) * double(c.block_k) * weight_elem;
  const double concurrent = std::min(items, slots);
  const double read_Bps = std::min(m.read_TBps * 1e12, concurrent * cta_bytes / (m.latency_us * 1e-6));
  const double hbm_bytes = b.touched * g.weight_bytes_per_expert + g.in_bytes + g.out_bytes;
  const double t_read = hbm_bytes / read_Bps * 1e6;
  // An expert's further blocks re-read its weights; their tiles run close together, from L2. And a
  // block's further column tiles re-read its A rows (split-K: each slice its share of them).
  const double t_l2 = (std::max(0.0, b.blocks - b.touched) * g.weight_bytes_per_expert +
                       double(g.tiles - 1) * g.in_bytes) /
                      (m.l2_TBps * 1e12) * 1e6;
  // The padded rows' FLOPs at the kernel's rate, on the SMs the items fill: a grid smaller than
  // the slots idles the rest for the whole kernel, and a grid of several waves its last wave's
  // idle SMs (the share items / (waves · slots)), since the next kernel waits at its PDL barrier
  // for this one's last tile. (With A's re-reads above, this took the wgmma down's two K-slices
  // at Mixtral T=512, where n256 tiles run 1.5 waves: docs/design.md.)
  const double rate = c.kernel == GemmKernel::wgmma ? (fp8 ? m.wgmma_fp8_TFLOPs : m.wgmma_TFLOPs) : m.mma_sync_TFLOPs;
  const double wave_fill = items / (waves * slots);
  const double t_math = math_rows * g.flops_per_row / (rate * 1e12 * wave_fill) * 1e6;
  const double t_mem = t_read + t_l2;  // both through the same L2 slices and load pipes
  const double t = std::pow(std::pow(t_mem, m.overlap_p) + std::pow(t_math, m.overlap_p), 1.0 / m.overlap_p);
  const double item_us = c.kernel == GemmKernel::wgmma ? m.wgmma_item_us : m.mma_sync_item_us;
  return t + waves * item_us + m.launch_us;
}

// The estimate with the routing's expected blocks given (cheapest_tiles computes them once a
// block_m): `b` for the choice's block_m, `math_rows` the rows its tensor cores compute.
double estimate_given(const MoeShape& s, const TileChoice& choice, const DeviceInfo& device, Precision precision,
                      const MachineModel& m, const BlockEstimate& b, double math_rows) {
  const double H = double(s.hidden), F = double(s.inter), A = double(s.tokens * s.topk);
  const double w = precision == Precision::fp8 ? 1.0 : 2.0;  // weight and activation element bytes
  const int64_t up_cols = std::max(1, choice.up.block_n / 2), down_cols = choice.down.block_n;
  const GemmCost up{2 * F * H * w, 2 * 2 * F * H, (s.inter + up_cols - 1) / up_cols, double(s.tokens) * H * w, A * F * w};
  const int splits = choice.down_splits;
  // Down writes bf16 rows, or with split-K FP32 partials that the combine reads back.
  const double down_out = splits > 1 ? 2 * splits * A * H * 4 : A * H * 2;
  const GemmCost down{H * F * w, 2 * H * F, (s.hidden + down_cols - 1) / down_cols, A * F * w, down_out};
  return gemm_us(up, choice.up, true, 1, b, math_rows, device, m) +
         gemm_us(down, choice.down, false, splits, b, math_rows, device, m);
}

// Whether choice's down split leaves each K-slice kMinSliceKTiles K-tiles (planner.hpp): split-K's
// fixed costs are not in the estimate, which would otherwise split short K (always true unsplit).
bool slices_keep_k_tiles(const MoeShape& s, const TileChoice& c) {
  const int64_t k_tiles = (s.inter + c.down.block_k - 1) / c.down.block_k;
  return c.down_splits <= 1 || k_tiles / c.down_splits >= kMinSliceKTiles;
}

// The rows a choice's tensor cores compute: whole blocks, but 64-row halves on the wgmma kernel,
// which skips a consumer warpgroup whose rows are all padding.
double math_rows_of(const MoeShape& s, const GemmConfig& c, const BlockEstimate& b) {
  if (c.kernel != GemmKernel::wgmma) return b.blocks * c.block_m;
  constexpr int kHalf = kernels::gemm::sm90::kWgmmaM;  // one consumer warpgroup's rows
  return kHalf * expected_blocks(s.tokens, s.experts, s.topk, kHalf).blocks;
}
}  // namespace

double estimate_experts_us(const MoeShape& s, const TileChoice& choice, const DeviceInfo& device, Precision precision,
                           const MachineModel& m) {
  const BlockEstimate b = expected_blocks(s.tokens, s.experts, s.topk, choice.up.block_m);
  return estimate_given(s, choice, device, precision, m, b, math_rows_of(s, choice.up, b));
}

// The public entry: its arguments checked as plan_forward_with checks a choice, and the device as
// plan_forward does; the estimate itself assumes them (cheapest_tiles' candidates are valid).
double model_estimate_us(const MoeShape& shape, const TileChoice& choice, const DeviceInfo& device, Precision precision) {
  constexpr const char* kEntry = "model_estimate_us";
  expect_tile_choice(shape, choice.up, choice.down, choice.down_splits, kEntry);
  detail::expect_hopper(device, kEntry);
  if (choice.up.precision != precision)
    detail::fail(kEntry, "precision", std::string("the choice's configs are ") + precision_name(choice.up.precision) +
                                          ", the argument says " + precision_name(precision));
  return estimate_experts_us(shape, choice, device, precision);
}

TileChoice cheapest_tiles(const MoeShape& shape, const DeviceInfo& device, Precision precision, const MachineModel& m) {
  const std::vector<TileChoice> candidates = tune_candidates(shape, device, precision);
  if (candidates.empty()) detail::fail("plan_forward", "device", "no compiled GEMM config fits its shared memory");
  // The routing's blocks once per (block_m, kernel family): a plan costs a few binomial sums.
  std::map<std::pair<int, GemmKernel>, std::pair<BlockEstimate, double>> routing;
  std::vector<double> us(candidates.size());
  double best_us = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!slices_keep_k_tiles(shape, candidates[i])) {
      us[i] = std::numeric_limits<double>::infinity();
      continue;
    }
    const GemmConfig& up = candidates[i].up;
    auto it = routing.find({up.block_m, up.kernel});
    if (it == routing.end()) {
      const BlockEstimate b = expected_blocks(shape.tokens, shape.experts, shape.topk, up.block_m);
      it = routing.emplace(std::pair{up.block_m, up.kernel}, std::pair{b, math_rows_of(shape, up, b)}).first;
    }
    us[i] = estimate_given(shape, candidates[i], device, precision, m, it->second.first, it->second.second);
    best_us = std::min(best_us, us[i]);
  }
  size_t i = 0;
  while (us[i] > m.tie_slack * best_us) ++i;
  return candidates[i];
}

}  // namespace moekit::tuning
