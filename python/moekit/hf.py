"""moekit.hf — Hugging Face MoE weights in moekit's layout (needs PyTorch, not transformers).

moekit's layout (docs/design.md): w13 [E, 2F, H] — per expert the gate rows, then the up rows, K = H
contiguous; w2 [E, H, F]; the router w_gate [E, H]. A Hugging Face expert is a SwiGLU MLP
down(silu(gate(x)) * up(x)) of nn.Linear weights [out, in], so gate/up are [F, H] and down is
[H, F]: packing stacks them, with no transpose.

| model | MoE block | expert i: gate, up, down | router |
| --- | --- | --- | --- |
| Mixtral | block_sparse_moe | experts[i].w1, .w3, .w2 | gate.weight |
| Qwen3-MoE | mlp | experts[i].gate_proj, .up_proj, .down_proj | gate.weight |
| DeepSeek-V3 | mlp | experts[i].gate_proj, .up_proj, .down_proj | gate.weight, gate.e_score_correction_bias |

FP8 checkpoints in DeepSeek-V3's format (its released weights, and transformers' FP8Linear) store
each projection as `weight` float8_e4m3fn with `weight_scale_inv` float32 [ceil(out/128),
ceil(in/128)], the dequantizing multiplier of each 128 x 128 block. They pack as they are stored:
w13 and w2 e4m3, w13_scale [E, 2·ceil(F/128), ceil(H/128)] (per expert gate's blocks, then up's)
and w2_scale [E, ceil(H/128), ceil(F/128)], moekit's FP8 layout (moekit.fp8); dtype=torch.bfloat16
dequantizes them instead.

Newer transformers keep the experts fused (experts.gate_up_proj [E, 2F, H], experts.down_proj
[E, H, F]): already moekit's layout, taken as they are. DeepSeek-V3's shared experts are a dense
MLP outside the routed experts: run them beside the MoE.

Packing only: the layer built from these weights is moekit.torch's (MoE.from_hf, moe_from_hf),
which imports this module, never the other way round.
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Sequence, Union

from ._requires import require

require("moekit.hf")

import torch
from torch import Tensor

from . import _moekit as _C
from .fp8 import blocks, dequantize_weight_blocks

__all__ = ["pack_experts", "pack_experts_fp8", "pack_hf_moe", "pack_hf_state_dict", "pack_hf_safetensors",
           "routing_from_hf_config", "ARCH_DEFAULTS"]

# Per-expert projection names: (gate, up, down).
_EXPERT_NAMES = (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj"))
_BLOCK_NAMES = ("block_sparse_moe", "mlp")

# Routing of each architecture's released models (docs/design.md presets), used when no config is given.
ARCH_DEFAULTS = {
    "mixtral": dict(top_k=2, renormalize=True, scoring_func="softmax"),
    "qwen3_moe": dict(top_k=8, renormalize=True, scoring_func="softmax"),
    "deepseek_v3": dict(top_k=8, renormalize=True, scoring_func="sigmoid", num_expert_group=8, topk_group=4,
                        routed_scaling_factor=2.5),
}


def _fail(fn: str, arg: str, what: str):
    raise _C.Error(f"moekit.{fn}: argument '{arg}': {what}")


def pack_experts(gate: Sequence[Tensor], up: Sequence[Tensor], down: Sequence[Tensor], *,
                 dtype: torch.dtype = torch.bfloat16, device: Union[torch.device, str, int, None] = None) -> tuple[Tensor, Tensor]:
    """Stacks per-expert weights into (w13 [E, 2F, H], w2 [E, H, F]).

    gate[e], up[e]: [F, H] (nn.Linear(H, F).weight); down[e]: [H, F] (nn.Linear(F, H).weight).
    One copy per weight into preallocated outputs (no intermediate concatenation).
    """
    fn = "pack_experts"
    E = len(gate)
    if E == 0:
        _fail(fn, "gate", "no experts given")
    if len(up) != E:
        _fail(fn, "up", f"expected {E} weights (one per expert, as 'gate'), got {len(up)}")
    if len(down) != E:
        _fail(fn, "down", f"expected {E} weights (one per expert, as 'gate'), got {len(down)}")
    if gate[0].dim() != 2:
        _fail(fn, "gate[0]", f"expected shape [F, H], got {list(gate[0].shape)}")
    F, H = gate[0].shape
    device = gate[0].device if device is None else torch.device(device)
    w13 = torch.empty((E, 2 * F, H), dtype=dtype, device=device)
    w2 = torch.empty((E, H, F), dtype=dtype, device=device)
    with torch.no_grad():
        for e in range(E):
            for name, t, want in (("gate", gate[e], (F, H)), ("up", up[e], (F, H)), ("down", down[e], (H, F))):
                if tuple(t.shape) != want:
                    _fail(fn, f"{name}[{e}]", f"expected shape {list(want)}, got {list(t.shape)}")
            w13[e, :F].copy_(gate[e])
            w13[e, F:].copy_(up[e])
            w2[e].copy_(down[e])
    return w13, w2


def pack_experts_fp8(gate: Sequence[Tensor], up: Sequence[Tensor], down: Sequence[Tensor],
                     gate_scale: Sequence[Tensor], up_scale: Sequence[Tensor], down_scale: Sequence[Tensor], *,
                     device: Union[torch.device, str, int, None] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stacks per-expert FP8 weights as stored (DeepSeek-V3's format) into (w13 [E, 2F, H],
    w13_scale [E, 2·ceil(F/128), ceil(H/128)], w2 [E, H, F], w2_scale [E, ceil(H/128), ceil(F/128)]).

    gate[e], up[e]: [F, H] float8_e4m3fn, down[e]: [H, F]; their weight_scale_inv float32
    [ceil(F/128), ceil(H/128)] (gate, up) and [ceil(H/128), ceil(F/128)] (down). The bytes are
    copied unchanged; each projection keeps its own blocks (also when F is not a multiple of 128).
    """
    fn = "pack_experts_fp8"
    E = len(gate)
    if E == 0:
        _fail(fn, "gate", "no experts given")
    for name, ts in (("up", up), ("down", down), ("gate_scale", gate_scale), ("up_scale", up_scale),
                     ("down_scale", down_scale)):
        if len(ts) != E:
            _fail(fn, name, f"expected {E} tensors (one per expert, as 'gate'), got {len(ts)}")
    if gate[0].dim() != 2:
        _fail(fn, "gate[0]", f"expected shape [F, H], got {list(gate[0].shape)}")
    F, H = gate[0].shape
    fb, hb = blocks(F), blocks(H)
    device = gate[0].device if device is None else torch.device(device)
    w13 = torch.empty((E, 2 * F, H), dtype=torch.float8_e4m3fn, device=device)
    w2 = torch.empty((E, H, F), dtype=torch.float8_e4m3fn, device=device)
    s13 = torch.empty((E, 2 * fb, hb), dtype=torch.float32, device=device)
    s2 = torch.empty((E, hb, fb), dtype=torch.float32, device=device)
    with torch.no_grad():
        for e in range(E):
            for name, t, want in (("gate", gate[e], (F, H)), ("up", up[e], (F, H)), ("down", down[e], (H, F))):
                if t.dtype != torch.float8_e4m3fn:
                    _fail(fn, f"{name}[{e}]", f"expected dtype float8_e4m3fn, got {str(t.dtype).replace('torch.', '')}")
                if tuple(t.shape) != want:
                    _fail(fn, f"{name}[{e}]", f"expected shape {list(want)}, got {list(t.shape)}")
            for name, t, want in (("gate_scale", gate_scale[e], (fb, hb)), ("up_scale", up_scale[e], (fb, hb)),
                                  ("down_scale", down_scale[e], (hb, fb))):
                if not t.dtype.is_floating_point or t.dtype.itemsize < 2:
                    _fail(fn, f"{name}[{e}]", "expected float32 block scales, got "
                                              f"{str(t.dtype).replace('torch.', '')}")
                if tuple(t.shape) != want:
                    _fail(fn, f"{name}[{e}]", f"expected shape {list(want)} (one scale per 128 x 128 block), "
                                              f"got {list(t.shape)}")
            w13[e, :F].copy_(gate[e])
            w13[e, F:].copy_(up[e])
            w2[e].copy_(down[e])
            s13[e, :fb].copy_(gate_scale[e])
            s13[e, fb:].copy_(up_scale[e])
            s2[e].copy_(down_scale[e])
    return w13, s13, w2, s2


