"""CPU tests of the training forward that keeps h (save_h; moekit._train's ops and moekit.torch's
option; need PyTorch, not a GPU): the fakes' h — [rows, 2F] bf16 at the kept layout's bound with
save_h, [0, 2F] without, symbolic under dynamic shapes —, AOTAutograd's graphs of a training step
that keeps h (one forward and one backward graph for every T, the backward handed h), the option's
way from fused_moe, fused_experts and MoE to the op (the inference path ignores it), and its
refusal of a non-bool. The numbers are test_gpu_train_saved_h.py's; the binding's h checks are
test_backward_cpu.py's."""
import re

import pytest

torch = pytest.importorskip("torch")
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.aot_autograd import make_boxed_func  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import moekit.torch as mt  # noqa: E402
from moekit import _train  # noqa: E402

from test_train_cpu import E, F, H, K, ROUTING, T, OpLog, bf16, f32, i32, leaves, spec, z  # noqa: E402

ops = torch.ops.moekit


@pytest.mark.parametrize("save_h", [False, True])
def test_fake_h_has_the_kept_layouts_rows(save_h):
    t = leaves()
    rows = _train._layout_rows(T, K, E)
    want = ((rows if save_h else 0, 2 * F), bf16)
    moe = ops.fused_moe_train(t["x"], t["w13"], t["w2"], None, t["w_gate"], None, K, *ROUTING, save_h)
    exp = ops.fused_experts_train(t["x"], t["w13"], t["w2"], t["topk_weights"], t["topk_ids"], save_h)
    assert len(moe) == 9 and len(exp) == 6
    assert spec(moe[-1]) == want and spec(exp[-1]) == want
    assert spec(moe[4]) == ((rows,), i32)  # h has sorted_ids' rows: row r of h is sorted row r's g | u


def call_args(code: str, op: str) -> list:
    """The arguments of the first call of torch.ops.moekit.<op> in a graph's code (names and literals:
    none of them holds a comma)."""
    m = re.search(rf"torch\.ops\.moekit\.{op}\.default\(([^)]*)\)", code)
    assert m, f"no {op} in:\n{code}"
    return [a.strip() for a in m.group(1).split(",")]


@pytest.mark.parametrize("entry", ["fused_moe", "fused_experts"])
def test_compile_hands_the_kept_h_to_the_backward(entry):
    """torch.compile(fullgraph=True, dynamic=True) of a training step with save_h (on meta tensors, at the
    op level, as test_train_cpu.py's compile test): the forward graph runs the training op with save_h
    True, the backward graph hands moe_backward a tensor for h (argument 12, after the layout), one
    graph each for two T (h's rows are symbolic), and every input's gradient arrives."""
    graphs = {}

    def recorder(kind):
        def compile_graph(gm, example_inputs):
            graphs.setdefault(kind, []).append(gm.code)
            return make_boxed_func(gm.forward)
        return compile_graph

    def step(x, w13, w2, w_gate, topk_weights, topk_ids, probe):
        if entry == "fused_moe":
            y = ops.fused_moe_train(x, w13, w2, None, w_gate, None, K, *ROUTING, True)[0]
        else:
            y = ops.fused_experts_train(x, w13, w2, topk_weights, topk_ids, True)[0]
        return (y.float() * probe).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=aot_autograd(fw_compiler=recorder("fw"), bw_compiler=recorder("bw")),
                             fullgraph=True, dynamic=True)
    for tokens in (T, 2 * T + 1):
        t = leaves(grad=("w13", "w2", "w_gate"))
        x = torch.zeros(tokens, H, dtype=bf16, device="meta", requires_grad=True)
        topk_weights = torch.zeros(tokens, K, dtype=f32, device="meta", requires_grad=True)
        topk_ids = torch.zeros(tokens, K, dtype=i32, device="meta")
        compiled(x, t["w13"], t["w2"], t["w_gate"], topk_weights, topk_ids,
                 torch.zeros(tokens, H, device="meta")).backward()
        assert spec(x.grad) == ((tokens, H), bf16) and spec(t["w13"].grad) == ((E, 2 * F, H), bf16)
        if entry == "fused_moe":
            assert spec(t["w_gate"].grad) == ((E, H), bf16)
        else:
            assert spec(topk_weights.grad) == ((tokens, K), f32)
    assert len(graphs["fw"]) == 1 and len(graphs["bw"]) == 1
    assert call_args(graphs["fw"][0], f"{entry}_train")[-1] == "True"
    assert call_args(graphs["bw"][0], "moe_backward")[12] != "None"


