// plan_cmd.cpp — `moekit plan`: what plan_forward chooses for a layer at each T, on the current GPU
// or on a described one (no GPU needed), and how the planner's cost model ranks the candidates
// `moekit tune` would time: why a shape gets its tiles. Plain C++: no kernel runs.
#include "plan_cmd.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "exit_codes.hpp"
#include "moekit/moe.hpp"
#include "moekit/tuning.hpp"
#include "presets.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

// What query_device() reads on the GPUs of the runs of record (capability 9.0, 132 SMs, 227 KiB of
// opt-in shared memory a block); the H200's name is its table's (configs/nvidia-h200.json).
DeviceInfo described_device(const std::string& name) {
  DeviceInfo d;
  d.sm_count = 132, d.cc_major = 9, d.cc_minor = 0, d.smem_per_block_optin = 232448;
  if (name == "h200") {
    d.name = "NVIDIA H200", d.l2_bytes = 60 << 20;
  } else if (name == "h100") {
    d.name = "NVIDIA H100 80GB HBM3", d.l2_bytes = 50 << 20;
  } else {
    throw UsageError("--device: expected current, h200 or h100, got '" + name + "'");
  }
  return d;
}

int run_plan(const PlanArgs& args) {
  const LayerSpec spec = resolve_layer(args.layer);
  const Precision precision = args.dtype == "fp8" ? Precision::fp8 : Precision::bf16;
  if (args.device == "current" &&
      !require_hopper("plan --device current", "", "`moekit plan --device h200` (or h100) plans for a described GPU."))
    return kExitNoGpu;
  const DeviceInfo device = args.device == "current" ? query_device() : described_device(args.device);
  std::printf("moekit plan: %s, H=%lld F=%lld E=%lld k=%lld, %s, on %s (%d SMs)\n", spec.name.c_str(),
              (long long)spec.shape.hidden, (long long)spec.shape.inter, (long long)spec.shape.experts,
              (long long)spec.shape.topk, precision_name(precision), device.name.c_str(), device.sm_count);
  for (const int64_t T : args.tokens) {
    MoeShape s = spec.shape;
    s.tokens = T;
    const ForwardPlan plan = plan_forward(s, device, precision);
    std::printf("\n%s\n  %.4g rows per expert; the cost model's ranking:\n", plan.str().c_str(), tuning::rows_per_expert(s));
    // The cost model's ranking, cheapest first; the plan's own choice is marked (a table's choice
    // may rank anywhere: it was measured, the model estimates).
    std::vector<std::pair<double, tuning::TileChoice>> ranked;
    for (const tuning::TileChoice& c : tuning::tune_candidates(s, device, precision))
      ranked.emplace_back(tuning::model_estimate_us(s, c, device, precision), c);
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const tuning::TileChoice planned{plan.up, plan.down, plan.down_splits};
    for (size_t i = 0; i < ranked.size(); ++i) {
      const bool mine = ranked[i].second == planned;
      if (int(i) >= args.top && !mine) continue;
      const tuning::TileChoice& c = ranked[i].second;
      std::printf("  %3zu. model %9.4f ms  up %-30s down %-30s splits %d%s\n", i + 1, ranked[i].first / 1000,
                  c.up.str().c_str(), c.down.str().c_str(), c.down_splits, mine ? "  <- planned" : "");
    }
  }
  return kExitOk;
}

}  // namespace moekit::cli
