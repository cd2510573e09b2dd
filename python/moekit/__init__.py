"""moekit — the kernels of one Mixture-of-Experts layer for NVIDIA Hopper (sm_90a).

Two layers:

* the low-level API of the C++ library (``include/moekit/moe.hpp``), on any DLPack array and an
  explicit CUDA stream: :func:`plan_forward`, :func:`route`, :func:`align`, :func:`expert_up`,
  :func:`expert_down`, :func:`combine` (:func:`combine_partials`), :func:`moe_forward`,
  :func:`experts_forward`, and FP8's :func:`quantize_tokens`, :func:`quantize_weights`; the
  backward (``include/moekit/backward.hpp``): :func:`plan_backward`, :func:`backward_workspace_bytes`,
  :func:`moe_backward`;
* PyTorch (``moekit.torch``, imported on first use): :func:`fused_moe`, :func:`fused_experts`,
  torch custom ops ``torch.ops.moekit.*`` (torch.compile, CUDA graphs) and the ``MoE`` module,
  with gradients (``torch.library.register_autograd``) when an input requires grad;
  FP8 (DeepSeek-V3's format): ``fused_moe(..., use_fp8_w8a8=True, ...)`` and
  :func:`quantize_fp8_weights` (``moekit.fp8``).

``import moekit`` needs neither PyTorch nor a GPU; a call that needs a GPU raises
:class:`moekit.CudaError` (a RuntimeError) without one. Bad arguments raise :class:`moekit.Error`
(a ValueError) naming the argument.
"""
from typing import Any

from ._moekit import (
    FP8_BLOCK,
    MAX_EXPERTS,
    MAX_TOPK,
    BackwardPlan,
    CudaError,
    DeviceInfo,
    Error,
    Plan,
    __version__,
    align,
    backward_workspace_bytes,
    check_status,
    combine,
    combine_partials,
    compiled_gemm_configs,
    device_count,
    expert_down,
    expert_up,
    experts_forward,
    moe_backward,
    moe_forward,
    plan_backward,
    plan_forward,
    quantize_tokens,
    quantize_weights,
    query_device,
    route,
)
from ._requires import require

__all__ = [
    "FP8_BLOCK", "MAX_EXPERTS", "MAX_TOPK", "BackwardPlan", "CudaError", "DeviceInfo", "Error", "Plan", "__version__",
    "align", "backward_workspace_bytes", "check_status", "combine", "combine_partials", "compiled_gemm_configs",
    "device_count", "expert_down", "expert_up", "experts_forward", "moe_backward", "moe_forward", "plan_backward",
    "plan_forward", "quantize_tokens", "quantize_weights", "query_device", "route",
    "fused_moe", "fused_experts", "quantize_fp8_weights",
]

# Shown as moekit.Error / moekit.CudaError in tracebacks.
Error.__module__ = CudaError.__module__ = "moekit"

# The PyTorch layer is imported on first use, so that `import moekit` works without torch.
# NOTES: `import moekit.torch`, not `from . import torch`: the latter's fromlist asks
# hasattr(moekit, "torch") before importing, which calls this __getattr__ again, without end.
_TORCH_NAMES = ("fused_moe", "fused_experts", "quantize_fp8_weights")


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES or name == "torch":
        require(f"moekit.{name}")
        import moekit.torch as _mt

        return _mt if name == "torch" else getattr(_mt, name)
    raise AttributeError(f"module 'moekit' has no attribute '{name}'")
