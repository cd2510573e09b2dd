"""CPU tests that need neither PyTorch nor a GPU: import, planning, argument validation through
the DLPack boundary (NumPy arrays, or buffer-protocol arrays from the standard library)."""
import array
import ctypes
import importlib.util
import math
import subprocess
import sys

import pytest

import moekit

needs_no_gpu = pytest.mark.skipif(moekit.device_count() > 0, reason="checks the behaviour without a GPU")


def host_array(n=16, code="f"):
    """A CPU array any DLPack consumer can import: NumPy when installed, else array.array."""
    if importlib.util.find_spec("numpy"):
        import numpy as np

        return np.zeros(n, dtype={"f": np.float32, "i": np.int32, "B": np.uint8}[code])
    return array.array(code, [0] * n)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLManagedTensor(ctypes.Structure):  # DLPack's DLManagedTensor (unversioned)
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_CAPSULE_NAME = b"dltensor"  # must outlive the capsules


def cuda_capsule(device_id: int, shape: tuple, keep: list):
    """A DLPack capsule of a float32 array said to be on CUDA device `device_id`, made by hand: no
    GPU, driver or device memory is involved. The binding reads the device before any data, and
    this array has none (its data pointer is never dereferenced). `keep` holds the structures
    alive for the call."""
    dims = (ctypes.c_int64 * len(shape))(*shape)
    mt = _DLManagedTensor(data=256, device=_DLDevice(2, device_id), ndim=len(shape),  # 2: kDLCUDA
                          dtype=_DLDataType(2, 32, 1), shape=dims)  # 2: kDLFloat
    keep += [dims, mt]
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    return new(ctypes.addressof(mt), _CAPSULE_NAME, None)


def test_import_without_gpu_or_torch():
    assert moekit.__version__.count(".") == 2
    assert moekit.MAX_EXPERTS == 512 and moekit.MAX_TOPK == 16
    assert issubclass(moekit.Error, ValueError)
    assert issubclass(moekit.CudaError, RuntimeError)
    assert moekit.device_count() >= 0
    assert moekit.compiled_gemm_configs()


def test_plan_without_gpu(h200):
    # Rows per expert pick the tile: 16 rows for decode, 128 (wgmma) from a dozen rows per expert
    # on; Mixtral T=256 (64 rows per expert) is past the switch in both the measured table
    # (configs/nvidia-h200.json) and the heuristic.
    for tokens, block_ms in ((1, {16}), (256, {128}), (4096, {128})):
        p = moekit.plan_forward(tokens, 4096, 14336, 8, 2, device=h200)
        block_m = p.block_m
        assert block_m in block_ms, f"T={tokens}: block_m={block_m}, expected one of {sorted(block_ms)}"
        assert (p.tokens, p.hidden, p.inter, p.experts, p.topk) == (tokens, 4096, 14336, 8, 2)
        assert p.max_rows >= tokens * 2 + 8 * (block_m - 1)
        assert p.max_rows % block_m == 0 and p.max_blocks == p.max_rows // block_m
        assert p.workspace_bytes >= p.max_rows * 14336 * 2 + tokens * 2 * 4096 * 2
        assert f"block_m={block_m}" in str(p) and str(p) == p.str()
        assert "moekit.Plan(" in repr(p)


@pytest.mark.parametrize("tokens", [77, 4096])  # 4096 x 8 assignments: the multi-CTA align's scratch too
def test_workspace_layout_is_disjoint_and_aligned(h200, tokens):
    p = moekit.plan_forward(tokens, 2048, 768, 128, 8, device=h200)
    layout = p.workspace_layout()
    assert set(layout) - {"y_partials", "align_scratch"} == {"router_logits", "topk_ids", "topk_weights", "sorted_ids", "block_expert", "num_rows_padded",
                           "expert_counts", "act", "y_rows", "status", "gemm_counter"}
    spans = []
    for name, (offset, dtype, shape) in layout.items():
        assert offset % 256 == 0, name
        n = 1
        for s in shape:
            n *= s
        spans.append((offset, offset + n * (2 if dtype == "bf16" else 4)))
    assert ("y_partials" in layout) == (p.down_splits > 1)
    assert ("align_scratch" in layout) == (tokens * 8 > 4096)
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] <= p.workspace_bytes
    assert layout["act"][1:] == ("bf16", [p.max_rows, 768])
    assert layout["topk_ids"][1:] == ("i32", [tokens, 8])


def test_empty_batch_plans(h200):
    p = moekit.plan_forward(0, 2048, 768, 128, 8, device=h200)
    assert p.tokens == 0 and p.workspace_bytes > 0


@pytest.mark.parametrize("args, arg", [
    ((64, 4095, 14336, 8, 2), "shape.hidden"),
    ((64, 4096, 14330, 8, 2), "shape.inter"),
    ((64, 4096, 14336, 0, 2), "shape.experts"),
    ((64, 4096, 14336, 8, 9), "shape.topk"),
    ((-1, 4096, 14336, 8, 2), "shape.tokens"),
])
def test_plan_errors_name_the_argument(h200, args, arg):
    # moekit::Error from C++ arrives as moekit.Error, a ValueError.
    with pytest.raises(ValueError, match=f"argument '{arg}'"):
        moekit.plan_forward(*args, device=h200)


