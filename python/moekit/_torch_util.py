"""moekit._torch_util — what moekit.torch and moekit.stages share: DLPack hand-over, the
current stream, cached plans, argument validation that names the argument, and vLLM's argument
names (aliases of moekit's).

Tensors cross into C++ as DLPack capsules (``torch.utils.dlpack.to_dlpack``), zero-copy.
NOTES: not through ``Tensor.__dlpack__()``: called without a stream (as a DLPack consumer such
as nanobind does) it makes the legacy default stream wait on the current one, which breaks CUDA
graph capture, and it refuses tensors that require grad (parameters).
"""
from __future__ import annotations

import atexit
import functools
from typing import Mapping, Optional, Sequence, Union

from ._requires import require

require("moekit._torch_util")

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack as _to_dlpack

from . import _moekit as _C
from .devices import H200, DeviceLike, as_device_info, check_plan, rename_plan_error

_SCORING = ("softmax", "sigmoid")


# ---- plumbing -------------------------------------------------------------------------------

def _dl(t: Optional[Tensor]):
    return None if t is None else _to_dlpack(t)


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


@functools.lru_cache(maxsize=4096)
def _plan(tokens: int, hidden: int, inter: int, experts: int, topk: int, device_index: int,
          precision: str = "bf16") -> _C.Plan:
    return _C.plan_forward(tokens, hidden, inter, experts, topk, device=device_index, precision=precision)


# NOTES: torch's operator registry keeps the custom ops' functions for the life of the process,
# and with them moekit.torch's globals, which name this cache. At exit Python wipes the globals
# of the modules still alive, but not a globals dict whose module is already gone (as under
# `python -m moekit.bench`, where only the import system held moekit): the cache and its Plans
# would outlive the interpreter, and nanobind would report each Plan as leaked. atexit handlers
# run before that teardown: empty the cache there.
atexit.register(_plan.cache_clear)


def _cuda_index(fn: str, device) -> int:
    """The index of a CUDA device (None: the current one); a clear error without a GPU."""
    d = torch.device("cuda") if device is None else torch.device(device)
    if d.type != "cuda":
        _fail(fn, "device", f"expected a CUDA device, got {d}")
    if not torch.cuda.is_available():
        raise _C.CudaError(f"moekit.{fn}: no CUDA GPU is available to PyTorch; moekit's kernels need an "
                           "NVIDIA Hopper GPU (sm_90a). moekit.plan_forward(..., device=moekit.DeviceInfo(...)) "
                           "plans without one")
    return torch.cuda.current_device() if d.index is None else d.index


def plan(tokens: int, hidden: int, inter: int, experts: int, top_k: int,
         device: Union[DeviceLike, torch.device, str] = None,
         precision: str = "bf16") -> _C.Plan:
    """The moekit.Plan of this shape on a CUDA device (None: the current one; a torch.device, an
    index or "cuda:N"), of precision "bf16" or "fp8"; cached. `device` may also describe a GPU
    (a moekit.DeviceInfo or a dict of its fields, e.g. moekit.devices.H200): the plan is then
    made without one."""
    if isinstance(device, (_C.DeviceInfo, Mapping)):
        return _C.plan_forward(tokens, hidden, inter, experts, top_k, device=as_device_info(device, "plan", "device"),
                               precision=precision)
    return _plan(tokens, hidden, inter, experts, top_k, _cuda_index("plan", device), precision)


# The planner's fields -> the arguments of fused_moe / fused_experts that carry them (H is x's
# columns, F and E come from w13; top_k is fused_moe's top_k, fused_experts' topk_ids columns).
_PLAN_NAMES = {"shape.tokens": "x", "shape.hidden": "x", "shape.inter": "w13", "shape.experts": "w13",
               "device": "device_info"}


@functools.lru_cache(maxsize=1)
def _gpu_count() -> int:
    return _C.device_count()


