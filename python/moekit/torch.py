"""moekit.torch — moekit on PyTorch tensors: custom ops, ``fused_moe``, and the ``MoE`` module.

Each call validates its arguments (a ``moekit.Error``, a ValueError, naming the argument), then
runs a torch custom op (``torch.ops.moekit.*``, defined in moekit._ops; ``fused_moe_out``/
``fused_experts_out`` when the caller gives ``out=``). The ops have fake (meta) implementations,
so ``torch.compile`` traces through them with no graph break, and their CUDA work is enqueued on
the current torch stream with no host synchronisation, so they capture in ``torch.cuda.graph``.
The workspace comes from PyTorch's caching allocator (``torch.empty(uint8)``; inside a CUDA
graph, from the graph's private pool).

The functions live in moekit._functional (re-exported here), the module below.
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

from typing import Optional, Union

from ._requires import require

require("moekit.torch")

import torch
from torch import Tensor

from ._functional import combine, fused_experts, fused_moe, route  # the functions (their own file)
from ._torch_util import _check_bool, _check_routing, _fail, plan
from .fp8 import quantize_fp8_weights
from .hf import ARCH_DEFAULTS, pack_experts, pack_hf_moe, pack_hf_state_dict, routing_from_hf_config
from .stages import Workspace, align, expert_down, expert_up, quantize_tokens

__all__ = [
    "fused_moe", "fused_experts", "route", "combine", "MoE", "Workspace", "align", "quantize_tokens", "expert_up",
    "expert_down", "plan", "pack_experts", "pack_hf_moe", "pack_hf_state_dict",
    "routing_from_hf_config", "moe_from_hf", "quantize_fp8_weights",
]


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
