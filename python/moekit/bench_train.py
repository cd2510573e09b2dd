"""python -m moekit.bench --backward — one training step (forward + backward) of the layer through
moekit against the same step through a torch._grouped_mm autograd pipeline, same run.

Two steps per preset and T, each returning the gradients (torch.autograd.grad of the output with
a fixed random dL/dy; nothing accumulates between calls):
  layer   — routing included: moekit.torch.fused_moe from w_gate against torch routing +
            grouped_mm_experts (bench.py), gradients of x, w_gate, w13 and w2;
  experts — the routing given: fused_experts against grouped_mm_experts, gradients of x,
            topk_weights, w13 and w2.
Both sides' dx, dW13 and dW2 are first checked against FP32 autograd of the naive per-expert loop
(moekit.reference.experts_reference, TF32 off) on the first tokens, on moekit's routing, within
GRAD_BOUND. Times as bench.py's: medians of CUDA-event pairs, the L2 flushed before each call,
as a CUDA graph replay and eagerly. FLOPs of a step: 18·T·k·H·F (the forward's 6, the backward's
12). moekit's forward keeps h (save_h=True), as the torch pipeline's autograd keeps its
intermediates: both steps do the same work and hold alike memory.
"""
from __future__ import annotations

import sys
from typing import Optional

from ._requires import require

require("moekit.bench --backward")
import torch  # noqa: E402

from . import _moekit as _C  # noqa: E402
from ._baseline import Timer, grouped_mm_experts, make_weights, row_cells, torch_route  # noqa: E402
from .presets import Preset  # noqa: E402
from .reference import experts_reference, rel_norm_error  # noqa: E402
from .torch import fused_experts, fused_moe, route  # noqa: E402

# bf16's unit roundoff U = 2^-8. The bound of each gradient's relative norm error against FP32
# autograd on the same bf16 inputs, as tests/python/test_gpu_train.py derives it: moekit rounds
# h, act_w and dh to bf16 and writes bf16 dx / dW (≈0.6-0.9U RMS); 4U is ~5x that. The torch
# pipeline rounds its intermediates to bf16 alike. A wrong row, expert or weight is O(1).
GRAD_BOUND = 4 * 2.0 ** -8
GRADS = ("dx", "dw13", "dw2")
# Tokens of the gradient check: DeepSeek-V3's 16 x 8 slots touch up to 128 experts, whose FP32
# copies and gradients are ~45 GB; the rows are independent, so a few cover every code path.
CHECK_GRAD_TOKENS = 16


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


def _grads(y: torch.Tensor, inputs: list, dy: torch.Tensor) -> tuple:
    return torch.autograd.grad(y, inputs, dy)


def check_grads(w: dict, x: torch.Tensor, dy: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor,
                row: dict) -> Optional[str]:
    """dx, dW13, dW2 of both sides against FP32 autograd of the naive loop on the first CHECK_GRAD_TOKENS
    tokens; the reference holds FP32 copies of the experts those tokens touch only. Errors go into row
    (err_<side>_<grad>); a side that cannot run is a note, not a failure."""
    n = min(x.shape[0], CHECK_GRAD_TOKENS)
    xs, dys, tw, ti = x[:n].contiguous(), dy[:n].contiguous(), topk_w[:n].contiguous(), topk_ids[:n].contiguous()
    used = torch.unique(ti)  # the touched experts, ascending; ti renumbered into them for the reference
    ref_in = [_leaf(xs.float()), _leaf(w["w13"][used].float()), _leaf(w["w2"][used].float())]
    ref = _grads(experts_reference(ref_in[0], ref_in[1], ref_in[2], tw, torch.searchsorted(used, ti)), ref_in,
                 dys.float())
    why = None
    moekit_step = lambda *a: fused_experts(*a, save_h=True)  # noqa: E731 (the timed path)
    for name, fn in {"moekit": moekit_step, "torch": grouped_mm_experts}.items():
        inputs = [_leaf(xs), _leaf(w["w13"]), _leaf(w["w2"])]
        try:
            got = _grads(fn(inputs[0], inputs[1], inputs[2], tw, ti), inputs, dys)
        except Exception as e:
            if name == "moekit":
                raise
            row.setdefault("notes", []).append(f"{name} check: {type(e).__name__}: {e}"[:300])
            continue
        got = (got[0], got[1][used], got[2][used])
        for g, r, label in zip(got, ref, GRADS):
            err = rel_norm_error(g, r)
            row[f"err_{name}_{label}"] = err
            if err > GRAD_BOUND and why is None:
                why = f"{name} {label} error {err:.2e} > {GRAD_BOUND:.2e}"
        del got
    return why


