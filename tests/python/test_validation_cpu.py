"""The Python entries check shapes and dtypes against a plan made from a stated device description,
before any device call: CPU tests, no GPU. The torch-free part (moekit.devices: descriptions, the
plan check and its argument names) runs everywhere; the moekit.torch part needs PyTorch (fake CUDA
tensors: FakeTensorMode) and is skipped, with the reason shown, without it."""
import importlib.util

import pytest

import moekit
from moekit.devices import H200, as_device_info, check_plan

from conftest import H200 as CONFTEST_H200

LAYER_NAMES = {"shape.tokens": "x", "shape.hidden": "x", "shape.inter": "w13", "shape.experts": "w13",
               "shape.topk": "top_k", "device": "device_info"}


def test_h200_description_is_the_tests_one():
    assert H200 == CONFTEST_H200
    info = as_device_info(H200)
    assert (info.name, info.sm_count, info.cc_major, info.smem_per_block_optin) == ("NVIDIA H200", 132, 9, 232448)


@pytest.mark.parametrize("device", [H200, moekit.DeviceInfo(**H200)])
def test_plan_from_a_description_without_gpu(device):
    p = check_plan("fused_moe", 256, 4096, 14336, 8, 2, "bf16", device, LAYER_NAMES)
    assert (p.tokens, p.hidden, p.inter, p.experts, p.topk, p.precision) == (256, 4096, 14336, 8, 2, "bf16")
    assert p.str() == moekit.plan_forward(256, 4096, 14336, 8, 2, device=moekit.DeviceInfo(**H200)).str()


@pytest.mark.parametrize("shape, precision, arg, what", [
    ((64, 4100, 1024, 8, 2), "bf16", "x", "must be a positive multiple of 8"),
    ((64, 4096, 1020, 8, 2), "bf16", "w13", "must be a positive multiple of 8"),
    ((64, 4096, 1024, 513, 2), "bf16", "w13", r"must be in \[1, 512\]"),
    ((64, 4096, 1024, 8, 17), "bf16", "top_k", r"must be in \[1, 16\]"),
    ((64, 4096, 1024, 4, 8), "bf16", "top_k", "exceeds the number of experts"),
    ((-1, 4096, 1024, 8, 2), "bf16", "x", r"must be in \[0, \d+\]"),
    ((64, 4104, 1024, 8, 2), "fp8", "x", "must be a multiple of 16 for fp8"),
    ((64, 4096, 1032, 8, 2), "fp8", "w13", "must be a multiple of 16 for fp8"),
])
def test_plan_errors_name_the_callers_argument(shape, precision, arg, what):
    field = {"x": "shape.(hidden|tokens)", "w13": "shape.(inter|experts)", "top_k": "shape.topk"}[arg]
    with pytest.raises(moekit.Error, match=rf"^moekit.fused_moe: argument '{arg}': .*{what}.*\(the plan's {field}\)"):
        check_plan("fused_moe", *shape, precision, H200, LAYER_NAMES)


def test_non_hopper_description_names_device_info():
    with pytest.raises(moekit.Error, match="fused_moe: argument 'device_info': .*sm_90a"):
        check_plan("fused_moe", 64, 4096, 1024, 8, 2, "bf16", dict(H200, cc_major=8), LAYER_NAMES)


@pytest.mark.parametrize("device, error, match", [
    (dict(H200, sms=132), moekit.Error, "argument 'device_info': unknown field.*'sms'"),
    (dict(H200, sm_count="many"), TypeError, "argument 'device_info'"),
    ("H200", TypeError, "argument 'device_info': expected a moekit.DeviceInfo, a dict .*got str"),
    (True, TypeError, "argument 'device_info': .*got bool"),
])
def test_bad_descriptions_name_the_argument(device, error, match):
    with pytest.raises(error, match=match):
        as_device_info(device, "fused_moe")


# ---- moekit.torch: the same checks at fused_moe / fused_experts, on fake CUDA tensors ---------

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="moekit.torch's checks need PyTorch (the torch-free "
                                                       "checks above run without it)")
T, K = 5, 2


def fake_layer(H=64, F=32, E=8, dtype=None):
    import torch

    wt = dtype or torch.bfloat16
    return dict(x=torch.zeros(T, H, dtype=torch.bfloat16, device="cuda"),
                w13=torch.zeros(E, 2 * F, H, dtype=wt, device="cuda"),
                w2=torch.zeros(E, H, F, dtype=wt, device="cuda"),
                router_logits=torch.zeros(T, E, dtype=torch.float32, device="cuda"))


@needs_torch
@pytest.mark.parametrize("layer, kw, arg, match", [
    (dict(H=100), {}, "x", r"shape.hidden.*multiple of 8|multiple of 8.*shape.hidden"),
    (dict(F=36), {}, "w13", "multiple of 8"),
    (dict(E=520), dict(top_k=2), "w13", r"must be in \[1, 512\]"),
    ({}, dict(device_info=dict(H200, cc_major=8)), "device_info", "sm_90a"),
    ({}, dict(device_info="H200"), "device_info", "expected a moekit.DeviceInfo"),
])
def test_fused_moe_checks_the_plan_before_the_device(layer, kw, arg, match):
    from torch._subclasses.fake_tensor import FakeTensorMode

    import moekit.torch as mt

    with FakeTensorMode():
        t = fake_layer(**layer)
        kw = dict(dict(top_k=K), **kw)
        with pytest.raises((moekit.Error, TypeError), match=rf"fused_moe: argument '{arg}': .*{match}"):
            mt.fused_moe(t["x"], t["w13"], t["w2"], router_logits=t["router_logits"], **kw)


@needs_torch
def test_fused_experts_names_topk_ids_for_the_plans_k():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import moekit.torch as mt

    with FakeTensorMode():
        t = fake_layer(E=4)
        ids = torch.zeros(T, 8, dtype=torch.int32, device="cuda")  # k = 8 > E = 4: only the plan knows
        w = torch.zeros(T, 8, dtype=torch.float32, device="cuda")
        with pytest.raises(moekit.Error, match="fused_experts: argument 'topk_ids': .*exceeds the number of experts"):
            mt.fused_experts(t["x"], t["w13"], t["w2"], w, ids, device_info=H200)
        assert mt.fused_experts(t["x"], t["w13"], t["w2"], w[:, :2].contiguous(), ids[:, :2].contiguous(),
                                device_info=H200).shape == (T, 64)


@needs_torch
def test_torch_plan_takes_a_description():
    import moekit.torch as mt

    assert mt.plan(16, 2048, 768, 128, 8, device=H200).str() == \
        moekit.plan_forward(16, 2048, 768, 128, 8, device=moekit.DeviceInfo(**H200)).str()
    assert mt.plan(16, 2048, 768, 128, 8, device=H200, precision="fp8").precision == "fp8"
