// plan_cmd.hpp — `moekit plan` (plan_cmd.cpp): the plan of a layer at each T and the planner's cost
// model's ranking of the candidates, on the current GPU or a described one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/moe.hpp"
#include "presets.hpp"

namespace moekit::cli {

struct PlanArgs {
  LayerArgs layer;
  std::vector<int64_t> tokens{1, 16, 64, 256, 1024, 4096, 16384};
  std::string dtype = "bf16";
  std::string device = "h200";  // h200 | h100 (described: no GPU needed) | current
  int top = 3;                   // candidates listed per T, cheapest first (and the planned one)
};

// The description `moekit plan --device` names (h200, h100); UsageError naming --device otherwise.
DeviceInfo described_device(const std::string& name);

int run_plan(const PlanArgs& args);

}  // namespace moekit::cli
