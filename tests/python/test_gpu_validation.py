"""GPU tests: bad CUDA inputs raise an exception naming the argument — in the Python layer
(moekit.torch) and in the binding (moekit.Error from C++ moekit::Error)."""
import pytest

torch = pytest.importorskip("torch")

import moekit  # noqa: E402

from gpu_util import randn, small_layer  # noqa: E402

pytestmark = pytest.mark.gpu

H, F, E, K, T = 1024, 512, 16, 4, 10


@pytest.fixture(scope="module")
def w():
    return small_layer(H, F, E)


def test_python_layer_names_the_argument(w):
    x = randn(T, H, seed=0)
    with pytest.raises(moekit.Error, match="argument 'x': must be contiguous"):
        moekit.fused_moe(randn(H, T, seed=0).t(), w["w13"], w["w2"], w_gate=w["w_gate"], top_k=K)
    with pytest.raises(moekit.Error, match="argument 'w2': expected dtype bfloat16, got float16"):
        moekit.fused_moe(x, w["w13"], w["w2"].half(), w_gate=w["w_gate"], top_k=K)
    with pytest.raises(moekit.Error, match="argument 'router_logits': expected a CUDA tensor, got one on cpu"):
        moekit.fused_moe(x, w["w13"], w["w2"], router_logits=torch.zeros(T, E), top_k=K)
    with pytest.raises(moekit.Error, match=r"argument 'w13': expected shape \[E, 2F, H\]"):
        moekit.fused_moe(x, w["w13"][:, :, :512].contiguous(), w["w2"], w_gate=w["w_gate"], top_k=K)


def test_out_is_validated(w):
    """out= (CPU tests cover dtype, shape, strides and device on fake tensors): here, on real memory,
    a buffer that overlaps an input is refused, and a good one is filled and returned."""
    x = randn(T, H, seed=3)
    with pytest.raises(moekit.Error, match="fused_moe: argument 'out': overlaps 'x' in memory"):
        moekit.fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=K, out=x)
    ids = torch.zeros((T, K), dtype=torch.int32, device="cuda")
    wts = torch.ones((T, K), device="cuda")
    with pytest.raises(moekit.Error, match="fused_experts: argument 'out': overlaps 'x' in memory"):
        moekit.fused_experts(x, w["w13"], w["w2"], wts, ids, out=x)
    with pytest.raises(moekit.Error, match="argument 'out': expected dtype bfloat16, got float32"):
        moekit.fused_experts(x, w["w13"], w["w2"], wts, ids, out=torch.empty((T, H), device="cuda"))
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert moekit.fused_experts(x, w["w13"], w["w2"], wts, ids, out=out) is out
    assert out.isfinite().all() and torch.equal(out, moekit.fused_experts(x, w["w13"], w["w2"], wts, ids))


def test_binding_names_the_argument(w):
    """The low-level entries check what reaches C++: device, dtype, strides, sizes; moekit::Error
    from the library arrives as moekit.Error (a ValueError)."""
    p = moekit.plan_forward(T, H, F, E, K)
    ws = torch.empty(p.workspace_bytes, dtype=torch.uint8, device="cuda")
    x = randn(T, H, seed=1)
    y = torch.empty_like(x)
    ids = torch.zeros((T, K), dtype=torch.int32, device="cuda")
    wts = torch.ones((T, K), device="cuda")
    args = [p, x, w["w13"], w["w2"], ids, wts, y, ws]

    def call(i, value):
        a = list(args)
        a[i] = value
        moekit.experts_forward(*a)

    with pytest.raises(moekit.Error, match="experts_forward: argument 'x': must be contiguous"):
        call(1, randn(H, T, seed=0).t())
    with pytest.raises(moekit.Error, match="experts_forward: argument 'x': expected dtype bf16, f32, i32, i64 or e4m3.*float16"):
        call(1, x.half())
    with pytest.raises(ValueError, match=r"moekit::experts_forward: argument 'w2': expected dtype bf16, got f32"):
        call(3, w["w2"].float())
    with pytest.raises(ValueError, match=r"moekit::experts_forward: argument 'topk_ids': expected shape \[10, 4\]"):
        call(4, ids[:5])
    with pytest.raises(moekit.Error, match="argument 'y': expected a CUDA device array, got one on cpu"):
        call(6, y.cpu())
    with pytest.raises(moekit.Error, match="argument 'workspace': has 100 bytes; this plan needs"):
        call(7, ws[:100])
    big = torch.empty(p.workspace_bytes + 256, dtype=torch.uint8, device="cuda")
    with pytest.raises(moekit.Error, match="argument 'workspace': must start on a 256-byte boundary"):
        call(7, big[16:])
    with pytest.raises(moekit.Error, match="route: argument 'scoring': expected 'softmax' or 'sigmoid'"):
        moekit.route(x, w["w_gate"], None, None, ids, wts, scoring="relu")
    with pytest.raises(ValueError, match="moekit::route: argument 'opt.topk_group'"):
        moekit.route(x, w["w_gate"], None, None, ids, wts, n_group=4, topk_group=0)


def test_inputs_that_need_grad(w):
    """The layer trains (y carries a grad_fn; tests/python/test_gpu_train.py checks the gradients); the
    router alone has no backward and refuses, saying how to train; under no_grad both run the
    inference ops."""
    x = randn(T, H, seed=2).requires_grad_()
    assert moekit.fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=K).grad_fn is not None
    with pytest.raises(moekit.Error, match="route: argument 'x': requires grad, but moekit.route has no backward"):
        moekit.torch.route(x, w["w_gate"], top_k=K)
    with torch.no_grad():
        assert moekit.fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=K).grad_fn is None
        assert moekit.torch.route(x, w["w_gate"], top_k=K)[0].shape == (T, K)


def test_load_counter_is_validated_on_real_memory(w):
    """expert_load (dtype, shape and device are CPU tests on fake tensors): a counter laid over a
    buffer of the call is refused by the C++ entry, naming it; an 8-byte aligned view is taken."""
    x = randn(T, H, seed=4)
    over_x = x.view(-1).view(torch.int64)[:E]
    with pytest.raises(moekit.Error, match="moekit::moe_forward: argument 'expert_load': overlaps 'x' in memory"):
        moekit.fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=K, expert_load=over_x)
    p = moekit.plan_forward(T, H, F, E, K)
    ws = torch.empty(p.workspace_bytes, dtype=torch.uint8, device="cuda")
    ids = torch.zeros((T, K), dtype=torch.int32, device="cuda")
    args = [p, x, w["w13"], w["w2"], ids, torch.ones((T, K), device="cuda"), torch.empty_like(x), ws]
    with pytest.raises(moekit.Error, match="moekit::experts_forward: argument 'expert_load': expected dtype i64"):
        moekit.experts_forward(*args, expert_load=torch.zeros(E, dtype=torch.int32, device="cuda"))
    with pytest.raises(moekit.Error, match="argument 'expert_load': overlaps 'workspace' in memory"):
        moekit.experts_forward(*args, expert_load=ws[:8 * E].view(torch.int64))
    load = torch.zeros(E + 1, dtype=torch.int64, device="cuda")[1:]  # 8-byte, not 16-byte, aligned
    moekit.experts_forward(*args, expert_load=load)
    assert load.tolist() == [T * K] + [0] * (E - 1)  # every id was 0
