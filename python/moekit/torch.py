"""moekit.torch — moekit on PyTorch tensors: custom ops, ``fused_moe``, and the ``MoE`` module.

Each call validates its arguments (a ``moekit.Error``, a ValueError, naming the argument), then
runs a torch custom op (``torch.ops.moekit.*``, defined in moekit._ops; ``fused_moe_out``/
``fused_experts_out`` when the caller gives ``out=``). The ops have fake (meta) implementations,
so ``torch.compile`` traces through them with no graph break, and their CUDA work is enqueued on
the current torch stream with no host synchronisation, so they capture in ``torch.cuda.graph``.
The workspace comes from PyTorch's caching allocator (``torch.empty(uint8)``; inside a CUDA
graph, from the graph's private pool).

Tensors cross into C++ as DLPack capsules, zero-copy (moekit._torch_util says why capsules).
The staged API (Workspace, align, expert_up, expert_down, combine(ws)) lives in moekit.stages.
FP8 experts (DeepSeek-V3's format, ``use_fp8_w8a8=True``) run through the same ops with their
block scales; moekit.fp8 holds the quantizer and the format's checks.
Load statistics: ``expert_load=`` (int64 [E]) gains each call's assignments per expert, on the
device (``MoE(..., track_expert_load=True)`` keeps one as a buffer).

Training: when grad is enabled and an input requires grad (x, the weights, the router's w_gate or
router_logits; fused_experts: topk_weights too), fused_moe / fused_experts run the training ops of
moekit._train instead, whose gradients come from moekit's backward (torch.library.register_autograd):
bf16 experts without out=; MoE(..., trainable=True) has trainable parameters. save_h=True (fused_moe,
fused_experts, MoE) keeps h = g | u from the forward for the backward, which then skips its
recomputation. route and combine have no backward and refuse inputs that require grad.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from ._requires import require

require("moekit.torch")

import torch
from torch import Tensor

from . import _moekit as _C
from . import _ops  # noqa: F401  registers torch.ops.moekit.*
from . import _train  # registers torch.ops.moekit.*_train, moe_backward and their autograd
from ._torch_util import (_alias, _check, _check_bool, _check_expert_load, _check_plan, _check_router,
                          _check_routing, _fail, _forward_only, _grouped_topk, _required, _trains, plan)
from .devices import DeviceLike
from .fp8 import check_fp8_experts, quantize_fp8_weights
from .hf import ARCH_DEFAULTS, pack_experts, pack_hf_moe, pack_hf_state_dict, routing_from_hf_config
from .stages import Workspace, align, expert_down, expert_up, quantize_tokens

__all__ = [
    "fused_moe", "fused_experts", "route", "combine", "MoE", "Workspace", "align", "quantize_tokens", "expert_up",
    "expert_down", "plan", "pack_experts", "pack_hf_moe", "pack_hf_state_dict",
    "routing_from_hf_config", "moe_from_hf", "quantize_fp8_weights",
]


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


# ---- the module -----------------------------------------------------------------------------

class MoE(torch.nn.Module):
    """One MoE layer: router + E SwiGLU experts, run by moekit.fused_moe.

    Parameters: w_gate [E, H] (router), w13 [E, 2F, H] (gate rows then up rows), w2 [E, H, F];
    buffer e_score_correction_bias [E] float32 when score_bias=True (DeepSeek-V3: it is set by
    load balancing, not by gradients). forward(x [..., H]) -> y [..., H].

    Training: trainable=True creates the parameters with requires_grad=True; the default (False)
    creates them frozen, for inference, as before training existed. forward follows torch's rule
    either way: with grad enabled and x or a parameter requiring grad (also after
    ``moe.requires_grad_()``), it runs moekit's training op and y.backward() fills the gradients of
    x, w_gate, w13 and w2 (bf16, w_gate's in its gate_dtype) from moekit's backward; under
    torch.no_grad() / torch.inference_mode(), or with nothing requiring grad, the inference op.

    track_expert_load=True adds the buffer expert_load [E] int64 (zeros; persistent=False, so it
    is in no state_dict): every forward adds its tokens' assignments per expert to it on the
    device (fused_moe's expert_load: no host sync, CUDA-graph and torch.compile safe). Read it
    when you choose (``moe.expert_load.tolist()`` syncs); reset_expert_load() zeroes it.

    save_h=True: each training forward keeps h for its backward (fused_moe's save_h: activation memory
    for one GEMM fewer in the backward); the inference path ignores it.
    """

    def __init__(self, hidden: int, inter: int, experts: int, top_k: int, *, renormalize: bool = False,
                 scoring_func: str = "softmax", num_expert_group: Optional[int] = None,
                 topk_group: Optional[int] = None, score_bias: bool = False,
                 routed_scaling_factor: float = 1.0, gate_dtype: torch.dtype = torch.bfloat16,
                 device: Union[torch.device, str, int, None] = None, dtype: torch.dtype = torch.bfloat16,
                 track_expert_load: bool = False, trainable: bool = False, save_h: bool = False) -> None:
        super().__init__()
        if dtype != torch.bfloat16:
            _fail("MoE", "dtype", f"moekit's experts run in bfloat16, got {dtype}")
        if gate_dtype not in (torch.bfloat16, torch.float32):
            _fail("MoE", "gate_dtype", f"expected bfloat16 or float32, got {gate_dtype}")
        _check_routing("MoE", experts, top_k, scoring_func, num_expert_group, topk_group, routed_scaling_factor)
        _check_bool("MoE", "save_h", save_h)
        self.save_h = save_h
        self.hidden, self.inter, self.experts, self.top_k = hidden, inter, experts, top_k
        self.renormalize = renormalize
        self.scoring_func = scoring_func
        self.num_expert_group = num_expert_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        grad = dict(requires_grad=bool(trainable))  # frozen by default (see the class's docstring)
        self.w_gate = torch.nn.Parameter(torch.empty(experts, hidden, dtype=gate_dtype, device=device), **grad)
        self.w13 = torch.nn.Parameter(torch.empty(experts, 2 * inter, hidden, dtype=dtype, device=device), **grad)
        self.w2 = torch.nn.Parameter(torch.empty(experts, hidden, inter, dtype=dtype, device=device), **grad)
        if score_bias:
            self.register_buffer("e_score_correction_bias",
                                 torch.zeros(experts, dtype=torch.float32, device=device))
        else:
            self.e_score_correction_bias = None
        if track_expert_load:
            self.register_buffer("expert_load", torch.zeros(experts, dtype=torch.int64, device=device),
                                 persistent=False)
        else:
            self.expert_load = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        for p, fan_in in ((self.w_gate, self.hidden), (self.w13, self.hidden), (self.w2, self.inter)):
            if p.device.type != "meta":
                bound = fan_in ** -0.5
                p.uniform_(-bound, bound)

    @torch.no_grad()
    def reset_expert_load(self) -> None:
        """Zeroes the expert_load buffer, on the device (ordered on the current stream; no sync)."""
        if self.expert_load is None:
            _fail("MoE.reset_expert_load", "track_expert_load", "is False: there is no expert_load to reset "
                                                                "(construct MoE(..., track_expert_load=True))")
        self.expert_load.zero_()

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        y = fused_moe(x.reshape(-1, self.hidden).contiguous(), self.w13, self.w2, w_gate=self.w_gate,
                      top_k=self.top_k, renormalize=self.renormalize, scoring_func=self.scoring_func,
                      num_expert_group=self.num_expert_group, topk_group=self.topk_group,
                      e_score_correction_bias=self.e_score_correction_bias,
                      routed_scaling_factor=self.routed_scaling_factor, expert_load=self.expert_load,
                      save_h=self.save_h)
        return y.view(shape)

    def extra_repr(self) -> str:
        s = (f"hidden={self.hidden}, inter={self.inter}, experts={self.experts}, top_k={self.top_k}, "
             f"scoring_func={self.scoring_func!r}, renormalize={self.renormalize}")
        if self.num_expert_group is not None:
            s += f", num_expert_group={self.num_expert_group}, topk_group={self.topk_group}"
        if self.e_score_correction_bias is not None:
            s += ", score_bias=True"
        if self.routed_scaling_factor != 1.0:
            s += f", routed_scaling_factor={self.routed_scaling_factor}"
        if self.expert_load is not None:
            s += ", track_expert_load=True"
        if self.save_h:
            s += ", save_h=True"
        return s

    @classmethod
    def from_hf(cls, layer: torch.nn.Module, config: object = None, arch: Optional[str] = None, **overrides) -> "MoE":
        """The MoE of a Hugging Face decoder layer (or its MoE block): Mixtral, Qwen3-MoE or
        DeepSeek-V3. See moekit.torch.moe_from_hf."""
        return moe_from_hf(layer, config, arch, **overrides)


def moe_from_hf(layer: torch.nn.Module, config: object = None, arch: Optional[str] = None, *,
                device: Union[torch.device, str, int, None] = None, **overrides) -> "MoE":
    """A moekit.torch.MoE holding the packed weights of a Hugging Face decoder layer's MoE.

    Routing comes from `config` (the model's HF config) when given, else from
    moekit.hf.ARCH_DEFAULTS for the detected architecture; keyword overrides (top_k=..., ...) win
    over both. trainable=True (an override too) makes the packed parameters trainable.
    """
    packed = pack_hf_moe(layer, device=device)
    if packed["w13_scale"] is not None:
        _fail("moe_from_hf", "layer", "has FP8 experts (float8_e4m3fn weights with weight_scale_inv), and MoE holds "
                                      "bf16 ones: run moekit.fused_moe(..., use_fp8_w8a8=True) on "
                                      "moekit.hf.pack_hf_moe(layer)'s w13, w2, w13_scale and w2_scale")
    arch = arch or getattr(config, "model_type", None) or packed["arch"]
    opts = routing_from_hf_config(config, arch) if config is not None else dict(ARCH_DEFAULTS[arch])
    opts.update(overrides)
    w_gate, w13, w2, bias = packed["w_gate"], packed["w13"], packed["w2"], packed["e_score_correction_bias"]
    E, F2, H = w13.shape
    gate_dtype = w_gate.dtype if w_gate.dtype in (torch.bfloat16, torch.float32) else torch.bfloat16
    top_k = opts.pop("top_k")
    moe = MoE(H, F2 // 2, E, top_k, score_bias=bias is not None, gate_dtype=gate_dtype, device="meta", **opts)
    grad = bool(opts.get("trainable", False))
    moe.w_gate = torch.nn.Parameter(w_gate.to(gate_dtype), requires_grad=grad)
    moe.w13 = torch.nn.Parameter(w13, requires_grad=grad)
    moe.w2 = torch.nn.Parameter(w2, requires_grad=grad)
    if bias is not None:
        moe.e_score_correction_bias = bias
    if moe.expert_load is not None:  # made on "meta" with the module: a real counter beside the weights
        moe.expert_load = torch.zeros(E, dtype=torch.int64, device=w13.device)
    return moe
