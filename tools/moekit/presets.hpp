// presets.hpp — the model layers `moekit bench` and `moekit check` know by name (docs/design.md
// "Presets"), and how command-line overrides turn a preset into the layer that is run.
#pragma once

#include <algorithm>
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

// Every layer `--preset` names, in one table. The first three are tuned: configs/<device>.json has
// their measured plans. The rest are public MoE layers beyond them, never tuned: the planner's
// heuristic plans them (no table entry), which is what they measure. Between them: E not a power of
// two (60, 40), H not a multiple of 128 (2880), F not a multiple of 256 (1408, 2880), k = 1, 2, 4,
// 6, 8. Shapes and routing from each model's config.json (docs/design.md, "Models beyond the
// presets").
struct KnownLayer {
  LayerSpec spec;
  bool tuned;
};
inline const std::vector<KnownLayer>& known_layers() {
  // name, H, F, E, k, renormalised; sigmoid scoring and DeepSeek-V3's grouping set below.
  auto layer = [](const char* name, int64_t H, int64_t F, int64_t E, int64_t k, bool renormalize, bool tuned) {
    KnownLayer l{LayerSpec{}, tuned};
    l.spec.name = name;
    l.spec.shape = MoeShape{0, H, F, E, k};
    l.spec.router.renormalize = renormalize;
    return l;
  };
  static const std::vector<KnownLayer> layers = [&] {
    std::vector<KnownLayer> v = {
        layer("mixtral-8x7b", 4096, 14336, 8, 2, true, true),
        layer("qwen3-30b-a3b", 2048, 768, 128, 8, true, true),
        layer("deepseek-v3", 7168, 2048, 256, 8, true, true),
        layer("olmoe-1b-7b", 2048, 1024, 64, 8, false, false),        // softmax, the top 8 as they are
        layer("qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, false, false),  // the routed experts (its shared
                                                                     // expert is a dense MLP)
        layer("deepseek-v2-lite", 2048, 1408, 64, 6, false, false),   // softmax, greedy top 6
        layer("granite-3.0-3b-a800m", 1536, 512, 40, 8, true, false), // softmax of the top 8 logits
        layer("llama4-scout", 5120, 8192, 16, 1, false, false),       // top 1, weight sigmoid(logit)
        layer("mixtral-8x22b", 6144, 16384, 8, 2, true, false),
        // its GEMM shapes and top-4 softmax; not its clamped SwiGLU, its expert biases or its
        // router's bias
        layer("gpt-oss-20b", 2880, 2880, 32, 4, true, false),
    };
    auto spec = [&](const std::string& name) -> LayerSpec& {
      return std::find_if(v.begin(), v.end(), [&](const KnownLayer& l) { return l.spec.name == name; })->spec;
    };
    LayerSpec& ds = spec("deepseek-v3");  // sigmoid + score bias, 8 groups keep 4, scaled
    ds.router.scoring = Scoring::sigmoid, ds.router.n_group = 8, ds.router.topk_group = 4;
    ds.router.routed_scaling_factor = 2.5f, ds.score_bias = true;
    spec("llama4-scout").router.scoring = Scoring::sigmoid;
    return v;
  }();
  return layers;
}

// The names of the tuned layers (tuned = true) or of the models beyond them (false), in order.
inline std::vector<std::string> layer_names(bool tuned) {
  std::vector<std::string> names;
  for (const KnownLayer& l : known_layers())
    if (l.tuned == tuned) names.push_back(l.spec.name);
  return names;
}

inline LayerSpec preset_spec(const std::string& name) {
  std::string known;
  for (const KnownLayer& l : known_layers()) {
    if (l.spec.name == name) return l.spec;
    known += (known.empty() ? "" : ", ") + l.spec.name;
  }
  throw UsageError("--preset: unknown preset '" + name + "'; expected one of " + known);
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
