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

// The three tuned layers: configs/<device>.json has their measured plans.
inline const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"};
  return names;
}

// Public MoE layers beyond the presets, never tuned: the planner's heuristic plans them (no table
// entry), which is what they measure. Between them: E not a power of two (60, 40), H not a
// multiple of 128 (2880), F not a multiple of 256 (1408, 2880), k = 1, 2, 4, 6, 8. Shapes and
// routing from each model's config.json (docs/design.md, "Models beyond the presets").
inline const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"olmoe-1b-7b",        "qwen1.5-moe-a2.7b", "deepseek-v2-lite",
                                                 "granite-3.0-3b-a800m", "llama4-scout",      "mixtral-8x22b",
                                                 "gpt-oss-20b"};
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
  } else if (name == "olmoe-1b-7b") {  // softmax over 64, the top 8 not renormalised
    s.shape = MoeShape{0, 2048, 1024, 64, 8};
    s.router.renormalize = false;
  } else if (name == "qwen1.5-moe-a2.7b") {  // the routed experts (its shared expert is a dense MLP)
    s.shape = MoeShape{0, 2048, 1408, 60, 4};
    s.router.renormalize = false;
  } else if (name == "deepseek-v2-lite") {  // softmax, greedy top 6, not renormalised
    s.shape = MoeShape{0, 2048, 1408, 64, 6};
    s.router.renormalize = false;
  } else if (name == "granite-3.0-3b-a800m") {  // softmax of the top 8 logits = softmax, renormalised
    s.shape = MoeShape{0, 1536, 512, 40, 8};
  } else if (name == "llama4-scout") {  // top 1 by logit, weight sigmoid(logit)
    s.shape = MoeShape{0, 5120, 8192, 16, 1};
    s.router.scoring = Scoring::sigmoid;
    s.router.renormalize = false;
  } else if (name == "mixtral-8x22b") {
    s.shape = MoeShape{0, 6144, 16384, 8, 2};
  } else if (name == "gpt-oss-20b") {  // its GEMM shapes and top-4 softmax; not its clamped SwiGLU,
    s.shape = MoeShape{0, 2880, 2880, 32, 4};  // its expert biases or its router's bias
  } else {
    std::string known;
    for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    for (const std::string& n : model_names()) known += ", " + n;
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
