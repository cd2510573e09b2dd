"""moekit._train — the training path of moekit.torch: custom ops whose forward returns, beside y,
everything the backward reads, a backward op on the binding's moe_backward, and the autograd
formulas that join them (torch.library.register_autograd). moekit.torch takes this path when grad
is enabled and an input requires grad; everything else runs the inference ops of moekit._ops,
whose schemas this file leaves alone (docs/design.md, "Backward": the Python side).

    fused_moe_train(x, w13, w2, router_logits?, w_gate?, score_bias?, top_k, renormalize, scoring_func,
                    num_expert_group, topk_group, routed_scaling_factor, save_h)
        -> (y, topk_weights, topk_ids, router_logits, sorted_ids, block_expert, num_rows_padded, expert_counts, h)
    fused_experts_train(x, w13, w2, topk_weights, topk_ids, save_h)
        -> (y, sorted_ids, block_expert, num_rows_padded, expert_counts, h)
    moe_backward(dy, x, w13, w2, w_gate?, router_logits?, topk_weights, topk_ids, sorted_ids, block_expert,
                 num_rows_padded, expert_counts, h?, d_logits_aux?, router, input_grad, weight_grads, renormalize,
                 scoring_func, num_expert_group, topk_group, routed_scaling_factor)
        -> (dx, dw13, dw2, d_topk_weights, d_router_logits, d_w_gate)

The forward runs the inference op's kernels (moe_forward / experts_forward: y is bitwise the same)
and returns the routing, the router's logits and align's layout (and h, below) as tensors, not hidden
state, so torch.compile (AOTAutograd saves them from its forward graph for its backward graph) and
CUDA graphs (they live in the graph's pool) see them. The router_logits output is the layer's own
x·w_gateᵀ with w_gate, and an empty [0, E] tensor when the caller gave the logits (autograd then keeps
the caller's); its gradient, when a loss reads it (a load-balancing loss), reaches the backward as
d_logits_aux.
With save_h the forward also keeps h = g | u, the up GEMM's gate and up values before SwiGLU in the
layout's sorted order (ForwardPlan::save_h), as its last output, [rows, 2F] bf16 with rows the kept
sorted_ids' (below), and the backward reads it (SavedActivations::h: one up GEMM fewer, ~15% of its
time, for 2·rows·2F bytes kept from the forward to the backward); without, that output is an empty
[0, 2F] tensor and the backward recomputes h (SavedActivations::recompute: the forward keeps no
activation). The backward asks for what autograd needs (ctx.needs_input_grad): dx (input_grad),
dw13 and dw2 (weight_grads, bf16 as the weights), and with w_gate RouterGrad::gate (d_w_gate, and
dx's router part) when x or w_gate needs a gradient, with caller's logits RouterGrad::logits when
they do. moe_backward's outputs that the plan does not compute are empty float32 tensors of shape
(0,).

NOTES: the kept tensors but h (which the up GEMM writes into a tensor of its own) are copies out of
the forward's workspace, not views: a custom op's outputs may not alias each other (torch.library
checks it), and views would keep the whole workspace (act [max_rows, F], y_rows [T·k, H]) alive
until the backward. The copies are small: 2·T·k + T·E + the layout's rows, blocks and E + 1, 4-byte
values each.
NOTES: the layout's size is the plan's (max_rows and max_blocks follow block_m, which the planner
picks from T and the device), but a fake implementation sees T as a symbol under dynamic shapes. So
sorted_ids and block_expert are returned at bounds that hold for every compiled bf16 block_m —
T·k + (E + 1)·(MAX_BLOCK_M − 1) rows, ceil(T·k / MIN_BLOCK_M) + E blocks (worst_case_rows at its
worst; tests/python/test_backward_cpu.py holds them) — with the plan's layout in their prefix and
the padding sentinel (T·k, block -1) past it; the backward hands the binding the plan's prefixes.
The rows align leaves unwritten (past the used ones) are set to the sentinel before the forward, so
every output but h is a function of the inputs alone (opcheck compares eager and compiled runs).
NOTES: h has the same bound, rows = _layout_rows(T, k, E), so that its fake shape holds under dynamic
shapes too; the binding writes its prefix h[:plan.max_rows] (contiguous: a row prefix), and the
backward hands the binding that prefix again. Its other rows (the layout's padding, which the up GEMM
skips, and those past max_rows) are left as allocated: the backward reads no row that no assignment
fills, and defining them would cost a pass over h, a part of what keeping it saves. y and the
gradients are functions of the inputs all the same (test_gpu_opcheck.py says what opcheck then skips).
"""
from __future__ import annotations

