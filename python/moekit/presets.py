"""moekit.presets — the model shapes of docs/design.md and their routing, shared by the benchmark and
the tests (plain data: no torch, no GPU)."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Preset", "PRESETS", "MODELS", "LAYERS"]


@dataclass(frozen=True)
class Preset:
    name: str
    hidden: int  # H
    inter: int  # F
    experts: int  # E
    top_k: int  # k
    routing: dict = field(default_factory=dict)  # fused_moe's routing keyword arguments
    score_bias: bool = False  # DeepSeek-V3's e_score_correction_bias

    def flops(self, tokens: int) -> int:
        """2·T·k·3·H·F: the two expert GEMMs (gate+up is 2·H·F per row, down H·F)."""
        return 2 * tokens * self.top_k * 3 * self.hidden * self.inter

    def expert_bytes(self) -> int:
        """bf16 weight bytes of one expert: w13 (2·F·H) and w2 (H·F)."""
        return 3 * self.hidden * self.inter * 2


PRESETS = {
    p.name: p
    for p in (
        Preset("mixtral-8x7b", 4096, 14336, 8, 2, dict(renormalize=True, scoring_func="softmax")),
        Preset("qwen3-30b-a3b", 2048, 768, 128, 8, dict(renormalize=True, scoring_func="softmax")),
        Preset("deepseek-v3", 7168, 2048, 256, 8,
               dict(renormalize=True, scoring_func="sigmoid", num_expert_group=8, topk_group=4,
                    routed_scaling_factor=2.5),
               score_bias=True),
    )
}

# Public MoE layers beyond the presets, never tuned (the planner's heuristic plans them): the same
# list as `moekit bench --preset` (tools/moekit/presets.hpp, known_layers), shapes and routing from
# each model's config.json. Between them E not a power of two, H not a multiple of 128, F not a
# multiple of 256, and k = 1, 2, 4, 6, 8 (docs/design.md, "Models beyond the presets").
MODELS = {
    p.name: p
    for p in (
        Preset("olmoe-1b-7b", 2048, 1024, 64, 8, dict(renormalize=False, scoring_func="softmax")),
        Preset("qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, dict(renormalize=False, scoring_func="softmax")),
        Preset("deepseek-v2-lite", 2048, 1408, 64, 6, dict(renormalize=False, scoring_func="softmax")),
        Preset("granite-3.0-3b-a800m", 1536, 512, 40, 8, dict(renormalize=True, scoring_func="softmax")),
        Preset("llama4-scout", 5120, 8192, 16, 1, dict(renormalize=False, scoring_func="sigmoid")),
        Preset("mixtral-8x22b", 6144, 16384, 8, 2, dict(renormalize=True, scoring_func="softmax")),
        # its GEMM shapes and top-4 softmax; not its clamped SwiGLU, its expert biases or router bias
        Preset("gpt-oss-20b", 2880, 2880, 32, 4, dict(renormalize=True, scoring_func="softmax")),
    )
}

LAYERS = {**PRESETS, **MODELS}