def test_plan_rejects_non_hopper():
    with pytest.raises(moekit.Error, match="argument 'device'.*sm_90a"):
        moekit.plan_forward(64, 4096, 14336, 8, 2, device=moekit.DeviceInfo(cc_major=8, cc_minor=0))


def test_plan_device_argument_type():
    with pytest.raises(TypeError, match="argument 'device'"):
        moekit.plan_forward(64, 4096, 14336, 8, 2, device="cuda")


@needs_no_gpu
def test_gpu_calls_raise_a_clear_error_without_gpu():
    assert moekit.device_count() == 0
    with pytest.raises(moekit.CudaError, match="no CUDA GPU is available.*Hopper"):
        moekit.plan_forward(64, 4096, 14336, 8, 2)
    with pytest.raises(moekit.CudaError, match="no CUDA GPU is available"):
        moekit.query_device()


def test_host_array_where_cuda_expected_names_the_argument():
    y = host_array(8)
    with pytest.raises(moekit.Error, match="moekit.combine: argument 'y_rows': expected a CUDA device array, "
                                           "got one on cpu"):
        moekit.combine(host_array(16), 2, y)


def test_stage_arguments_are_checked_in_order(h200):
    p = moekit.plan_forward(4, 64, 64, 4, 2, device=h200)
    with pytest.raises(moekit.Error, match="experts_forward: argument 'x': expected a CUDA device array"):
        moekit.experts_forward(p, host_array(), host_array(), host_array(), host_array(code="i"), host_array(),
                               host_array(), host_array(code="B"))
    with pytest.raises(moekit.Error, match="argument 'topk_ids': expected a CUDA"):
        moekit.align(p, host_array(code="i"), host_array(code="B"))
    with pytest.raises(moekit.Error, match="argument 'x': expected a CUDA"):
        moekit.expert_up(p, host_array(), host_array(), host_array(code="B"))
    with pytest.raises(moekit.Error, match="argument 'w2': expected a CUDA"):
        moekit.expert_down(p, host_array(), host_array(), host_array(code="B"))
    with pytest.raises(moekit.Error, match="argument 'workspace': expected a CUDA"):
        moekit.check_status(p, host_array(code="B"))


def test_missing_and_foreign_arguments_name_the_argument(h200):
    p = moekit.plan_forward(4, 64, 64, 4, 2, device=h200)
    with pytest.raises(moekit.Error, match="moe_forward: argument 'x': is required but was None"):
        moekit.moe_forward(p, None, None, None, None, None, None, None, None)
    with pytest.raises(TypeError, match="argument 'x': expected an array with DLPack support.*got str"):
        moekit.expert_up(p, "x", host_array(), host_array(code="B"))
    with pytest.raises(moekit.Error, match="route: argument 'x': give router_logits"):
        moekit.route(None, None, None, None, host_array(code="i"), host_array())
    with pytest.raises(moekit.Error, match="route: argument 'router_logits': expected a CUDA"):
        moekit.route(None, None, host_array(), None, host_array(code="i"), host_array())


def test_torch_names_in_a_fresh_interpreter():
    """moekit.fused_moe imports moekit.torch on first use; in a fresh interpreter (no test module
    imported it before) that first use is what runs."""
    script = "import moekit; moekit.fused_moe; moekit.torch.fused_experts" if importlib.util.find_spec("torch") \
        else "import moekit\ntry:\n    moekit.fused_moe\nexcept ImportError:\n    pass"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_torch_names_need_torch():
    if importlib.util.find_spec("torch") is not None:
        assert callable(moekit.fused_moe)
    else:
        with pytest.raises(ImportError, match="moekit.fused_moe needs PyTorch"):
            moekit.fused_moe
    with pytest.raises(AttributeError):
        moekit.no_such_name


def test_binding_checks_dtype_and_strides_before_the_device():
    """What is wrong with an array itself is reported on any machine, naming the argument."""
    np = pytest.importorskip("numpy")
    y = np.zeros((4, 8), np.float32)
    with pytest.raises(moekit.Error, match=r"combine: argument 'y_rows': expected dtype bf16, f32, i32, i64 or e4m3 .*got float64"):
        moekit.combine(np.zeros((8, 8)), 2, y)
    with pytest.raises(moekit.Error, match=r"combine: argument 'y_rows': must be contiguous \(row-major\): shape "
                                           r"\[8, 8\] has strides \[16, 2\]"):
        moekit.combine(np.zeros((8, 16), np.float32)[:, ::2], 2, y)
    with pytest.raises(moekit.Error, match="argument 'y_rows': expected at most 4 dimensions, got 5"):
        moekit.combine(np.zeros((1, 1, 1, 1, 8), np.float32), 2, y)
    with pytest.raises(moekit.Error, match="check_status: argument 'workspace': expected a 1-D byte buffer"):
        moekit.check_status(moekit.plan_forward(4, 64, 64, 4, 2, device=moekit.DeviceInfo(cc_major=9,
                            smem_per_block_optin=232448)), np.zeros((4, 4), np.uint8))