def bench_train_preset(p: Preset, tokens: list, timer: Timer, graph: bool, seed: int, device) -> list:
    w = make_weights(p, device, seed)
    bias = w["e_score_correction_bias"]
    w_gate, w13, w2 = _leaf(w["w_gate"]), _leaf(w["w13"]), _leaf(w["w2"])
    rows = []
    for T in tokens:
        gen = torch.Generator(device=device).manual_seed(seed + T)
        x = _leaf(torch.empty((T, p.hidden), dtype=torch.bfloat16, device=device).normal_(0, 1, generator=gen))
        dy = torch.empty((T, p.hidden), dtype=torch.bfloat16, device=device).normal_(0, 1, generator=gen)
        with torch.no_grad():
            topk_w, topk_ids = route(x, w["w_gate"], top_k=p.top_k, e_score_correction_bias=bias, **p.routing)
        topk_w = _leaf(topk_w)
        row = dict(preset=p.name, tokens=T, stage="train-step", block_m=_C.plan_forward(
            T, p.hidden, p.inter, p.experts, p.top_k, device=device.index).block_m)
        why = check_grads(w, x.detach(), dy, topk_w.detach(), topk_ids, row)
        if why:
            row["failed"] = why
            rows.append(row)
            print(f"  {p.name} T={T}: CHECK FAILED, not timed: {why}", file=sys.stderr)
            continue
        layer_in = [x, w_gate, w13, w2]
        experts_in = [x, topk_w, w13, w2]
        variants = {
            "moekit": lambda: _grads(fused_moe(x, w13, w2, w_gate=w_gate, top_k=p.top_k, e_score_correction_bias=bias,
                                               save_h=True, **p.routing), layer_in, dy),
            "torch": lambda: _grads(grouped_mm_experts(x, w13, w2, *torch_route(x, w_gate, bias, p)), layer_in, dy),
            "moekit_experts": lambda: _grads(fused_experts(x, w13, w2, topk_w, topk_ids, save_h=True), experts_in, dy),
            "torch_experts": lambda: _grads(grouped_mm_experts(x, w13, w2, topk_w, topk_ids), experts_in, dy),
        }
        timer.each(variants, graph, row, release=True)  # each captured step's pool (its gradients) freed
        row["flops"] = 3 * p.flops(T)  # the forward's 2·T·k·3·H·F, the backward's twice that
        best = row.get("moekit_graph_ms") or row.get("moekit_eager_ms")
        if best:
            row["moekit_TFLOPps"] = row["flops"] / (best * 1e-3) / 1e12
        rows.append(row)
        print_train_row(row, graph)
    return rows


TRAIN_HEADER = (f"{'preset':<14} {'T':>5} {'bm':>3} | {'moekit':>6} {'torch':>6} {'x':>5} | {'moekit':>6} "
                f"{'torch':>6} {'x':>5} | {'TFLOP/s':>7} | {'err dx':>7} {'dW13':>7} {'dW2':>7}")


def print_train_row(r: dict, graph: bool):
    errs = " ".join(f"{r.get(f'err_moekit_{g}') or 0:7.1e}" for g in GRADS)
    print(f"{row_cells(r, graph)} | {r.get('moekit_TFLOPps') or 0:7.1f} | {errs}", flush=True)
