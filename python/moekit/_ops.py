"""moekit._ops — the torch custom ops behind moekit.torch (``torch.ops.moekit.*``): eager bodies
that call the binding on the current stream, and fake (meta) implementations for torch.compile.
These are the inference ops; the training ops and their autograd are moekit._train's.

Arguments arrive validated (moekit.torch checks them, naming the argument). Each layer op comes
twice: functional (allocates y) and an out-variant (``*_out``, writes the caller's y, declared
mutated), both on one eager body. The layer ops take the FP8 block scales as trailing optional
tensors (w13_scale, w2_scale): with e4m3 weights the plan is an fp8 one (docs/design.md, "FP8"), with
bf16 weights a bf16 one. The workspace comes from torch's caching allocator (inside a CUDA graph, from
the graph's private pool); nothing syncs the host.

The opt-in load counter has ops of its own, ``*_counted``: each layer op again with a required
``Tensor(a!) expert_load`` (int64 [E]) that the call adds its assignments per expert to, in place.
NOTES: not an optional ``Tensor(a!)? expert_load=None`` on the existing ops. torch.library's version
bump of mutated arguments indexes them in the call's arguments, from which the dispatcher drops
trailing defaults, so a call that leaves the counter out fails (IndexError, pytorch/pytorch#176078,
open in torch 2.10 and 2.11); and a mutable schema puts that bump's Python overhead on every call
(pytorch/pytorch#139494). So the ops without a counter keep their schema and cost, and a counted op
always has its counter. They return fresh tensors only, never an alias of it.
"""
from __future__ import annotations

from typing import Optional

from ._requires import require

require("moekit._ops")

import torch
from torch import Tensor

from . import _moekit as _C
from ._torch_util import _check_no_overlap, _dl, _plan, _stream, _workspace


def _precision(w13: Tensor) -> str:
    """The plan's precision from the weights' dtype (the C++ entry then requires the scales)."""
    return "fp8" if w13.dtype == torch.float8_e4m3fn else "bf16"


def _fused_moe_into(y: Tensor, x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                    w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int, renormalize: bool,
                    scoring_func: str, num_expert_group: int, topk_group: int, routed_scaling_factor: float,
                    w13_scale: Optional[Tensor], w2_scale: Optional[Tensor], expert_load: Optional[Tensor] = None):
    T, H = x.shape
    E, F2 = w13.shape[0], w13.shape[1]
    p = _plan(T, H, F2 // 2, E, top_k, x.device.index, _precision(w13))
    ws = _workspace(p, x.device)
    _C.moe_forward(p, _dl(x), _dl(w_gate), _dl(router_logits), _dl(score_bias), _dl(w13), _dl(w2),
                   _dl(y), _dl(ws), scoring=scoring_func, renormalize=renormalize,
                   n_group=num_expert_group, topk_group=topk_group,
                   routed_scaling_factor=routed_scaling_factor, w13_scale=_dl(w13_scale),
                   w2_scale=_dl(w2_scale), expert_load=_dl(expert_load), stream=_stream(x.device))


@torch.library.custom_op("moekit::fused_moe", mutates_args=())
def _fused_moe_op(x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                  w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int,
                  renormalize: bool, scoring_func: str, num_expert_group: int, topk_group: int,
                  routed_scaling_factor: float, w13_scale: Optional[Tensor] = None,
                  w2_scale: Optional[Tensor] = None) -> Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _fused_moe_into(y, x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
                    num_expert_group, topk_group, routed_scaling_factor, w13_scale, w2_scale)
    return y


@_fused_moe_op.register_fake
def _(x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
      num_expert_group, topk_group, routed_scaling_factor, w13_scale=None, w2_scale=None):
    return x.new_empty(x.shape)


@torch.library.custom_op("moekit::fused_moe_out", mutates_args=("y",))
def _fused_moe_out_op(x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                      w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int,
                      renormalize: bool, scoring_func: str, num_expert_group: int, topk_group: int,
                      routed_scaling_factor: float, y: Tensor, w13_scale: Optional[Tensor] = None,
                      w2_scale: Optional[Tensor] = None) -> None:
    _check_no_overlap("fused_moe", "out", y, x=x, w13=w13, w2=w2, router_logits=router_logits, w_gate=w_gate,
                      e_score_correction_bias=score_bias, w13_scale=w13_scale, w2_scale=w2_scale)
    _fused_moe_into(y, x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
                    num_expert_group, topk_group, routed_scaling_factor, w13_scale, w2_scale)


@_fused_moe_out_op.register_fake
def _(x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
      num_expert_group, topk_group, routed_scaling_factor, y, w13_scale=None, w2_scale=None):
    return None


@torch.library.custom_op("moekit::fused_moe_counted", mutates_args=("expert_load",))
def _fused_moe_counted_op(x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                          w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int,
                          renormalize: bool, scoring_func: str, num_expert_group: int, topk_group: int,
                          routed_scaling_factor: float, expert_load: Tensor, w13_scale: Optional[Tensor] = None,
                          w2_scale: Optional[Tensor] = None) -> Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _fused_moe_into(y, x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
                    num_expert_group, topk_group, routed_scaling_factor, w13_scale, w2_scale, expert_load)
    return y


@_fused_moe_counted_op.register_fake
def _(x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
      num_expert_group, topk_group, routed_scaling_factor, expert_load, w13_scale=None, w2_scale=None):
    return x.new_empty(x.shape)


@torch.library.custom_op("moekit::fused_moe_out_counted", mutates_args=("y", "expert_load"))
def _fused_moe_out_counted_op(x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                              w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int,
                              renormalize: bool, scoring_func: str, num_expert_group: int, topk_group: int,
                              routed_scaling_factor: float, y: Tensor, expert_load: Tensor,
                              w13_scale: Optional[Tensor] = None, w2_scale: Optional[Tensor] = None) -> None:
    _check_no_overlap("fused_moe", "out", y, x=x, w13=w13, w2=w2, router_logits=router_logits, w_gate=w_gate,
                      e_score_correction_bias=score_bias, w13_scale=w13_scale, w2_scale=w2_scale,
                      expert_load=expert_load)
    _fused_moe_into(y, x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
                    num_expert_group, topk_group, routed_scaling_factor, w13_scale, w2_scale, expert_load)


@_fused_moe_out_counted_op.register_fake
def _(x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
      num_expert_group, topk_group, routed_scaling_factor, y, expert_load, w13_scale=None, w2_scale=None):
    return None


def _fused_experts_into(y: Tensor, x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                        w13_scale: Optional[Tensor], w2_scale: Optional[Tensor], expert_load: Optional[Tensor] = None):
    T, H = x.shape
    E, F2 = w13.shape[0], w13.shape[1]
    p = _plan(T, H, F2 // 2, E, topk_ids.shape[1], x.device.index, _precision(w13))
    ws = _workspace(p, x.device)
    _C.experts_forward(p, _dl(x), _dl(w13), _dl(w2), _dl(topk_ids), _dl(topk_weights), _dl(y),
                       _dl(ws), w13_scale=_dl(w13_scale), w2_scale=_dl(w2_scale), expert_load=_dl(expert_load),
                       stream=_stream(x.device))


@torch.library.custom_op("moekit::fused_experts", mutates_args=())
def _fused_experts_op(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                      w13_scale: Optional[Tensor] = None, w2_scale: Optional[Tensor] = None) -> Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _fused_experts_into(y, x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)
    return y


@_fused_experts_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None):
    return x.new_empty(x.shape)


@torch.library.custom_op("moekit::fused_experts_out", mutates_args=("y",))
def _fused_experts_out_op(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                          y: Tensor, w13_scale: Optional[Tensor] = None,
                          w2_scale: Optional[Tensor] = None) -> None:
    _check_no_overlap("fused_experts", "out", y, x=x, w13=w13, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids,
                      w13_scale=w13_scale, w2_scale=w2_scale)
    _fused_experts_into(y, x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)


@_fused_experts_out_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids, y, w13_scale=None, w2_scale=None):
    return None