import atexit
import functools
from typing import Callable, Optional

from ._requires import require

require("moekit._train")

import torch
from torch import Tensor

from . import _moekit as _C
from ._torch_util import _dl, _plan, _stream, _workspace, _workspace_view

_BF16, _F32, _I32 = torch.bfloat16, torch.float32, torch.int32


# ---- sizes and plans ------------------------------------------------------------------------

def _layout_rows(tokens, topk: int, experts: int):
    """Rows of every bf16 plan's sorted_ids: worst_case_rows(T, block_m) <= T·k + (E + 1)·(block_m − 1)."""
    return tokens * topk + (experts + 1) * (_C.MAX_BLOCK_M - 1)


def _layout_blocks(tokens, topk: int, experts: int):
    """Blocks of every bf16 plan's block_expert: ceil((T·k + E·(block_m − 1)) / block_m) <= ceil(T·k / block_m)
    + E."""
    return (tokens * topk + _C.MIN_BLOCK_M - 1) // _C.MIN_BLOCK_M + experts


@functools.lru_cache(maxsize=4096)
def _layout(tokens: int, hidden: int, inter: int, experts: int, topk: int, device_index: int) -> dict:
    return _plan(tokens, hidden, inter, experts, topk, device_index).workspace_layout()


@functools.lru_cache(maxsize=4096)
def _backward_plan(tokens: int, hidden: int, inter: int, experts: int, topk: int, device_index: int, saved: str,
                   router: str, input_grad: bool, weight_grads: bool) -> _C.BackwardPlan:
    """saved: 'h' (the forward kept h) or 'recompute'. The forward's plan is the cached one either way: the
    binding sets save_h on a copy of it, which changes neither its configs nor its layout."""
    forward = _plan(tokens, hidden, inter, experts, topk, device_index)
    return _C.plan_backward(forward, device=device_index, saved=saved, router=router, input_grad=input_grad,
                            weight_grads=weight_grads)


# As moekit._torch_util's plan cache: no BackwardPlan may outlive the interpreter (nanobind would
# report it as leaked).
atexit.register(_backward_plan.cache_clear)


# ---- the forward ops ------------------------------------------------------------------------

def _padded(t: Tensor, size: int, fill: int) -> Tensor:
    """A copy of the 1-D `t` at `size` elements, `fill` past its own."""
    out = torch.empty(size, dtype=t.dtype, device=t.device)
    out[:t.numel()].copy_(t)
    out[t.numel():].fill_(fill)
    return out


def _h_rows(tokens, topk: int, experts: int, save_h: bool):
    """Rows of the kept h: the kept sorted_ids' bound with save_h, none without."""
    return _layout_rows(tokens, topk, experts) if save_h else 0


