"""moekit._functional — moekit.torch's functions on PyTorch tensors: fused_moe, fused_experts (each on
the inference ops of moekit._ops, or the training ops of moekit._train when an input requires grad),
route and combine. Each validates its arguments at the boundary, naming them (moekit.torch's docstring
says how the ops run); moekit.torch re-exports them beside the MoE module built on them.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ._requires import require

require("moekit.torch")

import torch
from torch import Tensor

from . import _moekit as _C
from . import _ops  # noqa: F401  registers torch.ops.moekit.*
from . import _train  # registers torch.ops.moekit.*_train, moe_backward and their autograd
from ._torch_util import (_alias, _check, _check_bool, _check_expert_load, _check_plan, _check_router,
                          _check_routing, _fail, _forward_only, _grouped_topk, _required, _trains)
from .devices import DeviceLike
from .fp8 import check_fp8_experts


# ---- the public functions -------------------------------------------------------------------

def fused_moe(x: Optional[Tensor] = None, w13: Optional[Tensor] = None, w2: Optional[Tensor] = None,
              router_logits: Optional[Tensor] = None, w_gate: Optional[Tensor] = None, top_k: Optional[int] = None,
              renormalize: bool = False, scoring_func: str = "softmax", num_expert_group: Optional[int] = None,
              topk_group: Optional[int] = None, e_score_correction_bias: Optional[Tensor] = None,
              routed_scaling_factor: float = 1.0, *, out: Optional[Tensor] = None,
              hidden_states: Optional[Tensor] = None, w1: Optional[Tensor] = None,
              gating_output: Optional[Tensor] = None, topk: Optional[int] = None,
              use_grouped_topk: Optional[bool] = None, use_fp8_w8a8: bool = False,
              w13_scale: Optional[Tensor] = None, w2_scale: Optional[Tensor] = None,
              w1_scale: Optional[Tensor] = None, a1_scale: Optional[Tensor] = None,
              a2_scale: Optional[Tensor] = None, block_shape: Optional[Sequence[int]] = None,
              device_info: DeviceLike = None, expert_load: Optional[Tensor] = None,
              save_h: bool = False) -> Tensor:
    """One MoE layer: y = Σ_j w_j · FFN_{e_j}(x), routing included.

    x [T, H] bf16; w13 [E, 2F, H] bf16 (gate rows, then up rows); w2 [E, H, F] bf16. Routing
    from router_logits [T, E] float32, or from w_gate [E, H] (bf16/float32; logits x·w_gateᵀ in
    FP32). scoring_func "softmax" | "sigmoid"; num_expert_group/topk_group: grouped top-k
    (DeepSeek-V3), e_score_correction_bias [E] float32 picks experts, unbiased scores weigh them;
    renormalize divides the top-k weights by their sum; routed_scaling_factor multiplies them.
    Returns y [T, H] bf16, written into `out` when given (bf16 [T, H], contiguous, on x's device,
    sharing no memory with an input). Equal scores: the lower expert id wins; bitwise deterministic.

    vLLM's names (its fused_moe, fused_experts, FusedMoE) are keyword aliases; giving both names
    of one argument is a TypeError:

        vLLM                 moekit
        hidden_states        x
        w1                   w13 (same layout: [E, 2F, H], gate rows then up rows)
        gating_output        router_logits
        topk                 top_k
        use_grouped_topk     True: num_expert_group and topk_group must be given (grouped top-k
                             runs exactly when they are); False: they must not be
        renormalize, scoring_func, num_expert_group, topk_group, e_score_correction_bias,
        routed_scaling_factor: the same names.

    Positional arguments follow moekit's order: after gating_output, vLLM's (topk, renormalize)
    go by keyword.

    FP8 (DeepSeek-V3's format, vLLM's flags): use_fp8_w8a8=True with w13/w2 float8_e4m3fn,
    w1_scale (moekit's name: w13_scale) [E, 2·ceil(F/128), ceil(H/128)] and w2_scale
    [E, ceil(H/128), ceil(F/128)] float32 block scales (the checkpoint's weight_scale_inv; gate's
    blocks, then up's), block_shape=[128, 128]. x stays bf16: the library quantizes it per token
    and 128 columns on the device, so a1_scale/a2_scale (static activation scales) are refused.
    moekit.quantize_fp8_weights makes this format from bf16 weights; moekit.hf loads it.

    The shape is checked against the plan it runs with before any device call (an error names
    the argument: H is x's, F and E are w13's). device_info (a moekit.DeviceInfo or a dict of
    its fields, e.g. moekit.devices.H200) plans that check on a described GPU instead of x's, so
    it runs on a machine without one; the kernels still run with x's GPU's own plan.

    expert_load (int64 [E], contiguous, on x's device; optional): a load counter the call adds its
    assignments per expert to, in place, on the device (inside align's kernel: no host sync, no
    extra launch, CUDA-graph and torch.compile safe; exact integer sums). Padding is not counted.
    moekit never reads or clears it: read it (``.tolist()``, which syncs) and reset it
    (``.zero_()``) when you choose.

    Gradients: when grad is enabled and x, w13, w2, w_gate or router_logits requires grad, the call
    runs the training op (moekit._train), and y.backward() reaches them through moekit's backward
    (bf16; with w_gate, x's gradient includes the router's part). FP8 experts and out= are refused
    then, as is an e_score_correction_bias that requires grad (it only picks the experts).

    save_h (training path only): the forward keeps h = g | u (the up GEMM's values before SwiGLU) for
    the backward, which skips recomputing it (one GEMM, ~15% of its time), for 2·rows·2F bytes of
    activation memory a layer until the backward has run (rows = T·k + (E + 1)·(MAX_BLOCK_M − 1), the
    aligned layout's bound). bf16 only, as training is; ignored on the inference path. y is the same bit
    for bit; the gradients too where the two up GEMMs are one kernel family, else within rounding.
    """
    fn = "fused_moe"
    x = _required(fn, "x", _alias(fn, "x", x, "hidden_states", hidden_states), "hidden_states")
    w13 = _required(fn, "w13", _alias(fn, "w13", w13, "w1", w1), "w1")
    w2 = _required(fn, "w2", w2)
    w13_scale = _alias(fn, "w13_scale", w13_scale, "w1_scale", w1_scale)
    router_logits = _alias(fn, "router_logits", router_logits, "gating_output", gating_output)
    top_k = _alias(fn, "top_k", top_k, "topk", topk)
    num_expert_group, topk_group = _grouped_topk(fn, use_grouped_topk, num_expert_group, topk_group)
    if w_gate is not None and not isinstance(w_gate, torch.Tensor):
        raise TypeError(f"moekit.{fn}: argument 'w_gate': expected a torch.Tensor, got {type(w_gate).__name__} "
                        "(vLLM's positional (gating_output, topk, renormalize): pass top_k= and renormalize= "
                        "by keyword)")
    T, H, F, E = check_fp8_experts(fn, x, w13, w2, use_fp8_w8a8, w13_scale, w2_scale, a1_scale, a2_scale, block_shape)
    _check_router(fn, T, H, E, x, router_logits, w_gate, e_score_correction_bias)
    top_k, n_group, t_group = _check_routing(fn, E, top_k, scoring_func, num_expert_group, topk_group,
                                             routed_scaling_factor)
    train = _trains(fn, use_fp8_w8a8, out, dict(e_score_correction_bias=e_score_correction_bias), x=x, w13=w13,
                    w2=w2, router_logits=router_logits, w_gate=w_gate)
    _check_bool(fn, "save_h", save_h)
    if out is not None:
        _check(fn, "out", out, (torch.bfloat16,), (("T", T), ("H", H)), x.device)
    _check_expert_load(fn, expert_load, E, x.device)
    _check_plan(fn, T, H, F, E, top_k, "fp8" if use_fp8_w8a8 else "bf16", device_info, x.device)
    args = (x, w13, w2, router_logits, w_gate, e_score_correction_bias, top_k, bool(renormalize), scoring_func,
            n_group, t_group, float(routed_scaling_factor))
    if train:
        return _train.fused_moe_train(*args, expert_load, save_h)
    scales = (w13_scale, w2_scale) if use_fp8_w8a8 else ()
    ops = torch.ops.moekit
    if expert_load is not None:  # the counting ops (moekit._ops says why they are ops of their own)
        if out is None:
            return ops.fused_moe_counted(*args, expert_load, *scales)
        ops.fused_moe_out_counted(*args, out, expert_load, *scales)
        return out
    if out is None:
        return ops.fused_moe(*args, *scales)
    ops.fused_moe_out(*args, out, *scales)
    return out


def fused_experts(x: Optional[Tensor] = None, w13: Optional[Tensor] = None, w2: Optional[Tensor] = None,
                  topk_weights: Optional[Tensor] = None, topk_ids: Optional[Tensor] = None, *,
                  out: Optional[Tensor] = None, hidden_states: Optional[Tensor] = None,
                  w1: Optional[Tensor] = None, use_fp8_w8a8: bool = False, w13_scale: Optional[Tensor] = None,
                  w2_scale: Optional[Tensor] = None, w1_scale: Optional[Tensor] = None,
                  a1_scale: Optional[Tensor] = None, a2_scale: Optional[Tensor] = None,
                  block_shape=None, device_info: DeviceLike = None,
                  expert_load: Optional[Tensor] = None, save_h: bool = False) -> Tensor:
    """The experts with the routing given (vLLM's argument order): topk_weights [T, k] float32,
    topk_ids [T, k] int32 in [0, E). An id outside is not checked on the host (that would sync):
    align skips it and flags the workspace (Workspace.check_status in the staged API), and the
    token's output is undefined (nor is it counted in expert_load). `out`, vLLM's names
    (hidden_states = x, w1 = w13) and FP8 (use_fp8_w8a8, w1_scale, w2_scale, block_shape),
    device_info and expert_load as in fused_moe. Gradients as in fused_moe, for x, w13, w2 and
    topk_weights (which the caller's router takes back: moekit's RouterGrad::none); save_h too."""
    fn = "fused_experts"
    x = _required(fn, "x", _alias(fn, "x", x, "hidden_states", hidden_states), "hidden_states")
    w13 = _required(fn, "w13", _alias(fn, "w13", w13, "w1", w1), "w1")
    w13_scale = _alias(fn, "w13_scale", w13_scale, "w1_scale", w1_scale)
    T, H, F, E = check_fp8_experts(fn, x, w13, w2, use_fp8_w8a8, w13_scale, w2_scale, a1_scale, a2_scale, block_shape)
    _check(fn, "topk_ids", topk_ids, (torch.int32,), (("T", T), ("k", None)), x.device)
    k = topk_ids.shape[1]
    if not 1 <= k <= _C.MAX_TOPK:
        _fail(fn, "topk_ids", f"k must be in [1, {_C.MAX_TOPK}], got {k}")
    _check(fn, "topk_weights", topk_weights, (torch.float32,), (("T", T), ("k", k)), x.device)
    train = _trains(fn, use_fp8_w8a8, out, {}, x=x, w13=w13, w2=w2, topk_weights=topk_weights)
    _check_bool(fn, "save_h", save_h)
    if out is not None:
        _check(fn, "out", out, (torch.bfloat16,), (("T", T), ("H", H)), x.device)
    _check_expert_load(fn, expert_load, E, x.device)
    _check_plan(fn, T, H, F, E, k, "fp8" if use_fp8_w8a8 else "bf16", device_info, x.device, "topk_ids")
    if train:
        return _train.fused_experts_train(x, w13, w2, topk_weights, topk_ids, expert_load, save_h)
    scales = (w13_scale, w2_scale) if use_fp8_w8a8 else ()
    ops, routing = torch.ops.moekit, (x, w13, w2, topk_weights, topk_ids)
    if expert_load is not None:
        if out is None:
            return ops.fused_experts_counted(*routing, expert_load, *scales)
        ops.fused_experts_out_counted(*routing, out, expert_load, *scales)
        return out
    if out is None:
        return ops.fused_experts(*routing, *scales)
    ops.fused_experts_out(*routing, out, *scales)
    return out


def route(x: Optional[Tensor] = None, w_gate: Optional[Tensor] = None,
          router_logits: Optional[Tensor] = None, top_k: Optional[int] = None,
          renormalize: bool = False, scoring_func: str = "softmax",
          num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
          e_score_correction_bias: Optional[Tensor] = None,
          routed_scaling_factor: float = 1.0, *, hidden_states: Optional[Tensor] = None,
          gating_output: Optional[Tensor] = None, topk: Optional[int] = None,
          use_grouped_topk: Optional[bool] = None) -> tuple[Tensor, Tensor]:
    """The router alone: (topk_weights [T, k] float32, topk_ids [T, k] int32), from router_logits
    [T, E] float32 or from x [T, H] bf16 and w_gate [E, H]. Same options and vLLM names as fused_moe."""
    fn = "route"
    x = _alias(fn, "x", x, "hidden_states", hidden_states)
    router_logits = _alias(fn, "router_logits", router_logits, "gating_output", gating_output)
    top_k = _alias(fn, "top_k", top_k, "topk", topk)
    num_expert_group, topk_group = _grouped_topk(fn, use_grouped_topk, num_expert_group, topk_group)
    if router_logits is not None:
        _check(fn, "router_logits", router_logits, (torch.float32,), (("T", None), ("E", None)))
        T, E = router_logits.shape
        dev, H = router_logits.device, None
        if w_gate is not None:
            _fail(fn, "w_gate", "give router_logits or x with w_gate, not both")
    else:
        if x is None:
            _fail(fn, "x", "give router_logits [T, E], or x [T, H] and w_gate [E, H]")
        _check(fn, "x", x, (torch.bfloat16,), (("T", None), ("H", None)))
        T, H = x.shape
        dev = x.device
        if w_gate is None:
            _fail(fn, "w_gate", "give router_logits [T, E], or x [T, H] and w_gate [E, H]")
        _check(fn, "w_gate", w_gate, (torch.bfloat16, torch.float32), (("E", None), ("H", H)), dev)
        E = w_gate.shape[0]
    if e_score_correction_bias is not None:
        _check(fn, "e_score_correction_bias", e_score_correction_bias, (torch.float32,), (("E", E),), dev,
               "router_logits" if router_logits is not None else "x")
    top_k, n_group, t_group = _check_routing(fn, E, top_k, scoring_func, num_expert_group, topk_group,
                                             routed_scaling_factor)
    _forward_only(fn, x=x, w_gate=w_gate, router_logits=router_logits,
                  e_score_correction_bias=e_score_correction_bias)
    return torch.ops.moekit.route(x if router_logits is None else None, w_gate, router_logits,
                                  e_score_correction_bias, top_k, bool(renormalize), scoring_func,
                                  n_group, t_group, float(routed_scaling_factor))


def combine(y_rows: Tensor, top_k: int) -> Tensor:
    """y[t] = Σ_j y_rows[t·k + j] in slot order (FP32 sum, bf16 out): y_rows [T·k, H] bf16."""
    _check("combine", "y_rows", y_rows, (torch.bfloat16,), (("T*k", None), ("H", None)))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= _C.MAX_TOPK:
        _fail("combine", "top_k", f"must be an int in [1, {_C.MAX_TOPK}], got {top_k!r}")
    if y_rows.shape[0] % top_k != 0:
        _fail("combine", "y_rows", f"row count {y_rows.shape[0]} is not a multiple of top_k={top_k}")
    _forward_only("combine", y_rows=y_rows)
    return torch.ops.moekit.combine(y_rows, top_k)
