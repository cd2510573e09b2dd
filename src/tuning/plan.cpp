// plan.cpp — the one planner's entries: plan_forward (a measured table's bucket for this device,
// shape and precision, else the heuristic), plan_forward_with (the GEMM configs given), and what a
// plan says of itself. Every kernel choice of the layer lands in the ForwardPlan it returns: the
// GEMM configs and split-K (table or heuristic.cpp), the router's and align's kernels
// (heuristic.cpp). Pure host code, unit-tested on the CPU.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "common/validate.hpp"
#include "moekit/moe.hpp"
#include "tuning/planner.hpp"
#include "tuning/table.hpp"

namespace moekit {

int64_t worst_case_rows(const MoeShape& s, int block_m) {
  // Checked: it is public, and plans edited after plan_forward reach it (workspace sizing).
  int64_t tk = 0, pad = 0, rows = 0, up = 0;
  if (block_m < 1 || __builtin_mul_overflow(s.tokens, s.topk, &tk) ||
      __builtin_mul_overflow(s.experts, int64_t(block_m) - 1, &pad) || __builtin_add_overflow(tk, pad, &rows) ||
      __builtin_add_overflow(rows, int64_t(block_m) - 1, &up))
    return std::numeric_limits<int64_t>::max();
  return up / block_m * block_m;
}

std::string RouterPlan::str() const {
  return "gate=" + tuning::to_string(gate) + (quantize_x ? "+x_q" : "") + " select=" + tuning::to_string(select);
}

std::string ForwardPlan::str() const {
  return "T=" + std::to_string(shape.tokens) + " H=" + std::to_string(shape.hidden) +
         " F=" + std::to_string(shape.inter) + " E=" + std::to_string(shape.experts) +
         " k=" + std::to_string(shape.topk) + " block_m=" + std::to_string(block_m()) +
         " up=" + up.str() + " down=" + down.str() +
         (down_splits > 1 ? " down_splits=" + std::to_string(down_splits) : "") + " router=" + router.str() +
         " align=" + tuning::to_string(align) + (save_h ? " save_h" : "") + " source=" + source;
}

void tuning::expect_tile_choice(const MoeShape& shape, const GemmConfig& up, const GemmConfig& down, int down_splits,
                                const char* entry) {
  detail::expect_shape(shape, entry);
  const auto& compiled = compiled_gemm_configs(up.precision);
  if (std::find(compiled.begin(), compiled.end(), up) == compiled.end())
    detail::fail(entry, "up", "config " + up.str() + " is not compiled (see src/gemm/configs.hpp)");
  if (std::find(compiled.begin(), compiled.end(), down) == compiled.end())
    detail::fail(entry, "down", "config " + down.str() + " is not compiled (see src/gemm/configs.hpp)");
  if (up.block_m != down.block_m)
    detail::fail(entry, "down", "block_m must equal the up config's: both GEMMs read one aligned layout");
  if (up.precision != down.precision)
    detail::fail(entry, "down", "precision must equal the up config's (" + std::string(precision_name(up.precision)) + ")");
  if (!tuning::up_config_ok(up))
    detail::fail(entry, "up",
                 "an fp8 up config needs block_n " + std::to_string(2 * kFp8Block) +
                     ", or for mma.sync 128, 64 or 32 (its epilogue quantizes whole 128-column groups of act, "
                     "alone or as a cluster), got " + up.str());
  detail::expect_shape_precision(shape, up.precision, entry);
  if (down_splits < 1 || down_splits > kMaxDownSplits)
    detail::fail(entry, "down_splits",
                 "must be in [1, " + std::to_string(kMaxDownSplits) + "], got " + std::to_string(down_splits));
  if (!tuning::down_splits_ok(down, down_splits))
    detail::fail(entry, "down_splits",
                 "the wgmma down GEMM splits K in bf16 only, into at most " + std::to_string(kMaxWgmmaDownSplits) +
                     " slices; " + down.str() + " got " + std::to_string(down_splits));
}

ForwardPlan tuning::plan_with(const MoeShape& shape, const GemmConfig& up, const GemmConfig& down, int down_splits,
                              int64_t smem_per_block_optin, int sm_count) {
  expect_tile_choice(shape, up, down, down_splits, "plan_forward");
  ForwardPlan plan;
  plan.shape = shape;
  plan.up = up;
  plan.down = down;
  plan.down_splits = down_splits;
  plan.router = plan_router(shape.tokens, shape.experts, shape.hidden, /*logits_in_memory=*/true, smem_per_block_optin,
                            sm_count, up.precision);
  plan.align = plan_align(shape.tokens * shape.topk);
  return plan;
}

ForwardPlan plan_forward_with(const MoeShape& shape, const GemmConfig& up, const GemmConfig& down, int down_splits) {
  return tuning::plan_with(shape, up, down, down_splits, kSm90SmemPerBlockOptin, tuning::kSm90SmCount);
}

ForwardPlan plan_forward(const MoeShape& shape, const DeviceInfo& device, Precision precision) {
  detail::expect_shape(shape, "plan_forward");
  detail::expect_shape_precision(shape, precision, "plan_forward");
  detail::expect_hopper(device, "plan_forward");
  // A measured bucket of this precision for this device and shape first. Table entries that name
  // configs no longer compiled (or invalid here) are skipped, so a stale table falls back instead
  // of failing.
  if (std::optional<ForwardPlan> plan =
          tuning::plan_from_table(tuning::compiled_tuning_table(), shape, device, precision))
    return *plan;
  return plan_forward_heuristic(shape, device, precision);
}

}  // namespace moekit