def _check_plan(fn: str, tokens: int, hidden: int, inter: int, experts: int, top_k: int, precision: str,
                device_info: DeviceLike, device: torch.device, topk_arg: str = "top_k") -> Optional[_C.Plan]:
    """The layer's shape against the plan it runs with, before any device call, so that a shape
    the planner refuses raises here naming the argument (not later, inside the op, behind the
    device). The plan: of `device_info` when given (a description: moekit.DeviceInfo or a dict,
    moekit.devices.H200), else of x's GPU (cached: the op reuses it), else, on a machine with no
    GPU (fake tensors, CI), of the H200's description (the shape rules are the same on every
    Hopper). None while torch.compile traces: the op plans when it runs, and a binding call here
    would break the graph."""
    if torch.compiler.is_compiling():
        return None
    names = dict(_PLAN_NAMES, **{"shape.topk": topk_arg})
    if device_info is None and (_gpu_count() == 0 or device.type != "cuda"):
        device_info = H200
    if device_info is not None:
        return check_plan(fn, tokens, hidden, inter, experts, top_k, precision, device_info, names)
    try:
        return _plan(tokens, hidden, inter, experts, top_k, device.index if device.index is not None
                     else torch.cuda.current_device(), precision)
    except _C.Error as e:
        raise rename_plan_error(fn, e, names) from None


def _workspace(p: _C.Plan, device: torch.device) -> Tensor:
    return torch.empty(p.workspace_bytes, dtype=torch.uint8, device=device)


_WORKSPACE_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32, "i64": torch.int64,
                     "e4m3": torch.float8_e4m3fn}


def _workspace_view(buffer: Tensor, entry: tuple) -> Tensor:
    """The tensor of one entry (offset_bytes, dtype, shape) of Plan.workspace_layout() in `buffer`."""
    offset, dtype, shape = entry
    dt = _WORKSPACE_DTYPES[dtype]
    nbytes = dt.itemsize
    for s in shape:
        nbytes *= s
    return buffer[offset:offset + nbytes].view(dt).view(shape)


# ---- validation (at the Python boundary: names the argument) --------------------------------

def _fail(fn: str, arg: str, what: str):
    raise _C.Error(f"moekit.{fn}: argument '{arg}': {what}")


_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.int32: "int32",
                torch.int64: "int64", torch.float8_e4m3fn: "float8_e4m3fn"}


