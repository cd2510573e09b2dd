"""moekit.torch — moekit on PyTorch tensors: custom ops, ``fused_moe``, and the ``MoE`` module.

Each call validates its arguments (a ``moekit.Error``, a ValueError, naming the argument), then
runs a torch custom op (``torch.ops.moekit.*``; ``fused_moe_out``/``fused_experts_out`` when the
caller gives ``out=``). The ops have fake (meta) implementations, so ``torch.compile`` traces
through them with no graph break, and their CUDA work is enqueued on the current torch stream
with no host synchronisation, so they capture in ``torch.cuda.graph``.
The workspace comes from PyTorch's caching allocator (``torch.empty(uint8)``; inside a CUDA
graph, from the graph's private pool).

Tensors cross into C++ as DLPack capsules, zero-copy (moekit._torch_util says why capsules).
The staged API (Workspace, align, expert_up, expert_down, combine(ws)) lives in moekit.stages.

Forward only: no autograd formula is registered (backward is a later stage of moekit).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _moekit as _C
from ._torch_util import (_alias, _check, _check_experts, _check_no_overlap, _check_router, _check_routing, _dl,
                          _fail, _forward_only, _grouped_topk, _plan, _required, _stream, _workspace, plan)
from .hf import ARCH_DEFAULTS, pack_experts, pack_hf_moe, pack_hf_state_dict, routing_from_hf_config
from .stages import Workspace, align, expert_down, expert_up

__all__ = [
    "fused_moe", "fused_experts", "route", "combine", "MoE", "Workspace", "align", "expert_up",
    "expert_down", "plan", "pack_experts", "pack_hf_moe", "pack_hf_state_dict",
    "routing_from_hf_config", "moe_from_hf",
]


# ---- custom ops -----------------------------------------------------------------------------

# Each layer op comes twice: functional (allocates y) and an out-variant (`*_out`, writes the
# caller's y, declared mutated), both on one eager body.

def _fused_moe_into(y: Tensor, x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                    w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int, renormalize: bool,
                    scoring_func: str, num_expert_group: int, topk_group: int, routed_scaling_factor: float):
    T, H = x.shape
    E, F2 = w13.shape[0], w13.shape[1]
    p = _plan(T, H, F2 // 2, E, top_k, x.device.index)
    ws = _workspace(p, x.device)
    _C.moe_forward(p, _dl(x), _dl(w_gate), _dl(router_logits), _dl(score_bias), _dl(w13), _dl(w2),
                   _dl(y), _dl(ws), scoring=scoring_func, renormalize=renormalize,
                   n_group=num_expert_group, topk_group=topk_group,
                   routed_scaling_factor=routed_scaling_factor, stream=_stream(x.device))


@torch.library.custom_op("moekit::fused_moe", mutates_args=())
def _fused_moe_op(x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                  w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int,
                  renormalize: bool, scoring_func: str, num_expert_group: int, topk_group: int,
                  routed_scaling_factor: float) -> Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _fused_moe_into(y, x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
                    num_expert_group, topk_group, routed_scaling_factor)
    return y


@_fused_moe_op.register_fake
def _(x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
      num_expert_group, topk_group, routed_scaling_factor):
    return x.new_empty(x.shape)


@torch.library.custom_op("moekit::fused_moe_out", mutates_args=("y",))
def _fused_moe_out_op(x: Tensor, w13: Tensor, w2: Tensor, router_logits: Optional[Tensor],
                      w_gate: Optional[Tensor], score_bias: Optional[Tensor], top_k: int,
                      renormalize: bool, scoring_func: str, num_expert_group: int, topk_group: int,
                      routed_scaling_factor: float, y: Tensor) -> None:
    _check_no_overlap("fused_moe", "out", y, x=x, w13=w13, w2=w2, router_logits=router_logits, w_gate=w_gate,
                      e_score_correction_bias=score_bias)
    _fused_moe_into(y, x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
                    num_expert_group, topk_group, routed_scaling_factor)


@_fused_moe_out_op.register_fake
def _(x, w13, w2, router_logits, w_gate, score_bias, top_k, renormalize, scoring_func,
      num_expert_group, topk_group, routed_scaling_factor, y):
    return None


def _fused_experts_into(y: Tensor, x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor):
    T, H = x.shape
    E, F2 = w13.shape[0], w13.shape[1]
    p = _plan(T, H, F2 // 2, E, topk_ids.shape[1], x.device.index)
    ws = _workspace(p, x.device)
    _C.experts_forward(p, _dl(x), _dl(w13), _dl(w2), _dl(topk_ids), _dl(topk_weights), _dl(y),
                       _dl(ws), stream=_stream(x.device))


@torch.library.custom_op("moekit::fused_experts", mutates_args=())
def _fused_experts_op(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor,
                      topk_ids: Tensor) -> Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _fused_experts_into(y, x, w13, w2, topk_weights, topk_ids)
    return y


@_fused_experts_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids):
    return x.new_empty(x.shape)


@torch.library.custom_op("moekit::fused_experts_out", mutates_args=("y",))
def _fused_experts_out_op(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                          y: Tensor) -> None:
    _check_no_overlap("fused_experts", "out", y, x=x, w13=w13, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids)
    _fused_experts_into(y, x, w13, w2, topk_weights, topk_ids)


@_fused_experts_out_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids, y):
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


# ---- the public functions -------------------------------------------------------------------

def fused_moe(x: Optional[Tensor] = None, w13: Optional[Tensor] = None, w2: Optional[Tensor] = None,
              router_logits: Optional[Tensor] = None, w_gate: Optional[Tensor] = None, top_k: Optional[int] = None,
              renormalize: bool = False, scoring_func: str = "softmax", num_expert_group: Optional[int] = None,
              topk_group: Optional[int] = None, e_score_correction_bias: Optional[Tensor] = None,
              routed_scaling_factor: float = 1.0, *, out: Optional[Tensor] = None,
              hidden_states: Optional[Tensor] = None, w1: Optional[Tensor] = None,
              gating_output: Optional[Tensor] = None, topk: Optional[int] = None,
              use_grouped_topk: Optional[bool] = None) -> Tensor:
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
    """
    fn = "fused_moe"
    x = _required(fn, "x", _alias(fn, "x", x, "hidden_states", hidden_states), "hidden_states")
    w13 = _required(fn, "w13", _alias(fn, "w13", w13, "w1", w1), "w1")
    w2 = _required(fn, "w2", w2)
    router_logits = _alias(fn, "router_logits", router_logits, "gating_output", gating_output)
    top_k = _alias(fn, "top_k", top_k, "topk", topk)
    num_expert_group, topk_group = _grouped_topk(fn, use_grouped_topk, num_expert_group, topk_group)
    if w_gate is not None and not isinstance(w_gate, torch.Tensor):
        raise TypeError(f"moekit.{fn}: argument 'w_gate': expected a torch.Tensor, got {type(w_gate).__name__} "
                        "(vLLM's positional (gating_output, topk, renormalize): pass top_k= and renormalize= "
                        "by keyword)")
    T, H, F, E = _check_experts(fn, x, w13, w2)
    _check_router(fn, T, H, E, x, router_logits, w_gate, e_score_correction_bias)
    top_k, n_group, t_group = _check_routing(fn, E, top_k, scoring_func, num_expert_group, topk_group,
                                             routed_scaling_factor)
    _forward_only(fn, x=x, w13=w13, w2=w2, router_logits=router_logits, w_gate=w_gate,
                  e_score_correction_bias=e_score_correction_bias)
    args = (x, w13, w2, router_logits, w_gate, e_score_correction_bias, top_k, bool(renormalize), scoring_func,
            n_group, t_group, float(routed_scaling_factor))
    if out is None:
        return torch.ops.moekit.fused_moe(*args)
    _check(fn, "out", out, (torch.bfloat16,), (("T", T), ("H", H)), x.device)
    torch.ops.moekit.fused_moe_out(*args, out)
    return out


