"""CPU tests of the backward's bindings (python/src/bindings_backward.cpp), needing neither PyTorch nor a
GPU: plan_backward on a described H200 (a pure host function), its options by name and its errors,
the layout bounds the training ops size the kept layout by, and moe_backward's argument checks at
the DLPack boundary (dtype, strides, then the device; the workspace's size; the router's options),
each naming the argument. What the C++ entry checks past the boundary (shapes against the plan,
aliasing) needs a device: tests/python/test_gpu_train.py and tests/gpu/backward_test.cu."""
import pytest

import moekit

from test_import import cuda_capsule, host_array, needs_no_gpu

T, H, F, E, K = 33, 256, 512, 8, 2


@pytest.fixture
def forward(h200):
    return moekit.plan_forward(T, H, F, E, K, device=h200)


@pytest.mark.parametrize("router", ["none", "logits", "gate"])
def test_plan_backward_replays_the_forwards_layout(h200, forward, router):
    b = moekit.plan_backward(forward, device=h200, router=router)
    assert (b.tokens, b.hidden, b.inter, b.experts, b.topk) == (T, H, F, E, K)
    assert (b.block_m, b.max_rows, b.max_blocks) == (forward.block_m, forward.max_rows, forward.max_blocks)
    assert (b.router, b.saved, b.input_grad, b.weight_grads, b.weight_grad_dtype) == (router, "recompute", True, True,
                                                                                      "bf16")
    assert b.workspace_bytes == moekit.backward_workspace_bytes(b) > 0
    assert b.source.startswith("forward:") and b.d in moekit.compiled_gemm_configs()
    assert f"router={router}" in str(b) and str(b) == b.str() and repr(b) == f"moekit.BackwardPlan({b})"
    assert b.gate_splits >= 1 and b.dw_splits >= 1 and b.dx_splits >= 1


def test_plan_backward_options(h200, forward):
    full = moekit.plan_backward(forward, device=h200, router="gate")
    frozen = moekit.plan_backward(forward, device=h200, router="gate", input_grad=False, weight_grads=False)
    assert "grads=none" in str(frozen) and frozen.workspace_bytes < full.workspace_bytes
    master = moekit.plan_backward(forward, device=h200, weight_grad_dtype="f32", accumulate_weight_grads=True)
    assert (master.weight_grad_dtype, master.accumulate_weight_grads) == ("f32", True)
    assert "dw(f32,accumulate)" in str(master)
    kept = moekit.plan_backward(forward, device=h200, saved="h")
    assert kept.saved == "h" and kept.workspace_bytes < full.workspace_bytes  # no h of its own to recompute
    assert moekit.plan_backward(moekit.plan_forward(0, H, F, E, K, device=h200), device=h200).tokens == 0


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(saved="act"), moekit.Error, "plan_backward: argument 'saved': expected 'recompute' or 'h', got 'act'"),
    (dict(router="dx"), moekit.Error, "plan_backward: argument 'router': expected 'none', 'logits' or 'gate', "
                                      "got 'dx'"),
    (dict(weight_grad_dtype="fp16"), moekit.Error, "argument 'weight_grad_dtype': expected 'bf16' or 'f32'"),
    (dict(accumulate_weight_grads=True), moekit.Error,
     "moekit::plan_backward: argument 'options.accumulate_weight_grads': accumulates into f32 weight gradients only"),
    (dict(weight_grads=False, weight_grad_dtype="f32", accumulate_weight_grads=True), moekit.Error,
     "argument 'options.accumulate_weight_grads': accumulates weight gradients, but options.weight_grads is false"),
    (dict(device="cuda"), TypeError, "plan_backward: argument 'device': expected None, a device index or a "
                                     "moekit.DeviceInfo"),
])
def test_plan_backward_errors_name_the_argument(h200, forward, kwargs, error, match):
    kwargs.setdefault("device", h200)
    with pytest.raises(error, match=match):
        moekit.plan_backward(forward, **kwargs)


def test_plan_backward_refuses_fp8_and_non_hopper(h200):
    fp8 = moekit.plan_forward(T, H, F, E, K, device=h200, precision="fp8")
    with pytest.raises(moekit.Error, match="plan_backward: argument 'plan': the backward is bf16 only"):
        moekit.plan_backward(fp8, device=h200)
    with pytest.raises(moekit.Error, match="plan_backward: argument 'device'.*sm_90a"):
        moekit.plan_backward(moekit.plan_forward(T, H, F, E, K, device=h200),
                             device=moekit.DeviceInfo(cc_major=8, cc_minor=0))