def test_binding_refuses_arrays_on_two_devices(h200):
    """All arrays of one call must be on one CUDA device: checked where the binding reads the DLPack
    device ids, so on any machine (on hand-made capsules: see cuda_capsule)."""
    keep = []
    with pytest.raises(moekit.Error, match="moekit.combine: argument 'y': is on CUDA device 1 but 'y_rows' is on "
                                           "CUDA device 0"):
        moekit.combine(cuda_capsule(0, (8, 64), keep), 2, cuda_capsule(1, (4, 64), keep))
    p = moekit.plan_forward(4, 64, 64, 4, 2, device=h200)
    x, w13 = cuda_capsule(3, (4, 64), keep), cuda_capsule(2, (4, 128, 64), keep)
    with pytest.raises(moekit.Error, match="expert_up: argument 'w13': is on CUDA device 2 but 'x' is on CUDA device 3"):
        moekit.expert_up(p, x, w13, cuda_capsule(3, (p.workspace_bytes // 4,), keep))


def test_fp8_plans_and_their_workspace(h200):
    """Planning FP8 (DeepSeek-V3's format) needs no GPU: the plan names its precision, its GEMM
    configs are FP8 ones, and its workspace holds the quantized tokens and activations."""
    T, H, F, E, k = 33, 2048, 784, 16, 4  # F = 6·128 + 16: a partial last block
    p = moekit.plan_forward(T, H, F, E, k, device=h200, precision="fp8")
    assert p.precision == "fp8" and moekit.plan_forward(T, H, F, E, k, device=h200).precision == "bf16"
    assert moekit.FP8_BLOCK == 128
    assert p.up in moekit.compiled_gemm_configs("fp8") and p.up not in moekit.compiled_gemm_configs()
    layout = p.workspace_layout()
    assert layout["x_q"][1:] == ("e4m3", [T, H]) and layout["x_scale"][1:] == ("f32", [T, H // 128])
    assert layout["act"][1:] == ("e4m3", [p.max_rows, F]) and layout["act_scale"][1:] == ("f32", [p.max_rows, 7])
    sizes = {"bf16": 2, "f32": 4, "i32": 4, "e4m3": 1}
    spans = sorted((off, off + sizes[dt] * math.prod(shape)) for off, dt, shape in layout.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] <= p.workspace_bytes
    assert not {"x_q", "x_scale", "act_scale"} & set(moekit.plan_forward(T, H, F, E, k, device=h200).workspace_layout())


@pytest.mark.parametrize("args, arg, match", [
    ((8, 2056, 1024, 8, 2), "shape.hidden", "must be a multiple of 16 for fp8"),
    ((8, 2048, 1000, 8, 2), "shape.inter", "must be a multiple of 16 for fp8"),
])
def test_fp8_plan_errors_name_the_argument(h200, args, arg, match):
    with pytest.raises(moekit.Error, match=f"argument '{arg}': {match}"):
        moekit.plan_forward(*args, device=h200, precision="fp8")
    moekit.plan_forward(*args, device=h200)  # bf16 takes the shape


def test_precision_names_are_checked(h200):
    with pytest.raises(moekit.Error, match="plan_forward: argument 'precision': expected 'bf16' or 'fp8', got 'fp16'"):
        moekit.plan_forward(8, 2048, 1024, 8, 2, device=h200, precision="fp16")
    with pytest.raises(moekit.Error, match="compiled_gemm_configs: argument 'precision'"):
        moekit.compiled_gemm_configs("e4m3")


def test_fp8_entries_check_their_arguments_on_any_machine(h200):
    """The FP8 entries convert their arrays at the boundary like the others (quantize_weights: no plan)."""
    np = pytest.importorskip("numpy")
    with pytest.raises(moekit.Error, match="quantize_weights: argument 'w': expected a CUDA device array"):
        moekit.quantize_weights(np.zeros((2, 128, 128), np.float32), None, None)
    p = moekit.plan_forward(4, 64, 64, 4, 2, device=h200, precision="fp8")
    with pytest.raises(moekit.Error, match="quantize_tokens: argument 'x': expected a CUDA device array"):
        moekit.quantize_tokens(p, host_array(), host_array(code="B"))
    keep = []  # x, w13, w2 said to be on CUDA (no data: the scales fail before any launch)
    x, w13, w2 = (cuda_capsule(0, shape, keep) for shape in ((4, 64), (4, 128, 64), (4, 64, 64)))
    with pytest.raises(moekit.Error, match="experts_forward: argument 'w13_scale': expected dtype .*got float64"):
        moekit.experts_forward(p, x, w13, w2, None, None, None, None, w13_scale=np.zeros(4))
    with pytest.raises(moekit.Error, match="expert_down: argument 'w2_scale': must be contiguous"):
        moekit.expert_down(p, cuda_capsule(0, (4, 64, 64), keep), cuda_capsule(0, (4, 2), keep), None,
                           w2_scale=np.zeros((4, 8), np.float32)[:, ::2])
