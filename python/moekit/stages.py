"""moekit.stages — the forward pass one stage at a time on torch tensors, in a caller-held
workspace: route (moekit.torch.route) -> align -> expert_up -> expert_down -> combine(ws), and for
FP8 plans quantize_tokens(ws, x) before expert_up.
Eager calls into the binding on the current stream; no host sync, and no allocation but
combine's output (from torch's allocator), so a sequence of them captures in a CUDA graph.
"""
from __future__ import annotations

from typing import Optional, Union

from ._requires import require

require("moekit.stages")

import torch
from torch import Tensor

from . import _moekit as _C
from ._torch_util import (_check, _check_expert_load, _cuda_index, _dl, _fail, _plan, _stream, _workspace,
                          _workspace_view)
from .fp8 import blocks

__all__ = ["Workspace", "align", "quantize_tokens", "expert_up", "expert_down", "combine"]


class Workspace:
    """A plan and its workspace buffer, for running the stages one by one (align, expert_up,
    expert_down, combine). view(name) gives the intermediate tensors: router_logits, topk_ids,
    topk_weights, sorted_ids, block_expert, num_rows_padded, expert_counts, act, y_rows, status,
    gemm_counter (the prefill GEMM's work counter), y_partials when the plan splits the down GEMM
    (plan.down_splits > 1) and align_scratch past 4096 assignments. precision="fp8" plans the
    FP8 GEMMs (e4m3 weights with block scales): act is then e4m3, with act_scale, and x_q / x_scale
    hold the quantized tokens."""

    def __init__(self, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
                 device: Union[torch.device, str, int, None] = None, precision: str = "bf16") -> None:
        self.device = torch.device("cuda", _cuda_index("Workspace", device))
        self.plan = _plan(tokens, hidden, inter, experts, top_k, self.device.index, precision)
        self.buffer = _workspace(self.plan, self.device)
        self._layout = self.plan.workspace_layout()

    def view(self, name: str) -> Tensor:
        if name not in self._layout:
            _fail("Workspace.view", "name", f"expected one of {sorted(self._layout)}, got {name!r}")
        return _workspace_view(self.buffer, self._layout[name])

    def check_status(self) -> None:
        """Synchronises the stream; raises moekit.Error if a kernel flagged an expert id outside [0, E)."""
        _C.check_status(self.plan, _dl(self.buffer), stream=_stream(self.device))


def align(ws: Workspace, topk_ids: Tensor, expert_load: Optional[Tensor] = None) -> None:
    """Stage 2: the expert-sorted, block_m-padded order of topk_ids [T, k] int32, into ws.
    expert_load (int64 [E], optional) gains the call's assignments per expert, as in fused_moe."""
    _check("align", "topk_ids", topk_ids, (torch.int32,), (("T", ws.plan.tokens), ("k", ws.plan.topk)), ws.device,
           "ws")
    _check_expert_load("align", expert_load, ws.plan.experts, ws.device, "ws")
    _C.align(ws.plan, _dl(topk_ids), _dl(ws.buffer), expert_load=_dl(expert_load), stream=_stream(ws.device))


def quantize_tokens(ws: Workspace, x: Tensor) -> None:
    """Stage 1b of FP8 plans: x [T, H] bf16 -> ws.view("x_q") (e4m3) and ws.view("x_scale"), per
    token and 128 columns."""
    p = ws.plan
    _check("quantize_tokens", "x", x, (torch.bfloat16,), (("T", p.tokens), ("H", p.hidden)), ws.device, "ws")
    _C.quantize_tokens(p, _dl(x), _dl(ws.buffer), stream=_stream(ws.device))


def _weights(fn: str, ws: Workspace, arg: str, w: Tensor, dims: tuple, scale: Optional[Tensor], scale_dims: tuple):
    """The weight of a stage in the plan's precision: bf16, or e4m3 with its float32 block scales."""
    fp8 = ws.plan.precision == "fp8"
    _check(fn, arg, w, (torch.float8_e4m3fn if fp8 else torch.bfloat16,), dims, ws.device, "ws")
    if fp8:
        if scale is None:
            _fail(fn, f"{arg}_scale", "is required for an fp8 plan: the float32 block scales of the weight")
        _check(fn, f"{arg}_scale", scale, (torch.float32,), scale_dims, ws.device, "ws")
    elif scale is not None:
        _fail(fn, f"{arg}_scale", "is for fp8 plans (Workspace(..., precision='fp8')); this one is bf16")


def expert_up(ws: Workspace, x: Tensor, w13: Tensor, w13_scale: Optional[Tensor] = None) -> None:
    """Stage 3: ws.view("act") = silu(x·W_gateᵀ) ⊙ (x·W_upᵀ) per sorted row. FP8 plans: x is
    ws.view("x_q") (after quantize_tokens), w13 e4m3 with w13_scale [E, 2·ceil(F/128), ceil(H/128)]."""
    p = ws.plan
    x_dtype = torch.float8_e4m3fn if p.precision == "fp8" else torch.bfloat16
    _check("expert_up", "x", x, (x_dtype,), (("T", p.tokens), ("H", p.hidden)), ws.device, "ws")
    _weights("expert_up", ws, "w13", w13, (("E", p.experts), ("2F", 2 * p.inter), ("H", p.hidden)), w13_scale,
             (("E", p.experts), ("2*ceil(F/128)", 2 * blocks(p.inter)), ("ceil(H/128)", blocks(p.hidden))))
    _C.expert_up(p, _dl(x), _dl(w13), _dl(ws.buffer), w13_scale=_dl(w13_scale), stream=_stream(ws.device))


def expert_down(ws: Workspace, w2: Tensor, topk_weights: Tensor, w2_scale: Optional[Tensor] = None) -> None:
    """Stage 4: ws.view("y_rows")[a] = topk_weights[a] · act·W2ᵀ. FP8 plans: w2 e4m3 with w2_scale
    [E, ceil(H/128), ceil(F/128)]."""
    p = ws.plan
    _weights("expert_down", ws, "w2", w2, (("E", p.experts), ("H", p.hidden), ("F", p.inter)), w2_scale,
             (("E", p.experts), ("ceil(H/128)", blocks(p.hidden)), ("ceil(F/128)", blocks(p.inter))))
    _check("expert_down", "topk_weights", topk_weights, (torch.float32,), (("T", p.tokens), ("k", p.topk)),
           ws.device, "ws")
    _C.expert_down(p, _dl(w2), _dl(topk_weights), _dl(ws.buffer), w2_scale=_dl(w2_scale), stream=_stream(ws.device))


def combine(ws: Workspace, out: Optional[Tensor] = None) -> Tensor:
    """Stage 5: y [T, H] bf16 from the down GEMM's rows — ws.view("y_rows"), or, when the plan
    splits the down GEMM (plan.down_splits > 1), the FP32 partials ws.view("y_partials")."""
    p = ws.plan
    if out is None:
        out = torch.empty((p.tokens, p.hidden), dtype=torch.bfloat16, device=ws.device)
    else:
        _check("combine", "out", out, (torch.bfloat16,), (("T", p.tokens), ("H", p.hidden)), ws.device, "ws")
    if p.down_splits > 1:
        _C.combine_partials(_dl(ws.view("y_partials")), p.topk, _dl(out), stream=_stream(ws.device))
    else:
        _C.combine(_dl(ws.view("y_rows")), p.topk, _dl(out), stream=_stream(ws.device))
    return out