def _check(fn: str, arg: str, t, dtypes: Sequence[torch.dtype], dims: Sequence[tuple],
           device: Optional[torch.device] = None, device_arg: str = "x"):
    """t must be a contiguous CUDA tensor of one of `dtypes` with shape `dims` ((name, size or
    None) per dimension), on `device` when given."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"moekit.{fn}: argument '{arg}': expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(_DTYPE_NAMES.get(d, str(d)) for d in dtypes)
        _fail(fn, arg, f"expected dtype {want}, got {str(t.dtype).replace('torch.', '')}")
    ok = t.dim() == len(dims) and all(s is None or t.shape[i] == s for i, (_, s) in enumerate(dims))
    if not ok:
        names = ", ".join(n for n, _ in dims)
        sizes = ", ".join("?" if s is None else str(s) for _, s in dims)
        _fail(fn, arg, f"expected shape [{names}] = [{sizes}], got {list(t.shape)}")
    if not t.is_contiguous():
        _fail(fn, arg, f"must be contiguous (row-major), got strides {t.stride()} for shape "
                       f"{list(t.shape)}; pass .contiguous()")
    if t.device.type != "cuda":
        _fail(fn, arg, f"expected a CUDA tensor, got one on {t.device}")
    if device is not None and t.device != device:
        _fail(fn, arg, f"is on {t.device} but '{device_arg}' is on {device}")


# How to train, said wherever an input that requires grad is refused.
_HOW_TO_TRAIN = ("to train, moekit.fused_moe and moekit.fused_experts have gradients (bf16 experts, without out=), "
                 "as has moekit.torch.MoE(..., trainable=True)")


def _forward_only(fn: str, **tensors):
    """The entries with no backward (route, combine) refuse inputs that need a gradient rather than
    fail in backward (or, under torch.compile, while AOTAutograd traces the backward graph)."""
    arg = _requires_grad(**tensors)
    if arg is not None:
        _fail(fn, arg, f"requires grad, but moekit.{fn} has no backward: call it under torch.no_grad() / "
                       f"torch.inference_mode(), or pass a detached tensor; {_HOW_TO_TRAIN}")


def _requires_grad(**tensors) -> Optional[str]:
    """The first argument that requires grad while grad is enabled, or None."""
    if torch.is_grad_enabled():
        for arg, t in tensors.items():
            if t is not None and t.requires_grad:
                return arg
    return None


def _trains(fn: str, fp8: bool, out: Optional[Tensor], no_grad: Mapping[str, Optional[Tensor]], **tensors) -> bool:
    """Whether a layer call (fused_moe, fused_experts) takes the training ops (moekit._train): grad is
    enabled and one of `tensors` requires grad. Refused, naming the argument: an input of `no_grad`
    that requires grad (it has no gradient), and training with FP8 experts (the backward is bf16)
    or with out= (a write into a caller's buffer is not differentiable)."""
    for arg, t in no_grad.items():
        if _requires_grad(**{arg: t}):
            _fail(fn, arg, "requires grad, but it only picks the experts and has no gradient (DeepSeek-V3 sets "
                           "the score bias by load balancing): pass it detached (moekit.torch.MoE keeps it as a "
                           "buffer)")
    arg = _requires_grad(**tensors)
    if arg is None:
        return False
    if fp8:
        _fail(fn, arg, "requires grad, but FP8 experts have no backward (moekit's backward is bf16): call it under "
                       f"torch.no_grad() / torch.inference_mode(), or pass a detached tensor; {_HOW_TO_TRAIN}")
    if out is not None:
        _fail(fn, "out", f"is given while '{arg}' requires grad: autograd cannot differentiate a write into out=; "
                         "drop out= to train (y is then a new tensor), or call under torch.no_grad()")
    return True


def _check_routing(fn: str, experts: int, top_k, scoring_func, num_expert_group, topk_group,
                   routed_scaling_factor) -> tuple[int, int, int]:
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"moekit.{fn}: argument 'top_k': expected an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= min(_C.MAX_TOPK, experts):
        _fail(fn, "top_k", f"must be in [1, min({_C.MAX_TOPK}, experts={experts})], got {top_k}")
    if scoring_func not in _SCORING:
        _fail(fn, "scoring_func", f"expected 'softmax' or 'sigmoid', got {scoring_func!r}")
    if (num_expert_group is None) != (topk_group is None):
        _fail(fn, "topk_group" if topk_group is None else "num_expert_group",
              "grouped top-k needs both num_expert_group and topk_group (or neither)")
    n_group = num_expert_group or 0
    t_group = topk_group or 0
    if num_expert_group is not None:
        if not 1 <= n_group <= 32 or experts % n_group != 0:
            _fail(fn, "num_expert_group", f"must divide experts={experts} into at most 32 equal groups, "
                                          f"got {num_expert_group}")
        if not 1 <= t_group <= n_group:
            _fail(fn, "topk_group", f"must be in [1, num_expert_group={n_group}], got {topk_group}")
        if t_group * (experts // n_group) < top_k:
            _fail(fn, "topk_group", f"{t_group} groups of {experts // n_group} experts hold fewer than "
                                    f"top_k={top_k}")
    if not isinstance(routed_scaling_factor, (int, float)) or routed_scaling_factor != routed_scaling_factor:
        _fail(fn, "routed_scaling_factor", f"expected a finite number, got {routed_scaling_factor!r}")
    return top_k, n_group, t_group


def _check_experts(fn: str, x, w13, w2, weight_dtype: torch.dtype = torch.bfloat16) -> tuple[int, int, int, int]:
    """x [T, H] bf16, w13 [E, 2F, H] and w2 [E, H, F] of weight_dtype (bf16, or e4m3 for FP8)."""
    _check(fn, "x", x, (torch.bfloat16,), (("T", None), ("H", None)))
    T, H = x.shape
    _check(fn, "w13", w13, (weight_dtype,), (("E", None), ("2F", None), ("H", H)), x.device)
    E, F2 = w13.shape[0], w13.shape[1]
    if F2 % 2 != 0:
        _fail(fn, "w13", f"expected shape [E, 2F, H] (gate rows then up rows), got an odd row count {F2}")
    _check(fn, "w2", w2, (weight_dtype,), (("E", E), ("H", H), ("F", F2 // 2)), x.device)
    return T, H, F2 // 2, E


def _check_router(fn: str, T: int, H: int, E: int, x, router_logits, w_gate, bias):
    if router_logits is None and w_gate is None:
        _fail(fn, "router_logits", "give router_logits [T, E] (float32) or w_gate [E, H]")
    if router_logits is not None and w_gate is not None:
        _fail(fn, "w_gate", "give router_logits or w_gate, not both")
    if router_logits is not None:
        _check(fn, "router_logits", router_logits, (torch.float32,), (("T", T), ("E", E)), x.device)
    if w_gate is not None:
        _check(fn, "w_gate", w_gate, (torch.bfloat16, torch.float32), (("E", E), ("H", H)), x.device)
    if bias is not None:
        _check(fn, "e_score_correction_bias", bias, (torch.float32,), (("E", E),), x.device)


def _check_bool(fn: str, arg: str, value):
    """A flag (save_h, use_grouped_topk): True or False, not a truthy value of another type."""
    if not isinstance(value, bool):
        raise TypeError(f"moekit.{fn}: argument '{arg}': expected a bool, got {type(value).__name__}")


def _check_expert_load(fn: str, expert_load, experts: int, device: torch.device, device_arg: str = "x"):
    """The opt-in load counter: None, or int64 [E] on the call's device (the C++ entry then checks
    that it shares no memory with the call's other buffers)."""
    if expert_load is not None:
        _check(fn, "expert_load", expert_load, (torch.int64,), (("E", experts),), device, device_arg)


def _check_no_overlap(fn: str, arg: str, out: Tensor, **inputs):
    """out must share no memory with an input: a kernel may write out while another still reads
    the input. Real tensors only (it reads data pointers): called inside the ops' eager bodies."""
    if out.numel() == 0:
        return
    lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
    for name, t in inputs.items():
        if t is not None and t.numel() > 0 and t.device == out.device:
            t_lo = t.data_ptr()
            if t_lo < hi and lo < t_lo + t.numel() * t.element_size():
                _fail(fn, arg, f"overlaps '{name}' in memory; give a separate buffer")


# ---- vLLM's argument names ------------------------------------------------------------------
# fused_moe / fused_experts / route take the names vLLM's fused_moe, fused_experts and FusedMoE
# use, as keyword aliases of moekit's: hidden_states (x), w1 (w13), gating_output
# (router_logits), topk (top_k), use_grouped_topk. The other routing names are the same in both.

def _alias(fn: str, name: str, value, alias: str, alias_value):
    """The argument `name`, given by moekit's name or by vLLM's (`alias`), not by both."""
    if alias_value is None:
        return value
    if value is not None:
        raise TypeError(f"moekit.{fn}: got both '{name}' and '{alias}' (vLLM's name for '{name}'); pass one of them")
    return alias_value


def _required(fn: str, name: str, value, alias: Optional[str] = None):
    if value is None:
        also = f" (vLLM's name: '{alias}')" if alias else ""
        raise TypeError(f"moekit.{fn}: missing argument '{name}'{also}")
    return value


def _grouped_topk(fn: str, use_grouped_topk, num_expert_group, topk_group) -> tuple:
    """vLLM's use_grouped_topk flag, checked against moekit's rule: grouped top-k runs exactly when
    num_expert_group and topk_group are given. Returns (num_expert_group, topk_group).
    NOTES: vLLM ignores the group sizes when the flag is False; here that contradiction is an
    error rather than a silently different routing."""
    if use_grouped_topk is None:
        return num_expert_group, topk_group
    _check_bool(fn, "use_grouped_topk", use_grouped_topk)
    if use_grouped_topk and (num_expert_group is None or topk_group is None):
        _fail(fn, "use_grouped_topk", f"is True but num_expert_group={num_expert_group}, topk_group={topk_group}: "
                                      "grouped top-k needs both")
    if not use_grouped_topk and (num_expert_group is not None or topk_group is not None):
        _fail(fn, "use_grouped_topk", f"is False but num_expert_group={num_expert_group}, topk_group={topk_group} "
                                      "ask for grouped top-k: drop them, or pass use_grouped_topk=True")
    return num_expert_group, topk_group