def _run_kept(x: Tensor, w13: Tensor, top_k: int, save_h: bool,
              forward: Callable[[_C.Plan, Tensor, Optional[Tensor]], None]):
    """Runs `forward(plan, workspace, h)` (h: the plan's rows of the kept h with save_h, else None) and
    copies align's layout out of the workspace: (the workspace's view by name, the kept tensors
    (sorted_ids, block_expert, num_rows_padded, expert_counts, h))."""
    T, H = x.shape
    E, F2 = w13.shape[0], w13.shape[1]
    key = (T, H, F2 // 2, E, top_k, x.device.index)
    p = _plan(*key)
    ws = _workspace(p, x.device)
    layout = _layout(*key)

    def view(name: str) -> Tensor:
        return _workspace_view(ws, layout[name])

    h = torch.empty((_h_rows(T, top_k, E, save_h), F2), dtype=_BF16, device=x.device)
    view("sorted_ids").fill_(T * top_k)  # the rows align leaves unwritten hold the sentinel too
    forward(p, ws, h[:p.max_rows] if save_h else None)
    kept = (_padded(view("sorted_ids"), _layout_rows(T, top_k, E), T * top_k),
            _padded(view("block_expert"), _layout_blocks(T, top_k, E), -1),
            view("num_rows_padded").clone(), view("expert_counts").clone(), h)
    return view, kept


def _kept_fake(x: Tensor, T, top_k: int, E: int, F2, save_h: bool) -> tuple:
    return (x.new_empty((_layout_rows(T, top_k, E),), dtype=_I32),
            x.new_empty((_layout_blocks(T, top_k, E),), dtype=_I32),
            x.new_empty((1,), dtype=_I32), x.new_empty((E,), dtype=_I32),
            x.new_empty((_h_rows(T, top_k, E, save_h), F2), dtype=_BF16))


@torch.library.custom_op("moekit::fused_moe_train", mutates_args=())
def _fused_moe_train_op(x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                        w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int, renormalize: bool,
                        scoring_func: str, num_expert_group: int, topk_group: int, routed_scaling_factor: float,
                        save_h: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)

    def forward(p: _C.Plan, ws: Tensor, h: Optional[Tensor]):
        _C.moe_forward(p, _dl(x), _dl(w_gate), _dl(router_logits), _dl(score_bias), _dl(w13), _dl(w2), _dl(y),
                       _dl(ws), scoring=scoring_func, renormalize=renormalize, n_group=num_expert_group,
                       topk_group=topk_group, routed_scaling_factor=routed_scaling_factor, h=_dl(h),
                       stream=_stream(x.device))

    view, kept = _run_kept(x, w13, top_k, save_h, forward)
    logits = view("router_logits").clone() if router_logits is None else \
        torch.empty((0, w13.shape[0]), dtype=_F32, device=x.device)
    return (y, view("topk_weights").clone(), view("topk_ids").clone(), logits) + kept


@_fused_moe_train_op.register_fake
def _(x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func, num_expert_group, topk_group,
      routed_scaling_factor, save_h):
    T, E = x.shape[0], w13.shape[0]
    return (x.new_empty(x.shape), x.new_empty((T, top_k), dtype=_F32), x.new_empty((T, top_k), dtype=_I32),
            x.new_empty((T if router_logits is None else 0, E), dtype=_F32)) + _kept_fake(x, T, top_k, E,
                                                                                          w13.shape[1], save_h)


@torch.library.custom_op("moekit::fused_experts_train", mutates_args=())
def _fused_experts_train_op(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                            save_h: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)

    def forward(p: _C.Plan, ws: Tensor, h: Optional[Tensor]):
        _C.experts_forward(p, _dl(x), _dl(w13), _dl(w2), _dl(topk_ids), _dl(topk_weights), _dl(y), _dl(ws),
                           h=_dl(h), stream=_stream(x.device))

    _, kept = _run_kept(x, w13, topk_ids.shape[1], save_h, forward)
    return (y,) + kept


@_fused_experts_train_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids, save_h):
    return (x.new_empty(x.shape),) + _kept_fake(x, x.shape[0], topk_ids.shape[1], w13.shape[0], w13.shape[1],
                                                save_h)


# ---- the backward op ------------------------------------------------------------------------