def test_compile_without_save_h_hands_the_backward_no_h():
    graphs = []

    def compile_bw(gm, example_inputs):
        graphs.append(gm.code)
        return make_boxed_func(gm.forward)

    def step(x, w13, w2, w_gate):
        return ops.fused_moe_train(x, w13, w2, None, w_gate, None, K, *ROUTING, False)[0].float().sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                                                        bw_compiler=compile_bw), fullgraph=True, dynamic=True)
    t = leaves(grad=("x", "w13", "w2", "w_gate"))
    compiled(t["x"], t["w13"], t["w2"], t["w_gate"]).backward()
    assert call_args(graphs[0], "moe_backward")[12] == "None"


def test_save_h_reaches_the_training_op_only():
    """save_h of fused_moe, fused_experts and MoE becomes the training op's last argument; the inference
    path, which keeps nothing, ignores it."""
    with FakeTensorMode():
        x = z(T, H)
        kept = mt.MoE(H, F, E, K, device="cuda", trainable=True, save_h=True)
        plain = mt.MoE(H, F, E, K, device="cuda", trainable=True)
        assert "save_h=True" in repr(kept) and "save_h" not in repr(plain)
        w13, w2, w_gate = kept.w13.detach(), kept.w2.detach(), kept.w_gate.detach()
        cases = [
            (lambda: kept(x), torch.enable_grad, ("moekit::fused_moe_train", True)),
            (lambda: plain(x), torch.enable_grad, ("moekit::fused_moe_train", False)),
            (lambda: mt.fused_moe(x.clone().requires_grad_(), w13, w2, w_gate=w_gate, top_k=K, save_h=True),
             torch.enable_grad, ("moekit::fused_moe_train", True)),
            (lambda: mt.fused_experts(x.clone().requires_grad_(), w13, w2, z(T, K, dtype=f32), z(T, K, dtype=i32),
                                      save_h=True), torch.enable_grad, ("moekit::fused_experts_train", True)),
            (lambda: kept(x), torch.no_grad, ("moekit::fused_moe", None)),
            (lambda: mt.fused_experts(x, w13, w2, z(T, K, dtype=f32), z(T, K, dtype=i32), save_h=True),
             torch.inference_mode, ("moekit::fused_experts", None)),
        ]
        for call, mode, (name, save_h) in cases:
            with OpLog() as log, mode():
                call()
            got, args = log.calls[0]
            assert got == name
            if save_h is not None:
                assert args[-1] is save_h, name


def test_save_h_must_be_a_bool():
    with FakeTensorMode():
        x, w13, w2 = z(T, H).requires_grad_(), z(E, 2 * F, H), z(E, H, F)
        with pytest.raises(TypeError, match="moekit.fused_moe: argument 'save_h': expected a bool, got int"):
            mt.fused_moe(x, w13, w2, w_gate=z(E, H), top_k=K, save_h=1)
        with pytest.raises(TypeError, match="moekit.fused_experts: argument 'save_h': expected a bool, got str"):
            mt.fused_experts(x, w13, w2, z(T, K, dtype=f32), z(T, K, dtype=i32), save_h="h")
        with pytest.raises(TypeError, match="moekit.MoE: argument 'save_h': expected a bool, got NoneType"):
            mt.MoE(H, F, E, K, device="cuda", save_h=None)