@torch.library.custom_op("moekit::fused_experts_counted", mutates_args=("expert_load",))
def _fused_experts_counted_op(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                              expert_load: Tensor, w13_scale: Optional[Tensor] = None,
                              w2_scale: Optional[Tensor] = None) -> Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _fused_experts_into(y, x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, expert_load)
    return y


@_fused_experts_counted_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids, expert_load, w13_scale=None, w2_scale=None):
    return x.new_empty(x.shape)


@torch.library.custom_op("moekit::fused_experts_out_counted", mutates_args=("y", "expert_load"))
def _fused_experts_out_counted_op(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                                  y: Tensor, expert_load: Tensor, w13_scale: Optional[Tensor] = None,
                                  w2_scale: Optional[Tensor] = None) -> None:
    _check_no_overlap("fused_experts", "out", y, x=x, w13=w13, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids,
                      w13_scale=w13_scale, w2_scale=w2_scale, expert_load=expert_load)
    _fused_experts_into(y, x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, expert_load)


@_fused_experts_out_counted_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids, y, expert_load, w13_scale=None, w2_scale=None):
    return None


@torch.library.custom_op("moekit::route", mutates_args=())
def _route_op(x: Optional[Tensor], w_gate: Optional[Tensor], router_logits: Optional[Tensor],
              score_bias: Optional[Tensor], top_k: int, renormalize: bool, scoring_func: str,
              num_expert_group: int, topk_group: int,
              routed_scaling_factor: float) -> tuple[Tensor, Tensor]:
    ref = router_logits if router_logits is not None else x
    T = ref.shape[0]
    topk_weights = torch.empty((T, top_k), dtype=torch.float32, device=ref.device)
    topk_ids = torch.empty((T, top_k), dtype=torch.int32, device=ref.device)
    # Logits from w_gate go through a scratch buffer: computed across many SMs first (same bits).
    scratch = None if router_logits is not None else \
        torch.empty((T, w_gate.shape[0]), dtype=torch.float32, device=ref.device)
    _C.route(_dl(x), _dl(w_gate), _dl(router_logits), _dl(score_bias), _dl(topk_ids), _dl(topk_weights),
             scoring=scoring_func, renormalize=renormalize, n_group=num_expert_group,
             topk_group=topk_group, routed_scaling_factor=routed_scaling_factor, logits_scratch=_dl(scratch),
             stream=_stream(ref.device))
    return topk_weights, topk_ids


@_route_op.register_fake
def _(x, w_gate, router_logits, score_bias, top_k, renormalize, scoring_func, num_expert_group,
      topk_group, routed_scaling_factor):
    ref = router_logits if router_logits is not None else x
    T = ref.shape[0]
    return (ref.new_empty((T, top_k), dtype=torch.float32),
            ref.new_empty((T, top_k), dtype=torch.int32))


@torch.library.custom_op("moekit::combine", mutates_args=())
def _combine_op(y_rows: Tensor, top_k: int) -> Tensor:
    y = torch.empty((y_rows.shape[0] // top_k, y_rows.shape[1]), dtype=y_rows.dtype, device=y_rows.device)
    _C.combine(_dl(y_rows), top_k, _dl(y), stream=_stream(y_rows.device))
    return y


@_combine_op.register_fake
def _(y_rows, top_k):
    return y_rows.new_empty((y_rows.shape[0] // top_k, y_rows.shape[1]))
