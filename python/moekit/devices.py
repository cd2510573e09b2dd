"""moekit.devices — device descriptions for planning without a GPU, and the shape check against a
plan that moekit.torch's entries run before any device call (torch-free: CI tests it on a CPU).

A device is given as a moekit.DeviceInfo, a dict of its fields (``H200`` below: what
moekit.query_device() reads on the H200 of the runs of record), the index of a visible GPU, or
None (the current GPU). The config chooser uses the description as it would the queried device,
so a plan made from a description is the plan the kernels would run on that GPU.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional, Union

from . import _moekit as _C

__all__ = ["H200", "DeviceLike", "as_device_info", "check_plan", "rename_plan_error"]

# moekit.query_device() on the H200 of docs/perf/latest (capability 9.0, 132 SMs, 227 KiB of
# opt-in shared memory per block, 60 MiB of L2).
H200: dict = dict(name="NVIDIA H200", sm_count=132, cc_major=9, cc_minor=0, smem_per_block_optin=232448,
                  l2_bytes=60 * 1024 * 1024)

DeviceLike = Union[_C.DeviceInfo, Mapping[str, object], int, None]

_FIELDS = ("name", "sm_count", "cc_major", "cc_minor", "smem_per_block_optin", "l2_bytes")


def as_device_info(device: DeviceLike, fn: str = "plan", arg: str = "device_info") -> Optional[_C.DeviceInfo]:
    """A DeviceInfo from a description (DeviceInfo or dict of its fields); None for an index or
    None (a real GPU, queried by the planner). Raises moekit.Error / TypeError naming `arg`."""
    if device is None or isinstance(device, _C.DeviceInfo):
        return device
    if isinstance(device, bool):
        raise TypeError(f"moekit.{fn}: argument '{arg}': expected a moekit.DeviceInfo, a dict of its fields, a "
                        "device index or None, got bool")
    if isinstance(device, int):
        return None
    if isinstance(device, Mapping):
        unknown = sorted(set(device) - set(_FIELDS))
        if unknown:
            raise _C.Error(f"moekit.{fn}: argument '{arg}': unknown field(s) {', '.join(map(repr, unknown))}; "
                           f"a device description has {', '.join(_FIELDS)}")
        try:
            return _C.DeviceInfo(**device)
        except TypeError as e:
            raise TypeError(f"moekit.{fn}: argument '{arg}': {e}") from None
    raise TypeError(f"moekit.{fn}: argument '{arg}': expected a moekit.DeviceInfo, a dict of its fields, a device "
                    f"index or None, got {type(device).__name__}")


_PLAN_ERROR = re.compile(r"argument '([^']+)': (.*)", re.S)


def check_plan(fn: str, tokens: int, hidden: int, inter: int, experts: int, top_k: int, precision: str,
               device: DeviceLike, names: Mapping[str, str]) -> _C.Plan:
    """The plan of this shape on `device`, made before anything touches a GPU (a description plans
    on any machine). A shape the planner refuses raises moekit.Error naming the caller's argument:
    `names` maps the planner's field (shape.hidden, shape.inter, shape.experts, shape.topk,
    shape.tokens, device) to it, e.g. {"shape.hidden": "x"}; the planner's field is kept in the
    message."""
    info = as_device_info(device, fn, names.get("device", "device_info"))
    try:
        return _C.plan_forward(tokens, hidden, inter, experts, top_k,
                               device=info if info is not None else device, precision=precision)
    except _C.Error as e:
        raise rename_plan_error(fn, e, names) from None


def rename_plan_error(fn: str, e: Exception, names: Mapping[str, str]) -> Exception:
    """The planner's moekit.Error `e` as `fn`'s, naming the caller's argument (see check_plan);
    `e` itself when it names a field `names` does not map."""
    m = _PLAN_ERROR.search(str(e))
    if m is None or m.group(1) not in names:
        return e
    field, what = m.groups()
    return _C.Error(f"moekit.{fn}: argument '{names[field]}': {what} (the plan's {field})")