def _dequantized(ws: Sequence[Tensor], scales: Sequence[Tensor], dtype: torch.dtype) -> list:
    return [dequantize_weight_blocks(w[None], s[None])[0].to(dtype) for w, s in zip(ws, scales)]


def _pack_any(fn: str, arg: str, weights: Sequence[Sequence[Tensor]], scales: Sequence[Sequence[Optional[Tensor]]],
              scale_name, dtype: Optional[torch.dtype], device) -> tuple:
    """(w13, w2, w13_scale, w2_scale) of per-expert (gate, up, down) weights: FP8 ones (e4m3 with
    their weight_scale_inv) as stored when dtype is None, else everything in dtype (bf16 by
    default), FP8 dequantized. scale_name(i, e): how the caller names projection i's scale of expert e."""
    if weights[0][0].dtype != torch.float8_e4m3fn:
        w13, w2 = pack_experts(*weights, dtype=dtype or torch.bfloat16, device=device)
        return w13, w2, None, None
    missing = next(((i, e) for i, ss in enumerate(scales) for e, sc in enumerate(ss) if sc is None), None)
    if missing is not None:
        _fail(fn, arg, f"holds float8_e4m3fn expert weights but no {scale_name(*missing)} (the block scales of "
                       "DeepSeek-V3's FP8 format)")
    if dtype is None:
        w13, s13, w2, s2 = pack_experts_fp8(*weights, *scales, device=device)
        return w13, w2, s13, s2
    w13, w2 = pack_experts(*(_dequantized(w, s, dtype) for w, s in zip(weights, scales)), dtype=dtype, device=device)
    return w13, w2, None, None