@needs_no_gpu
def test_plan_backward_without_a_gpu(forward):
    with pytest.raises(moekit.CudaError, match="plan_backward: no CUDA GPU is available"):
        moekit.plan_backward(forward)


@pytest.mark.parametrize("experts, topk", [(8, 2), (128, 8), (1, 1), (512, 16)])
def test_layout_bounds_hold_for_every_plan(h200, experts, topk):
    """moekit._train returns sorted_ids and block_expert at T·k + (E+1)·(MAX_BLOCK_M − 1) rows and
    ceil(T·k / MIN_BLOCK_M) + E blocks (sizes a fake implementation can compute from a symbolic T): no
    plan's layout may exceed them, whichever block_m it picks."""
    assert moekit._moekit.MIN_BLOCK_M <= moekit._moekit.MAX_BLOCK_M
    seen = set()
    for tokens in (0, 1, 2, 7, 16, 33, 64, 100, 256, 1000, 4096, 16384):
        p = moekit.plan_forward(tokens, 1024, 512, experts, topk, device=h200)
        seen.add(p.block_m)
        tk = tokens * topk
        assert moekit._moekit.MIN_BLOCK_M <= p.block_m <= moekit._moekit.MAX_BLOCK_M
        assert p.max_rows <= tk + (experts + 1) * (moekit._moekit.MAX_BLOCK_M - 1), (tokens, p.block_m)
        assert p.max_blocks <= -(-tk // moekit._moekit.MIN_BLOCK_M) + experts, (tokens, p.block_m)
    assert len(seen) > 1  # the sweep crosses the planner's decode/prefill switch


def backward_arrays(keep, dtype_of=None):
    """moe_backward's positional arrays for plan (T, H, F, E, K) as hand-made CUDA capsules (float32, no
    data: see test_import.cuda_capsule), `dtype_of` {name: host array} replacing some."""
    shapes = dict(x=(T, H), w13=(E, 2 * F, H), w2=(E, H, F), topk_ids=(T, K), topk_weights=(T, K), sorted_ids=(64,),
                  block_expert=(4,), num_rows_padded=(1,), expert_counts=(E,), dy=(T, H))
    arrays = {name: cuda_capsule(0, shape, keep) for name, shape in shapes.items()}
    arrays.update(dtype_of or {})
    return list(arrays.values())


def test_moe_backward_checks_arrays_at_the_boundary(h200, forward):
    np = pytest.importorskip("numpy")
    b = moekit.plan_backward(forward, device=h200)
    keep = []
    ws = cuda_capsule(0, (b.workspace_bytes // 4 + 1,), keep)
    with pytest.raises(moekit.Error, match="moe_backward: argument 'x': expected a CUDA device array, got one on cpu"):
        moekit.moe_backward(b, host_array(), *backward_arrays(keep)[1:], ws)
    with pytest.raises(moekit.Error, match="moe_backward: argument 'dy': expected dtype bf16, f32, i32, i64 or e4m3 "
                                           ".*got float64"):
        moekit.moe_backward(b, *backward_arrays(keep, dict(dy=np.zeros((T, H)))), ws)
    with pytest.raises(moekit.Error, match="moe_backward: argument 'sorted_ids': is required but was None"):
        moekit.moe_backward(b, *backward_arrays(keep, dict(sorted_ids=None)), ws)
    with pytest.raises(moekit.Error, match="moe_backward: argument 'd_topk_weights': must be contiguous"):
        moekit.moe_backward(b, *backward_arrays(keep), ws, d_topk_weights=np.zeros((T, 2 * K), np.float32)[:, ::2])
    with pytest.raises(moekit.Error, match="moe_backward: argument 'w_gate': expected a CUDA device array"):
        moekit.moe_backward(b, *backward_arrays(keep), ws, w_gate=host_array())
    with pytest.raises(moekit.Error, match="moe_backward: argument 'dw13': is on CUDA device 1 but 'x' is on CUDA "
                                           "device 0"):
        moekit.moe_backward(b, *backward_arrays(keep), ws, dw13=cuda_capsule(1, (E, 2 * F, H), keep))
    with pytest.raises(moekit.Error, match="moe_backward: argument 'workspace': has 64 bytes; this plan needs "
                                           f"plan.workspace_bytes = {b.workspace_bytes}"):
        moekit.moe_backward(b, *backward_arrays(keep), cuda_capsule(0, (16,), keep))
    with pytest.raises(moekit.Error, match="moe_backward: argument 'scoring': expected 'softmax' or 'sigmoid'"):
        moekit.moe_backward(b, *backward_arrays(keep), ws, scoring="relu")
    with pytest.raises(TypeError, match="moe_backward: argument 'dy': expected an array with DLPack support"):
        moekit.moe_backward(b, *backward_arrays(keep, dict(dy="dy")), ws)


@needs_no_gpu
def test_moe_backward_without_a_gpu(h200, forward):
    """Arrays that pass the boundary reach the device, which is missing here: a CudaError, not a crash."""
    b = moekit.plan_backward(forward, device=h200)
    keep = []
    with pytest.raises(moekit.CudaError):
        moekit.moe_backward(b, *backward_arrays(keep), cuda_capsule(0, (b.workspace_bytes // 4 + 1,), keep))


# ---- the training forward's h (moe_forward / experts_forward, h=) ----------------------------

def forward_arrays(entry, keep):
    """The positional arrays of moe_forward (router from w_gate), experts_forward or expert_up for plan (T, H,
    F, E, K), as hand-made CUDA capsules, the workspace last (at least any plan's here)."""
    shapes = dict(moe_forward=dict(x=(T, H), w_gate=(E, H), router_logits=None, score_bias=None, w13=(E, 2 * F, H),
                                   w2=(E, H, F), y=(T, H)),
                  experts_forward=dict(x=(T, H), w13=(E, 2 * F, H), w2=(E, H, F), topk_ids=(T, K),
                                       topk_weights=(T, K), y=(T, H)),
                  expert_up=dict(x=(T, H), w13=(E, 2 * F, H)))[entry]
    arrays = [None if shape is None else cuda_capsule(0, shape, keep) for shape in shapes.values()]
    return arrays + [cuda_capsule(0, (1 << 24,), keep)]


@pytest.mark.parametrize("entry", ["moe_forward", "experts_forward", "expert_up"])
def test_forward_h_is_checked_at_the_boundary(h200, forward, entry):
    """h (the training forward's g | u, for moe_backward with saved='h') is an output array like y: checked
    at the boundary in the same order, naming 'h'; with an fp8 plan it is refused before any device call. (Each
    call has fresh capsules: a DLPack capsule is consumed by its first import.)"""
    np = pytest.importorskip("numpy")
    call, keep = getattr(moekit, entry), []
    with pytest.raises(moekit.Error, match=f"{entry}: argument 'h': expected a CUDA device array, got one on cpu"):
        call(forward, *forward_arrays(entry, keep), h=host_array())
    with pytest.raises(moekit.Error, match=f"{entry}: argument 'h': expected dtype bf16, .*got float64"):
        call(forward, *forward_arrays(entry, keep), h=np.zeros((forward.max_rows, 2 * F)))
    with pytest.raises(moekit.Error, match=f"{entry}: argument 'h': must be contiguous"):
        call(forward, *forward_arrays(entry, keep), h=np.zeros((forward.max_rows, 4 * F), np.float32)[:, ::2])
    with pytest.raises(moekit.Error, match=f"{entry}: argument 'h': is on CUDA device 1 but 'x' is on CUDA device 0"):
        call(forward, *forward_arrays(entry, keep), h=cuda_capsule(1, (forward.max_rows, 2 * F), keep))
    fp8 = moekit.plan_forward(T, H, F, E, K, device=h200, precision="fp8")
    with pytest.raises(moekit.Error, match=f"{entry}: argument 'h': is kept for the bf16 backward, but this plan is "
                                           "fp8: pass no h"):
        call(fp8, *forward_arrays(entry, keep), h=cuda_capsule(0, (fp8.max_rows, 2 * F), keep))


@needs_no_gpu
@pytest.mark.parametrize("entry", ["moe_forward", "experts_forward", "expert_up"])
def test_forward_with_h_without_a_gpu(forward, entry):
    """An h that passes the boundary (a bf16 plan) reaches the device, which is missing here: a CudaError.
    The shared Plan is not the one the call ran with (the binding sets save_h on a copy): its text is as it was."""
    keep, before = [], forward.str()
    with pytest.raises(moekit.CudaError):
        getattr(moekit, entry)(forward, *forward_arrays(entry, keep), h=cuda_capsule(0, (forward.max_rows, 2 * F),
                                                                                        keep))
    assert forward.str() == before
