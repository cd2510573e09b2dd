"""CPU tests of moekit.torch's training path (moekit._train; need PyTorch, not a GPU): the new ops'
schemas and the inference ops' (unchanged by training), the fake implementations' shapes and dtypes,
the autograd formulas' choice of backward from ctx.needs_input_grad (router, input_grad,
weight_grads) with the gradients' shapes and dtypes, AOTAutograd's forward and backward graphs of a
training step under torch.compile (fullgraph, dynamic shapes), which calls take the training op, and
the refusals, which name the argument.

NOTES: the autograd tests run on meta tensors at the op level: the autograd engine runs a backward of
(fake) CUDA tensors on their device, which needs a GPU; the layer entries' choice of op is checked on
fake CUDA tensors, forward only. The numbers are test_gpu_train.py's."""
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.aot_autograd import make_boxed_func  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import moekit  # noqa: E402
import moekit.torch as mt  # noqa: E402
from moekit import _train  # noqa: E402

from conftest import H200  # noqa: E402

T, H, F, E, K = 5, 64, 32, 8, 2
bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
ops = torch.ops.moekit
ROUTING = (True, "softmax", 0, 0, 1.0)  # renormalize, scoring_func, num_expert_group, topk_group, scaling

# The training ops' schemas, and the inference ops' as they were before training existed (kept: a
# graph or a caller that names them must not change).
SCHEMAS = {
    "fused_moe_train": "moekit::fused_moe_train(Tensor x, Tensor w13, Tensor w2, Tensor? router_logits, Tensor? "
                       "w_gate, Tensor? score_bias, SymInt top_k, bool renormalize, str scoring_func, SymInt "
                       "num_expert_group, SymInt topk_group, float routed_scaling_factor, bool save_h) -> (Tensor, "
                       "Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    "fused_experts_train": "moekit::fused_experts_train(Tensor x, Tensor w13, Tensor w2, Tensor topk_weights, Tensor "
                           "topk_ids, bool save_h) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    "moe_backward": "moekit::moe_backward(Tensor dy, Tensor x, Tensor w13, Tensor w2, Tensor? w_gate, Tensor? "
                    "router_logits, Tensor topk_weights, Tensor topk_ids, Tensor sorted_ids, Tensor block_expert, "
                    "Tensor num_rows_padded, Tensor expert_counts, Tensor? h, Tensor? d_logits_aux, str router, bool "
                    "input_grad, bool weight_grads, bool renormalize, str scoring_func, SymInt num_expert_group, "
                    "SymInt topk_group, float routed_scaling_factor) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
                    "Tensor)",
    "fused_moe": "moekit::fused_moe(Tensor x, Tensor w13, Tensor w2, Tensor? router_logits, Tensor? w_gate, Tensor? "
                 "score_bias, SymInt top_k, bool renormalize, str scoring_func, SymInt num_expert_group, SymInt "
                 "topk_group, float routed_scaling_factor, Tensor? w13_scale=None, Tensor? w2_scale=None) -> Tensor",
    "fused_experts": "moekit::fused_experts(Tensor x, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, "
                     "Tensor? w13_scale=None, Tensor? w2_scale=None) -> Tensor",
    "route": "moekit::route(Tensor? x, Tensor? w_gate, Tensor? router_logits, Tensor? score_bias, SymInt top_k, bool "
             "renormalize, str scoring_func, SymInt num_expert_group, SymInt topk_group, float routed_scaling_factor) "
             "-> (Tensor, Tensor)",
}


def test_schemas():
    assert {name: str(getattr(ops, name).default._schema) for name in SCHEMAS} == SCHEMAS


def leaves(device="meta", grad=(), logits=False):
    """The layer's tensors on `device`, those named in `grad` requiring grad."""
    t = dict(x=torch.zeros(T, H, dtype=bf16, device=device), w13=torch.zeros(E, 2 * F, H, dtype=bf16, device=device),
             w2=torch.zeros(E, H, F, dtype=bf16, device=device), w_gate=torch.zeros(E, H, dtype=bf16, device=device),
             router_logits=torch.zeros(T, E, dtype=f32, device=device),
             topk_weights=torch.zeros(T, K, dtype=f32, device=device), topk_ids=torch.zeros(T, K, dtype=i32,
                                                                                            device=device))
    for name in grad:
        t[name].requires_grad_()
    return t


def spec(t):
    return tuple(t.shape), t.dtype


@pytest.mark.parametrize("logits", [False, True])
def test_fused_moe_train_fake_shapes(logits):
    t = leaves()
    router = (t["router_logits"], None) if logits else (None, t["w_gate"])
    out = ops.fused_moe_train(t["x"], t["w13"], t["w2"], *router, None, K, *ROUTING, False)
    rows, blocks = T * K + (E + 1) * (moekit._moekit.MAX_BLOCK_M - 1), -(-T * K // moekit._moekit.MIN_BLOCK_M) + E
    assert [spec(o) for o in out] == [((T, H), bf16), ((T, K), f32), ((T, K), i32), ((0 if logits else T, E), f32),
                                      ((rows,), i32), ((blocks,), i32), ((1,), i32), ((E,), i32), ((0, 2 * F), bf16)]
    exp = ops.fused_experts_train(t["x"], t["w13"], t["w2"], t["topk_weights"], t["topk_ids"], False)
    assert [spec(o) for o in exp] == [spec(o) for o in out[:1] + out[4:]]


@pytest.mark.parametrize("router, input_grad, weight_grads", [
    ("none", True, True), ("logits", False, True), ("gate", True, False), ("gate", False, False),
])
def test_moe_backward_fake_shapes(router, input_grad, weight_grads):
    t = leaves()
    layout = ops.fused_experts_train(t["x"], t["w13"], t["w2"], t["topk_weights"], t["topk_ids"], False)[1:5]
    w_gate = t["w_gate"].float() if router == "gate" else None  # d_w_gate takes w_gate's dtype
    logits = t["router_logits"] if router != "none" else None
    got = ops.moe_backward(t["x"], t["x"], t["w13"], t["w2"], w_gate, logits, t["topk_weights"], t["topk_ids"], *layout,
                           None, None, router, input_grad, weight_grads, *ROUTING)
    absent = ((0,), f32)
    assert [spec(g) for g in got] == [((T, H), bf16) if input_grad else absent,
                                      ((E, 2 * F, H), bf16) if weight_grads else absent,
                                      ((E, H, F), bf16) if weight_grads else absent, ((T, K), f32),
                                      ((T, E), f32) if router == "logits" else absent,
                                      ((E, H), f32) if router == "gate" else absent]


def test_kept_layout_bounds_every_plan():
    """The sizes of the kept layout (moekit._train's) hold every plan's layout, whichever block_m."""
    for tokens in (0, 1, 3, 16, 100, 1000, 5000):
        for experts, topk in ((8, 2), (64, 6), (256, 8)):
            p = mt.plan(tokens, 1024, 512, experts, topk, device=H200)
            assert p.max_rows <= _train._layout_rows(tokens, topk, experts)
            assert p.max_blocks <= _train._layout_blocks(tokens, topk, experts)


class OpLog(TorchDispatchMode):
    """Records the moekit custom ops called (name and arguments), and in-place adds (the load counter)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "moekit" or func.name() == "aten::add_.Tensor":
            self.calls.append((func.name(), args))
        return func(*args, **(kwargs or {}))

    def names(self):
        return [name for name, _ in self.calls]

    def backward_options(self):
        """(router, input_grad, weight_grads, w_gate given, router_logits given, d_logits_aux given, h given)
        of each moe_backward call."""
        return [(a[14], a[15], a[16], a[4] is not None, a[5] is not None, a[13] is not None, a[12] is not None)
                for name, a in self.calls if name == "moekit::moe_backward"]


# (entry, the inputs that need grad) -> (router, input_grad, weight_grads): with w_gate, x's gradient has
# the router's part (logits = x·w_gateᵀ), so it asks for RouterGrad::gate; frozen experts skip dW.
NEEDS = [
    ("w_gate", ("x",), ("gate", True, False)),
    ("w_gate", ("w13",), ("none", False, True)),
    ("w_gate", ("w_gate",), ("gate", False, False)),
    ("w_gate", ("x", "w13", "w2", "w_gate"), ("gate", True, True)),
    ("router_logits", ("router_logits",), ("logits", False, False)),
    ("router_logits", ("x", "w2"), ("none", True, True)),
    ("experts", ("topk_weights",), ("none", False, False)),
    ("experts", ("x", "w13"), ("none", True, True)),
]


@pytest.mark.parametrize("save_h", [False, True])
@pytest.mark.parametrize("entry, grad, want", NEEDS)
def test_autograd_asks_the_backward_for_what_needs_grad(entry, grad, want, save_h):
    t = leaves(grad=grad)
    with OpLog() as log:
        if entry == "experts":
            y = ops.fused_experts_train(t["x"], t["w13"], t["w2"], t["topk_weights"], t["topk_ids"], save_h)[0]
        else:
            router = (None, t["w_gate"]) if entry == "w_gate" else (t["router_logits"], None)
            y = ops.fused_moe_train(t["x"], t["w13"], t["w2"], *router, None, K, *ROUTING, save_h)[0]
        assert y.requires_grad
        (y.float() * 2).sum().backward()  # dy arrives expanded: the formula makes it contiguous
    router = want[0]
    # The kept h reaches the backward exactly when the forward kept it (save_h).
    assert log.backward_options() == [want + (router == "gate", router != "none", router == "gate", save_h)]
    for name, leaf in t.items():
        if name in grad:
            assert leaf.grad is not None and spec(leaf.grad) == spec(leaf), name
        else:
            assert leaf.grad is None, name


def test_compile_traces_a_training_step():
    """torch.compile(fullgraph=True, dynamic=True): AOTAutograd's forward graph runs the training op, its
    backward graph moe_backward, both with T symbolic (a second T reuses them)."""
    graphs = {}

    def recorder(kind):
        def compile_graph(gm, example_inputs):
            graphs.setdefault(kind, []).append(gm.code)
            return make_boxed_func(gm.forward)
        return compile_graph

    def step(x, w13, w2, w_gate, probe):
        y = ops.fused_moe_train(x, w13, w2, None, w_gate, None, K, *ROUTING, False)[0]
        return (y.float() * probe).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=aot_autograd(fw_compiler=recorder("fw"), bw_compiler=recorder("bw")),
                             fullgraph=True, dynamic=True)
    for tokens in (T, 2 * T + 1):
        t = leaves(grad=("x", "w13", "w2", "w_gate"))
        x = torch.zeros(tokens, H, dtype=bf16, device="meta", requires_grad=True)
        compiled(x, t["w13"], t["w2"], t["w_gate"], torch.zeros(tokens, H, device="meta")).backward()
        assert spec(x.grad) == ((tokens, H), bf16) and spec(t["w_gate"].grad) == ((E, H), bf16)
    assert len(graphs["fw"]) == 1 and len(graphs["bw"]) == 1
    assert "torch.ops.moekit.fused_moe_train.default" in graphs["fw"][0]
    assert "torch.ops.moekit.moe_backward.default" in graphs["bw"][0] and "'gate', True, True" in graphs["bw"][0]


def z(*shape, dtype=bf16, device="cuda"):
    return torch.zeros(*shape, dtype=dtype, device=device)


def test_layer_calls_take_the_training_op_under_grad():
    """fused_moe, fused_experts and MoE run the training op exactly when grad is enabled and an input
    requires grad; the load counter then gains the op's expert_counts (an in-place add)."""
    with FakeTensorMode():
        x = z(T, H)
        trained = mt.MoE(H, F, E, K, device="cuda", trainable=True, track_expert_load=True)
        frozen = mt.MoE(H, F, E, K, device="cuda")
        assert all(p.requires_grad for p in trained.parameters()) and not any(p.requires_grad for p in
                                                                              frozen.parameters())
        with OpLog() as log:
            assert trained(x).requires_grad
        assert log.names() == ["moekit::fused_moe_train", "aten::add_.Tensor"]
        assert log.calls[1][1][0] is trained.expert_load
        cases = [
            (lambda: trained(x), torch.no_grad, "moekit::fused_moe_counted"),
            (lambda: trained(x), torch.inference_mode, "moekit::fused_moe_counted"),
            (lambda: frozen(x), torch.enable_grad, "moekit::fused_moe"),
            (lambda: frozen(x.clone().requires_grad_()), torch.enable_grad, "moekit::fused_moe_train"),
            (lambda: mt.fused_experts(x, frozen.w13, frozen.w2, z(T, K, dtype=f32).requires_grad_(),
                                      z(T, K, dtype=i32)), torch.enable_grad, "moekit::fused_experts_train"),
            (lambda: mt.fused_moe(x, frozen.w13, frozen.w2, router_logits=z(T, E, dtype=f32).requires_grad_(),
                                  top_k=K), torch.enable_grad, "moekit::fused_moe_train"),
        ]
        for call, mode, want in cases:
            with OpLog() as log, mode():
                call()
            assert log.names()[0] == want
        frozen.requires_grad_()  # torch's way: the same module now trains
        with OpLog() as log:
            frozen(x)
        assert log.names() == ["moekit::fused_moe_train"]


def test_training_refusals_name_the_argument():
    with FakeTensorMode():
        x = z(T, H).requires_grad_()
        w13, w2, w_gate = z(E, 2 * F, H), z(E, H, F), z(E, H)
        with pytest.raises(moekit.Error, match="fused_moe: argument 'out': is given while 'x' requires grad: autograd "
                                               "cannot differentiate a write into out=; drop out= to train"):
            mt.fused_moe(x, w13, w2, w_gate=w_gate, top_k=K, out=z(T, H))
        with pytest.raises(moekit.Error, match="fused_experts: argument 'out': is given while 'topk_weights' requires"):
            mt.fused_experts(x.detach(), w13, w2, z(T, K, dtype=f32).requires_grad_(), z(T, K, dtype=i32),
                             out=z(T, H))
        with pytest.raises(moekit.Error, match="fused_moe: argument 'e_score_correction_bias': requires grad, but it "
                                               "only picks the experts and has no gradient"):
            mt.fused_moe(x.detach(), w13, w2, w_gate=w_gate, top_k=K,
                         e_score_correction_bias=z(E, dtype=f32).requires_grad_())
        q13, q2 = z(E, 2 * F, H, dtype=torch.float8_e4m3fn), z(E, H, F, dtype=torch.float8_e4m3fn)
        fp8 = dict(use_fp8_w8a8=True, w1_scale=z(E, 2, 1, dtype=f32), w2_scale=z(E, 1, 1, dtype=f32),
                   block_shape=[128, 128])
        with pytest.raises(moekit.Error, match="fused_moe: argument 'x': requires grad, but FP8 experts have no "
                                               "backward .*to train, moekit.fused_moe"):
            mt.fused_moe(x, q13, q2, w_gate=w_gate, top_k=K, **fp8)
        with torch.no_grad():  # inference: all of these run
            assert mt.fused_moe(x, w13, w2, w_gate=w_gate, top_k=K, out=z(T, H)).shape == (T, H)
            assert mt.fused_moe(x, q13, q2, w_gate=w_gate, top_k=K, **fp8).shape == (T, H)
        m = mt.MoE(H, F, E, K, device="cuda", trainable=True, score_bias=True)  # the bias: a buffer, no grad
        assert m(x).shape == (T, H)


def test_cached_backward_plans_do_not_outlive_the_interpreter():
    """The training ops cache BackwardPlans (nanobind objects): none may be left at exit for nanobind to
    report as leaked. The script then lets go of moekit, its names and its modules, so that only torch's
    operator registry holds the ops' functions (and their globals, which name the cache): the case
    where only the atexit hook of moekit._train empties it (without the hook, nanobind reports them)."""
    script = textwrap.dedent(f"""
        import sys
        from moekit import _moekit as C
        from moekit.torch import fused_moe  # registers the custom ops
        from moekit._train import _backward_plan

        # Plans for an H200 on any machine: what is checked is the cache, not the device.
        h200 = C.DeviceInfo(**{H200!r})
        plan_forward, plan_backward = C.plan_forward, C.plan_backward
        C.plan_forward = lambda *shape, device=None, **kw: plan_forward(*shape, device=h200, **kw)
        C.plan_backward = lambda forward, device=None, **kw: plan_backward(forward, device=h200, **kw)
        for saved in ("recompute", "h"):
            for router in ("none", "logits", "gate"):
                _backward_plan(16, 1024, 512, 16, 4, 0, saved, router, True, True)
        assert _backward_plan.cache_info().currsize == 6
        del C, fused_moe, _backward_plan, h200, plan_forward, plan_backward
        for name in [m for m in sys.modules if m == "moekit" or m.startswith("moekit.")]:
            del sys.modules[name]
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "nanobind: leaked" not in r.stderr, r.stderr