def _grad_specs(x: Tensor, w13: Tensor, w_gate: Optional[Tensor], topk_ids: Tensor, router: str, input_grad: bool,
                weight_grads: bool) -> tuple:
    """(shape, dtype) of each output (dx, dw13, dw2, d_topk_weights, d_router_logits, d_w_gate): the
    fake and the real implementation's. What the plan does not compute: (0,) float32."""
    T, H = x.shape
    E, F2 = w13.shape[0], w13.shape[1]
    k, absent = topk_ids.shape[1], ((0,), _F32)
    gate_dtype = w_gate.dtype if w_gate is not None else _F32
    return (((T, H), x.dtype) if input_grad else absent,
            ((E, F2, H), w13.dtype) if weight_grads else absent,
            ((E, H, F2 // 2), w13.dtype) if weight_grads else absent,
            ((T, k), _F32),
            ((T, E), _F32) if router == "logits" else absent,
            ((E, H), gate_dtype) if router == "gate" else absent)


@torch.library.custom_op("moekit::moe_backward", mutates_args=())
def _moe_backward_op(dy: Tensor, x: Tensor, w13: Tensor, w2: Tensor, w_gate: Optional[Tensor],
                     router_logits: Optional[Tensor], topk_weights: Tensor, topk_ids: Tensor, sorted_ids: Tensor,
                     block_expert: Tensor, num_rows_padded: Tensor, expert_counts: Tensor, h: Optional[Tensor],
                     d_logits_aux: Optional[Tensor], router: str, input_grad: bool, weight_grads: bool,
                     renormalize: bool, scoring_func: str, num_expert_group: int, topk_group: int,
                     routed_scaling_factor: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    T, H = x.shape
    E, F2 = w13.shape[0], w13.shape[1]
    saved = "recompute" if h is None else "h"
    p = _backward_plan(T, H, F2 // 2, E, topk_ids.shape[1], x.device.index, saved, router, input_grad, weight_grads)
    specs = _grad_specs(x, w13, w_gate, topk_ids, router, input_grad, weight_grads)
    dx, dw13, dw2, d_topk_weights, d_router_logits, d_w_gate = grads = tuple(
        torch.empty(shape, dtype=dtype, device=x.device) for shape, dtype in specs)
    ws = torch.empty(p.workspace_bytes, dtype=torch.uint8, device=x.device)
    gate = router == "gate"
    _C.moe_backward(p, _dl(x), _dl(w13), _dl(w2), _dl(topk_ids), _dl(topk_weights), _dl(sorted_ids[:p.max_rows]),
                    _dl(block_expert[:p.max_blocks]), _dl(num_rows_padded), _dl(expert_counts), _dl(dy), _dl(ws),
                    w_gate=_dl(w_gate) if gate else None,
                    router_logits=_dl(router_logits) if router != "none" else None,
                    h=None if h is None else _dl(h[:p.max_rows]), d_logits_aux=_dl(d_logits_aux) if gate else None,
                    dx=_dl(dx) if input_grad else None, dw13=_dl(dw13) if weight_grads else None,
                    dw2=_dl(dw2) if weight_grads else None, d_topk_weights=_dl(d_topk_weights),
                    d_router_logits=_dl(d_router_logits) if router == "logits" else None,
                    d_w_gate=_dl(d_w_gate) if gate else None, scoring=scoring_func, renormalize=renormalize,
                    n_group=num_expert_group, topk_group=topk_group, routed_scaling_factor=routed_scaling_factor,
                    stream=_stream(x.device))
    return grads


@_moe_backward_op.register_fake
def _(dy, x, w13, w2, w_gate, router_logits, topk_weights, topk_ids, sorted_ids, block_expert, num_rows_padded,
      expert_counts, h, d_logits_aux, router, input_grad, weight_grads, renormalize, scoring_func, num_expert_group,
      topk_group, routed_scaling_factor):
    return tuple(x.new_empty(shape, dtype=dtype)
                 for shape, dtype in _grad_specs(x, w13, w_gate, topk_ids, router, input_grad, weight_grads))


# ---- autograd -------------------------------------------------------------------------------

def _dense(dy: Optional[Tensor], x: Tensor) -> Tensor:
    """y's gradient as the binding takes it: contiguous (a loss's sum() hands back an expanded one),
    zeros when autograd gives none."""
    return torch.zeros_like(x) if dy is None else dy.contiguous()


def _setup_fused_moe(ctx, inputs, output):
    x, w13, w2, router_logits, w_gate, score_bias, top_k, *routing, save_h = inputs
    y, topk_weights, topk_ids, logits, *layout, h = output
    # The routing weights' gradient flows through y (the backward's router part); the layout and h
    # (what the backward reads, not a result) have none.
    ctx.mark_non_differentiable(topk_weights, topk_ids, *layout, h)
    if router_logits is not None:
        ctx.mark_non_differentiable(logits)  # the empty placeholder: the caller's logits are kept instead
    ctx.save_for_backward(x, w13, w2, w_gate, logits if router_logits is None else router_logits, topk_weights,
                          topk_ids, *layout, h)
    ctx.gate = w_gate is not None
    ctx.save_h = save_h
    ctx.routing = tuple(routing)  # renormalize, scoring_func, num_expert_group, topk_group, routed_scaling_factor


def _backward_fused_moe(ctx, dy, _d_topk_weights, _d_topk_ids, d_logits, *_d_kept):
    x, w13, w2, w_gate, logits, topk_weights, topk_ids, *layout, h = ctx.saved_tensors
    need_x, need_w13, need_w2, need_logits, need_gate = ctx.needs_input_grad[:5]
    if ctx.gate:  # logits = x·w_gateᵀ: x's gradient has a router part too
        router = "gate" if need_x or need_gate else "none"
    else:
        router = "logits" if need_logits else "none"
    gate = router == "gate"
    aux = d_logits.contiguous() if gate and d_logits is not None else None
    dx, dw13, dw2, _, d_router_logits, d_w_gate = torch.ops.moekit.moe_backward(
        _dense(dy, x), x, w13, w2, w_gate if gate else None, logits if router != "none" else None, topk_weights,
        topk_ids, *layout, h if ctx.save_h else None, aux, router, need_x, need_w13 or need_w2, *ctx.routing)
    return (dx if need_x else None, dw13 if need_w13 else None, dw2 if need_w2 else None,
            d_router_logits if need_logits else None, d_w_gate if need_gate else None) + (None,) * 8


def _setup_fused_experts(ctx, inputs, output):
    x, w13, w2, topk_weights, topk_ids, save_h = inputs
    y, *layout, h = output
    ctx.mark_non_differentiable(*layout, h)
    ctx.save_for_backward(x, w13, w2, topk_weights, topk_ids, *layout, h)
    ctx.save_h = save_h


def _backward_fused_experts(ctx, dy, *_d_kept):
    x, w13, w2, topk_weights, topk_ids, *layout, h = ctx.saved_tensors
    need_x, need_w13, need_w2, need_weights = ctx.needs_input_grad[:4]
    dx, dw13, dw2, d_topk_weights, _, _ = torch.ops.moekit.moe_backward(
        _dense(dy, x), x, w13, w2, None, None, topk_weights, topk_ids, *layout, h if ctx.save_h else None, None,
        "none", need_x, need_w13 or need_w2, False, "softmax", 0, 0, 1.0)
    return (dx if need_x else None, dw13 if need_w13 else None, dw2 if need_w2 else None,
            d_topk_weights if need_weights else None, None, None)


torch.library.register_autograd("moekit::fused_moe_train", _backward_fused_moe, setup_context=_setup_fused_moe)
torch.library.register_autograd("moekit::fused_experts_train", _backward_fused_experts,
                                setup_context=_setup_fused_experts)


# ---- what moekit.torch calls ----------------------------------------------------------------

def fused_moe_train(x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor], w_gate: Optional[Tensor],
                    score_bias: Optional[Tensor], top_k: int, renormalize: bool, scoring_func: str, n_group: int,
                    t_group: int, routed_scaling_factor: float, expert_load: Optional[Tensor], save_h: bool) -> Tensor:
    """y of fused_moe through the training op (arguments validated by moekit.torch.fused_moe)."""
    y, *_, expert_counts, _h = torch.ops.moekit.fused_moe_train(x, w13, w2, router_logits, w_gate, score_bias, top_k,
                                                                renormalize, scoring_func, n_group, t_group,
                                                                routed_scaling_factor, save_h)
    _count(expert_load, expert_counts)
    return y


def fused_experts_train(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                        expert_load: Optional[Tensor], save_h: bool) -> Tensor:
    """y of fused_experts through the training op (arguments validated by moekit.torch.fused_experts)."""
    y, *_, expert_counts, _h = torch.ops.moekit.fused_experts_train(x, w13, w2, topk_weights, topk_ids, save_h)
    _count(expert_load, expert_counts)
    return y


def _count(expert_load: Optional[Tensor], expert_counts: Tensor) -> None:
    """The load counter on the training path: it gains align's per-expert counts, the very numbers the
    counting ops add inside align (real assignments; padding and out-of-range ids are not in them)."""
    if expert_load is not None:
        expert_load.add_(expert_counts)
