// presets.hpp — the model layers `moekit bench` and `moekit check` know by name (docs/design.md
// "Presets"), and how command-line overrides turn a preset into the layer that is run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "exit_codes.hpp"
#include "moekit/moe.hpp"

namespace moekit::cli {

// One MoE layer without its token count: shape (tokens = 0) and router options.
struct LayerSpec {
  std::string name;  // preset name, or "custom" when a flag changed the preset
  MoeShape shape;
  RouterOptions router;
  bool score_bias = false;  // DeepSeek-V3's score-correction bias (picks experts, not weights)

  std::string str() const {
    std::string s = name + ": H=" + std::to_string(shape.hidden) + " F=" + std::to_string(shape.inter) +
                    " E=" + std::to_string(shape.experts) + " k=" + std::to_string(shape.topk) +
                    (router.scoring == Scoring::sigmoid ? " sigmoid" : " softmax");
    if (router.n_group > 0)
      s += " n_group=" + std::to_string(router.n_group) + " topk_group=" + std::to_string(router.topk_group);
    if (score_bias) s += " +score_bias";
    if (router.renormalize) s += " renormalize";
    if (router.routed_scaling_factor != 1.0f) {
      char b[32];
      std::snprintf(b, sizeof b, " scale=%g", double(router.routed_scaling_factor));
      s += b;
    }
    return s;
  }
};

inline const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"};
  return names;
}

inline LayerSpec preset_spec(const std::string& name) {
  LayerSpec s;
  s.name = name;
  s.router.renormalize = true;
  if (name == "mixtral-8x7b") {
    s.shape = MoeShape{0, 4096, 14336, 8, 2};
  } else if (name == "qwen3-30b-a3b") {
    s.shape = MoeShape{0, 2048, 768, 128, 8};
  } else if (name == "deepseek-v3") {
    s.shape = MoeShape{0, 7168, 2048, 256, 8};
    s.router.scoring = Scoring::sigmoid;
    s.router.n_group = 8;
    s.router.topk_group = 4;
    s.router.routed_scaling_factor = 2.5f;
    s.score_bias = true;
  } else {
    std::string known;
    for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw UsageError("--preset: unknown preset '" + name + "'; expected one of " + known);
  }
  return s;
}

// Command-line description of a layer: a preset, and any field the user set explicitly.
// A value of -1 (or an empty string) means "keep the preset's".
struct LayerArgs {
  std::string preset = "mixtral-8x7b";
  int64_t hidden = -1, inter = -1, experts = -1, topk = -1;
  int64_t n_group = -1, topk_group = -1;
  std::string scoring;  // "softmax" | "sigmoid" | ""
  bool renormalize = false, no_renormalize = false;
  float routed_scaling_factor = -1.0f;
  bool score_bias = false, no_score_bias = false;
};

inline LayerSpec resolve_layer(const LayerArgs& a) {
  LayerSpec s = preset_spec(a.preset);
  bool changed = false;
  auto set = [&](int64_t& field, int64_t v) {
    if (v >= 0 && v != field) field = v, changed = true;
  };
  set(s.shape.hidden, a.hidden);
  set(s.shape.inter, a.inter);
  set(s.shape.experts, a.experts);
  set(s.shape.topk, a.topk);
  set(s.router.n_group, a.n_group);
  set(s.router.topk_group, a.topk_group);
  if (!a.scoring.empty()) {
    const Scoring sc = a.scoring == "sigmoid" ? Scoring::sigmoid : Scoring::softmax;
    if (a.scoring != "sigmoid" && a.scoring != "softmax")
      throw UsageError("--scoring: expected softmax or sigmoid, got '" + a.scoring + "'");
    changed |= sc != s.router.scoring;
    s.router.scoring = sc;
  }
  if (a.renormalize && !s.router.renormalize) s.router.renormalize = true, changed = true;
  if (a.no_renormalize && s.router.renormalize) s.router.renormalize = false, changed = true;
  if (a.routed_scaling_factor > 0 && a.routed_scaling_factor != s.router.routed_scaling_factor)
    s.router.routed_scaling_factor = a.routed_scaling_factor, changed = true;
  if (a.score_bias && !s.score_bias) s.score_bias = true, changed = true;
  if (a.no_score_bias && s.score_bias) s.score_bias = false, changed = true;
  if (s.router.n_group == 0) s.router.topk_group = 0;
  if (changed) s.name = "custom";
  return s;
}

}  // namespace moekit::cli