def _moe_block(layer: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    if hasattr(layer, "experts") and hasattr(layer, "gate"):
        return layer, ""
    for name in _BLOCK_NAMES:
        block = getattr(layer, name, None)
        if block is not None and hasattr(block, "experts") and hasattr(block, "gate"):
            return block, name
    _fail("pack_hf_moe", "layer", f"{type(layer).__name__} has no MoE block (.block_sparse_moe or .mlp with "
                                  ".experts and .gate); a dense layer (DeepSeek-V3's first layers) has none")


def _detect_arch(block: torch.nn.Module, block_name: str) -> str:
    if getattr(block.gate, "e_score_correction_bias", None) is not None:
        return "deepseek_v3"
    cls = type(block).__name__.lower()
    for arch, key in (("mixtral", "mixtral"), ("qwen3_moe", "qwen"), ("deepseek_v3", "deepseek")):
        if key in cls:
            return arch
    experts = block.experts
    first = experts[0] if isinstance(experts, torch.nn.ModuleList) and len(experts) > 0 else None
    if block_name == "block_sparse_moe" or hasattr(first, "w1"):
        return "mixtral"
    return "qwen3_moe"


def _packed(w_gate: Tensor, w13: Tensor, w2: Tensor, bias: Optional[Tensor], arch: str,
            w13_scale: Optional[Tensor] = None, w2_scale: Optional[Tensor] = None) -> dict:
    return dict(w_gate=w_gate, w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale,
                e_score_correction_bias=None if bias is None else bias.detach().to(torch.float32).contiguous(),
                arch=arch)


def _fused(fn: str, gate_up: Tensor, down: Tensor, H: int, dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor]:
    # Non-transposed (HF's default for these models): gate_up [E, 2F, H], down [E, H, F].
    dtype = dtype or torch.bfloat16
    if gate_up.dtype == torch.float8_e4m3fn:
        _fail(fn, "experts.gate_up_proj", "fused float8_e4m3fn experts are not supported (DeepSeek-V3's FP8 "
                                          "format is per expert: experts.<i>.gate_proj.weight + weight_scale_inv)")
    if gate_up.dim() != 3 or down.dim() != 3:
        _fail(fn, "experts.gate_up_proj", f"expected 3-D fused expert weights, got {list(gate_up.shape)} and "
                                          f"{list(down.shape)}")
    if gate_up.shape[2] != H:  # transposed storage: [E, H, 2F] and [E, F, H]
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    if gate_up.shape[2] != H or down.shape[1] != H or down.shape[2] * 2 != gate_up.shape[1]:
        _fail(fn, "experts.gate_up_proj", f"shapes {list(gate_up.shape)} / {list(down.shape)} do not match "
                                          f"hidden size {H}")
    with torch.no_grad():
        return (gate_up.detach().to(dtype).contiguous(), down.detach().to(dtype).contiguous())


def pack_hf_moe(layer: torch.nn.Module, *, dtype: Optional[torch.dtype] = None, device: Union[torch.device, str, int, None] = None) -> dict:
    """Packs the MoE of a Hugging Face decoder layer (or the MoE block itself).

    Returns dict(w_gate [E, H], w13 [E, 2F, H], w2 [E, H, F], w13_scale, w2_scale,
    e_score_correction_bias [E] float32 or None, arch "mixtral" | "qwen3_moe" | "deepseek_v3").
    dtype None: bf16 experts, or FP8 ones (float8_e4m3fn weights with weight_scale_inv, as
    transformers' FP8Linear holds them) as stored with their block scales; otherwise every expert
    weight in dtype (FP8 ones dequantized) and the scales None.
    """
    fn = "pack_hf_moe"
    block, block_name = _moe_block(layer)
    arch = _detect_arch(block, block_name)
    w_gate = block.gate.weight.detach()
    H = w_gate.shape[1]
    bias = getattr(block.gate, "e_score_correction_bias", None)
    experts = block.experts
    s13 = s2 = None
    if hasattr(experts, "gate_up_proj"):
        w13, w2 = _fused(fn, experts.gate_up_proj, experts.down_proj, H, dtype)
        if device is not None:
            w13, w2 = w13.to(device), w2.to(device)
    else:
        names = next((n for n in _EXPERT_NAMES if hasattr(experts[0], n[0])), None)
        if names is None:
            _fail(fn, "layer", f"expert {type(experts[0]).__name__} has neither w1/w3/w2 nor "
                               "gate_proj/up_proj/down_proj")
        linears = [[getattr(m, n) for m in experts] for n in names]
        weights = [[lin.weight for lin in ls] for ls in linears]
        scales = [[getattr(lin, "weight_scale_inv", None) for lin in ls] for ls in linears]
        w13, w2, s13, s2 = _pack_any(fn, "layer", weights, scales,
                                     lambda i, e: f"experts[{e}].{names[i]}.weight_scale_inv", dtype, device)
    if device is not None:
        w_gate = w_gate.to(device)
        bias = None if bias is None else bias.to(device)
    return _packed(w_gate.contiguous(), w13, w2, bias, arch, s13, s2)


def pack_hf_state_dict(state_dict: Mapping[str, Tensor], prefix: str, *, dtype: Optional[torch.dtype] = None,
                       device: Union[torch.device, str, int, None] = None) -> dict:
    """Packs one MoE block from a checkpoint's state dict, without building the HF model.

    prefix: the block's key prefix, e.g. "model.layers.3.block_sparse_moe" (Mixtral) or
    "model.layers.3.mlp" (Qwen3-MoE, DeepSeek-V3). Returns what pack_hf_moe returns; DeepSeek-V3's
    FP8 checkpoints (experts.<i>.gate_proj.weight float8_e4m3fn + .weight_scale_inv) as stored when
    dtype is None. A safetensors file's tensors are such a mapping (safetensors.torch.load_file).
    """
    fn = "pack_hf_state_dict"
    p = prefix.rstrip(".") + "."
    if p + "gate.weight" not in state_dict:
        _fail(fn, "prefix", f"no key {p}gate.weight: not an MoE block")
    w_gate = state_dict[p + "gate.weight"]
    bias = state_dict.get(p + "gate.e_score_correction_bias")
    H = w_gate.shape[1]
    s13 = s2 = None
    if p + "experts.gate_up_proj" in state_dict:
        w13, w2 = _fused(fn, state_dict[p + "experts.gate_up_proj"], state_dict[p + "experts.down_proj"], H, dtype)
        names = None
    else:
        pat = re.compile(re.escape(p) + r"experts\.(\d+)\.(\w+)\.(weight|weight_scale_inv)$")
        found: dict = {}
        scales: dict = {}
        for key in state_dict:
            m = pat.match(key)
            if m:
                into = found if m.group(3) == "weight" else scales
                into.setdefault(m.group(2), {})[int(m.group(1))] = state_dict[key]
        names = next((n for n in _EXPERT_NAMES if all(k in found for k in n)), None)
        if names is None:
            _fail(fn, "prefix", f"no expert weights under {p}experts.<i>.(w1|gate_proj).weight")
        E = len(found[names[0]])
        if sorted(found[names[0]]) != list(range(E)):
            _fail(fn, "state_dict", f"expert indices under {p}experts are not 0..{E - 1}")
        weights = [[found[n][e] for e in range(E)] for n in names]
        fp8_scales = [[scales.get(n, {}).get(e) for e in range(E)] for n in names]
        w13, w2, s13, s2 = _pack_any(fn, "state_dict", weights, fp8_scales,
                                     lambda i, e: f"key {p}experts.{e}.{names[i]}.weight_scale_inv", dtype, device)
    if device is not None:
        w_gate, w13, w2 = w_gate.to(device), w13.to(device), w2.to(device)
        bias = None if bias is None else bias.to(device)
        s13, s2 = (None, None) if s13 is None else (s13.to(device), s2.to(device))
    if bias is not None:
        arch = "deepseek_v3"
    elif names == _EXPERT_NAMES[0] or "block_sparse_moe" in prefix:
        arch = "mixtral"
    else:
        arch = "qwen3_moe"
    return _packed(w_gate.detach().contiguous(), w13, w2, bias, arch, s13, s2)


def pack_hf_safetensors(files: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], prefix: str, *,
                        dtype: Optional[torch.dtype] = None, device: Union[torch.device, str, int, None] = None) -> dict:
    """pack_hf_state_dict of one MoE block read straight from a checkpoint's safetensors files (a
    path, or the shards' paths), loading only the tensors under `prefix` (needs safetensors)."""
    from safetensors import safe_open

    p = prefix.rstrip(".") + "."
    state_dict = {}
    for path in [files] if isinstance(files, (str, os.PathLike)) else files:
        with safe_open(os.fspath(path), framework="pt") as f:
            for key in f.keys():
                if key.startswith(p):
                    state_dict[key] = f.get_tensor(key)
    return pack_hf_state_dict(state_dict, prefix, dtype=dtype, device=device)


def routing_from_hf_config(config: object, arch: Optional[str] = None) -> dict:
    """fused_moe's routing arguments from a Hugging Face config (MixtralConfig,
    Qwen3MoeConfig, DeepseekV3Config, or any object with the same attributes)."""
    arch = arch or getattr(config, "model_type", None)
    if arch not in ARCH_DEFAULTS:
        _fail("routing_from_hf_config", "arch", f"expected one of {sorted(ARCH_DEFAULTS)}, got {arch!r}")
    k = int(config.num_experts_per_tok)
    if arch == "mixtral":
        return dict(top_k=k, renormalize=True, scoring_func="softmax")
    if arch == "qwen3_moe":
        return dict(top_k=k, renormalize=bool(getattr(config, "norm_topk_prob", False)), scoring_func="softmax")
    n_group = getattr(config, "n_group", None)
    topk_group = getattr(config, "topk_group", None)
    return dict(top_k=k, renormalize=bool(getattr(config, "norm_topk_prob", True)),
                scoring_func=getattr(config, "scoring_func", "sigmoid"),
                num_expert_group=None if not n_group else int(n_group),
                topk_group=None if not n_group else int(topk_group),
                routed_scaling_factor=float(getattr(config, "routed_scaling_factor", 1.0)))