def fused_experts(x: Optional[Tensor] = None, w13: Optional[Tensor] = None, w2: Optional[Tensor] = None,
                  topk_weights: Optional[Tensor] = None, topk_ids: Optional[Tensor] = None, *,
                  out: Optional[Tensor] = None, hidden_states: Optional[Tensor] = None,
                  w1: Optional[Tensor] = None) -> Tensor:
    """The experts with the routing given (vLLM's argument order): topk_weights [T, k] float32,
    topk_ids [T, k] int32 in [0, E). An id outside is not checked on the host (that would sync):
    align skips it and flags the workspace (Workspace.check_status in the staged API), and the
    token's output is undefined. `out` and vLLM's names (hidden_states = x, w1 = w13) as in fused_moe."""
    fn = "fused_experts"
    x = _required(fn, "x", _alias(fn, "x", x, "hidden_states", hidden_states), "hidden_states")
    w13 = _required(fn, "w13", _alias(fn, "w13", w13, "w1", w1), "w1")
    T, H, F, E = _check_experts(fn, x, w13, w2)
    _check(fn, "topk_ids", topk_ids, (torch.int32,), (("T", T), ("k", None)), x.device)
    k = topk_ids.shape[1]
    if not 1 <= k <= _C.MAX_TOPK:
        _fail(fn, "topk_ids", f"k must be in [1, {_C.MAX_TOPK}], got {k}")
    _check(fn, "topk_weights", topk_weights, (torch.float32,), (("T", T), ("k", k)), x.device)
    _forward_only(fn, x=x, w13=w13, w2=w2, topk_weights=topk_weights)
    if out is None:
        return torch.ops.moekit.fused_experts(x, w13, w2, topk_weights, topk_ids)
    _check(fn, "out", out, (torch.bfloat16,), (("T", T), ("H", H)), x.device)
    torch.ops.moekit.fused_experts_out(x, w13, w2, topk_weights, topk_ids, out)
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
    load balancing, not by gradients). forward(x [..., H]) -> y [..., H]. Forward only: the
    parameters are created frozen (requires_grad=False).
    """

    def __init__(self, hidden: int, inter: int, experts: int, top_k: int, *, renormalize: bool = False,
                 scoring_func: str = "softmax", num_expert_group: Optional[int] = None,
                 topk_group: Optional[int] = None, score_bias: bool = False,
                 routed_scaling_factor: float = 1.0, gate_dtype: torch.dtype = torch.bfloat16,
                 device=None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        if dtype != torch.bfloat16:
            _fail("MoE", "dtype", f"moekit's experts run in bfloat16, got {dtype}")
        if gate_dtype not in (torch.bfloat16, torch.float32):
            _fail("MoE", "gate_dtype", f"expected bfloat16 or float32, got {gate_dtype}")
        _check_routing("MoE", experts, top_k, scoring_func, num_expert_group, topk_group, routed_scaling_factor)
        self.hidden, self.inter, self.experts, self.top_k = hidden, inter, experts, top_k
        self.renormalize = renormalize
        self.scoring_func = scoring_func
        self.num_expert_group = num_expert_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        frozen = dict(requires_grad=False)  # forward only (see the module's docstring)
        self.w_gate = torch.nn.Parameter(torch.empty(experts, hidden, dtype=gate_dtype, device=device), **frozen)
        self.w13 = torch.nn.Parameter(torch.empty(experts, 2 * inter, hidden, dtype=dtype, device=device), **frozen)
        self.w2 = torch.nn.Parameter(torch.empty(experts, hidden, inter, dtype=dtype, device=device), **frozen)
        if score_bias:
            self.register_buffer("e_score_correction_bias",
                                 torch.zeros(experts, dtype=torch.float32, device=device))
        else:
            self.e_score_correction_bias = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        for p, fan_in in ((self.w_gate, self.hidden), (self.w13, self.hidden), (self.w2, self.inter)):
            if p.device.type != "meta":
                bound = fan_in ** -0.5
                p.uniform_(-bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        y = fused_moe(x.reshape(-1, self.hidden).contiguous(), self.w13, self.w2, w_gate=self.w_gate,
                      top_k=self.top_k, renormalize=self.renormalize, scoring_func=self.scoring_func,
                      num_expert_group=self.num_expert_group, topk_group=self.topk_group,
                      e_score_correction_bias=self.e_score_correction_bias,
                      routed_scaling_factor=self.routed_scaling_factor)
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
        return s

    @classmethod
    def from_hf(cls, layer: torch.nn.Module, config=None, arch: Optional[str] = None, **overrides) -> "MoE":
        """The MoE of a Hugging Face decoder layer (or its MoE block): Mixtral, Qwen3-MoE or
        DeepSeek-V3. See moekit.torch.moe_from_hf."""
        return moe_from_hf(layer, config, arch, **overrides)


def moe_from_hf(layer: torch.nn.Module, config=None, arch: Optional[str] = None, *, device=None, **overrides):
    """A moekit.torch.MoE holding the packed weights of a Hugging Face decoder layer's MoE.

    Routing comes from `config` (the model's HF config) when given, else from
    moekit.hf.ARCH_DEFAULTS for the detected architecture; keyword overrides (top_k=..., ...) win
    over both.
    """
    packed = pack_hf_moe(layer, device=device)
    arch = arch or getattr(config, "model_type", None) or packed["arch"]
    opts = routing_from_hf_config(config, arch) if config is not None else dict(ARCH_DEFAULTS[arch])
    opts.update(overrides)
    w_gate, w13, w2, bias = packed["w_gate"], packed["w13"], packed["w2"], packed["e_score_correction_bias"]
    E, F2, H = w13.shape
    gate_dtype = w_gate.dtype if w_gate.dtype in (torch.bfloat16, torch.float32) else torch.bfloat16
    top_k = opts.pop("top_k")
    moe = MoE(H, F2 // 2, E, top_k, score_bias=bias is not None, gate_dtype=gate_dtype, device="meta", **opts)
    moe.w_gate = torch.nn.Parameter(w_gate.to(gate_dtype), requires_grad=False)
    moe.w13 = torch.nn.Parameter(w13, requires_grad=False)
    moe.w2 = torch.nn.Parameter(w2, requires_grad=False)
    if bias is not None:
        moe.e_score_correction_bias = bias
    return moe
