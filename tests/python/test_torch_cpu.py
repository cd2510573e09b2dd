"""CPU tests of moekit.torch (need PyTorch, not a GPU): argument validation names the argument,
vLLM's argument names, the out= variants, the custom ops' fake implementations, torch.compile
tracing through them with no graph break (on fake CUDA tensors), and no cached Plan left at exit.
The training path's CPU tests are in test_train_cpu.py."""
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses import fake_tensor  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import moekit  # noqa: E402
import moekit.torch as mt  # noqa: E402

from conftest import H200  # noqa: E402

T, H, F, E, K = 5, 64, 32, 8, 2
bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32


D = "cuda"  # fake CUDA tensors (FakeTensorMode): every check but "is it on a GPU" runs on the CPU


def layer(device=D, **over):
    t = dict(x=torch.zeros(T, H, dtype=bf16, device=device),
             w13=torch.zeros(E, 2 * F, H, dtype=bf16, device=device),
             w2=torch.zeros(E, H, F, dtype=bf16, device=device),
             w_gate=torch.zeros(E, H, dtype=bf16, device=device))
    t.update(over)
    return t


def call(device=D, **over):
    t = layer(device, **{k: v for k, v in over.items() if k in ("x", "w13", "w2", "w_gate")})
    kw = dict(top_k=K)
    kw.update({k: v for k, v in over.items() if k not in ("x", "w13", "w2", "w_gate")})
    return moekit.fused_moe(t["x"], t["w13"], t["w2"], w_gate=t["w_gate"], **kw)


def z(*shape, dtype=bf16, device=D):
    return torch.zeros(*shape, dtype=dtype, device=device)


def z_on_cuda1(*shape, dtype=bf16):
    """A fake tensor on cuda:1 on any machine, for the checks that all tensors share x's device.

    NOTES: where CUDA is available, a FakeTensor first initialises a context on its device
    (torch.empty(1, device=...)), which fails where cuda:1 does not exist (one GPU). The checks
    under test read only .device, so there that initialisation is skipped for this tensor; with
    no CUDA (CI) or two GPUs or more, torch's own path runs unchanged."""
    if not torch.cuda.is_available() or torch.cuda.device_count() >= 2:
        return z(*shape, dtype=dtype, device="cuda:1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake_tensor, "init_gpu_context", lambda device: None)
        return z(*shape, dtype=dtype, device="cuda:1")


@pytest.mark.parametrize("over, match", [
    (lambda: dict(x=z(T, H, dtype=f32)), "argument 'x': expected dtype bfloat16, got float32"),
    (lambda: dict(x=z(T, H, 1)), r"argument 'x': expected shape \[T, H\] = \[\?, \?\], got \[5, 64, 1\]"),
    (lambda: dict(w13=z(E, 2 * F, H + 8)), r"argument 'w13': expected shape \[E, 2F, H\] = \[\?, \?, 64\]"),
    (lambda: dict(w13=z(E, 2 * F + 1, H)), "argument 'w13': .*odd row count"),
    (lambda: dict(w13=z(E, 2 * F, H, dtype=torch.float16)), "argument 'w13': expected dtype bfloat16, got float16"),
    (lambda: dict(w2=z(E, H, F + 8)), r"argument 'w2': expected shape \[E, H, F\] = \[8, 64, 32\]"),
    (lambda: dict(w2=z(E, F, H).transpose(1, 2)), "argument 'w2': must be contiguous"),
    (lambda: dict(x=z(H, T).t()), "argument 'x': must be contiguous"),
    (lambda: dict(w_gate=z(E, H, dtype=torch.float16)), "argument 'w_gate': expected dtype bfloat16 or float32"),
    (lambda: dict(w_gate=None), "argument 'router_logits': give router_logits"),
    (lambda: dict(router_logits=z(T, E, dtype=f32)), "argument 'w_gate': give router_logits or w_gate, not both"),
    (lambda: dict(w_gate=None, router_logits=z(T, E)), "argument 'router_logits': expected dtype float32"),
    (lambda: dict(w_gate=None, router_logits=z(T, E, dtype=f32, device="cpu")),
     "argument 'router_logits': expected a CUDA tensor, got one on cpu"),
    (lambda: dict(e_score_correction_bias=z(E + 1, dtype=f32)), "argument 'e_score_correction_bias': expected shape"),
    (lambda: dict(top_k=0), r"argument 'top_k': must be in \[1, min\(16, experts=8\)\]"),
    (lambda: dict(top_k=9), "argument 'top_k'"),
    (lambda: dict(scoring_func="relu"), "argument 'scoring_func': expected 'softmax' or 'sigmoid'"),
    (lambda: dict(num_expert_group=4), "argument 'topk_group': grouped top-k needs both"),
    (lambda: dict(num_expert_group=3, topk_group=1), "argument 'num_expert_group': must divide experts=8"),
    (lambda: dict(num_expert_group=4, topk_group=5), r"argument 'topk_group': must be in \[1, num_expert_group=4\]"),
    (lambda: dict(num_expert_group=8, topk_group=1), "argument 'topk_group': 1 groups of 1 experts hold fewer"),
    (lambda: dict(routed_scaling_factor=float("nan")), "argument 'routed_scaling_factor'"),
    (lambda: dict(use_grouped_topk=True), "argument 'use_grouped_topk': is True but num_expert_group=None"),
    (lambda: dict(use_grouped_topk=False, num_expert_group=4, topk_group=2),
     "argument 'use_grouped_topk': is False but num_expert_group=4, topk_group=2 ask for grouped top-k"),
    (lambda: dict(out=z(T, H, dtype=f32)), "argument 'out': expected dtype bfloat16, got float32"),
    (lambda: dict(out=z(T + 1, H)), r"argument 'out': expected shape \[T, H\] = \[5, 64\], got \[6, 64\]"),
    (lambda: dict(out=z(H, T).t()), "argument 'out': must be contiguous"),
    (lambda: dict(out=z(T, H, device="cpu")), "argument 'out': expected a CUDA tensor, got one on cpu"),
    (lambda: dict(out=z_on_cuda1(T, H)), "argument 'out': is on cuda:1 but 'x' is on cuda:0"),
    (lambda: dict(expert_load=z(E, dtype=i32)), "argument 'expert_load': expected dtype int64, got int32"),
    (lambda: dict(expert_load=z(E, dtype=f32)), "argument 'expert_load': expected dtype int64, got float32"),
    (lambda: dict(expert_load=z(E + 1, dtype=torch.int64)),
     r"argument 'expert_load': expected shape \[E\] = \[8\], got \[9\]"),
    (lambda: dict(expert_load=z(1, E, dtype=torch.int64)), r"argument 'expert_load': expected shape \[E\]"),
    (lambda: dict(expert_load=z(2 * E, dtype=torch.int64)[::2]), "argument 'expert_load': must be contiguous"),
    (lambda: dict(expert_load=z(E, dtype=torch.int64, device="cpu")),
     "argument 'expert_load': expected a CUDA tensor, got one on cpu"),
    (lambda: dict(expert_load=z_on_cuda1(E, dtype=torch.int64)), "argument 'expert_load': is on cuda:1 but 'x'"),
])
def test_fused_moe_validation_names_the_argument(over, match):
    with FakeTensorMode():
        kw = over()
        with pytest.raises(moekit.Error, match=match):
            call(**kw)


def test_cpu_tensor_where_cuda_expected():
    with pytest.raises(moekit.Error, match="fused_moe: argument 'x': expected a CUDA tensor, got one on cpu"):
        call(device="cpu")
    with pytest.raises(moekit.Error, match="argument 'x': expected a CUDA tensor, got one on cpu"):
        mt.MoE(H, F, E, K, device="cpu")(torch.zeros(2, 3, H, dtype=bf16))


def test_wrong_python_types_raise_type_error():
    with FakeTensorMode():
        with pytest.raises(TypeError, match="argument 'top_k': expected an int, got NoneType"):
            call(top_k=None)
        with pytest.raises(TypeError, match="argument 'w13': expected a torch.Tensor, got list"):
            call(w13=[[0.0]])


def test_other_entries_validate():
    with FakeTensorMode():
        t = layer()
        ids, w = z(T, K, dtype=i32), z(T, K, dtype=f32)
        with pytest.raises(moekit.Error, match="fused_experts: argument 'topk_ids': expected dtype int32, got int64"):
            moekit.fused_experts(t["x"], t["w13"], t["w2"], w, z(T, K, dtype=torch.int64))
        with pytest.raises(moekit.Error, match=r"fused_experts: argument 'topk_weights': expected shape \[T, k\] = \[5, 2\]"):
            moekit.fused_experts(t["x"], t["w13"], t["w2"], z(T, K + 1, dtype=f32), ids)
        with pytest.raises(moekit.Error, match="fused_experts: argument 'topk_ids': expected a CUDA tensor, got one on cpu"):
            moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids.cpu())
        with pytest.raises(moekit.Error, match="fused_experts: argument 'w2': is on cuda:1 but 'x' is on cuda:0"):
            moekit.fused_experts(t["x"], t["w13"], z_on_cuda1(E, H, F), w, ids)
        with pytest.raises(moekit.Error, match="route: argument 'w_gate': give router_logits"):
            mt.route(t["x"], top_k=2)
        with pytest.raises(moekit.Error, match="route: argument 'w_gate': give router_logits or x with w_gate"):
            mt.route(w_gate=t["w_gate"], router_logits=z(T, E, dtype=f32), top_k=2)
        with pytest.raises(moekit.Error, match="combine: argument 'y_rows': row count 5 is not a multiple of top_k=2"):
            mt.combine(z(5, H), 2)
        assert moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids).shape == (T, H)
        assert [r.shape for r in mt.route(router_logits=z(T, E, dtype=f32), top_k=3)] == [(T, 3), (T, 3)]


class OpLog(TorchDispatchMode):
    """Records the moekit custom ops called, with their arguments (the calls run on)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "moekit":
            self.calls.append((func.name(), args))
        return func(*args, **(kwargs or {}))


def test_vllm_names_map_to_moekit_arguments():
    """vLLM's names (fused_moe / fused_experts / FusedMoE) reach the op as moekit's arguments."""
    with FakeTensorMode():
        t = layer()
        logits, bias = z(T, E, dtype=f32), z(E, dtype=f32)
        w, ids = z(T, K, dtype=f32), z(T, K, dtype=i32)
        routing = dict(renormalize=True, scoring_func="sigmoid", num_expert_group=4, topk_group=2,
                       e_score_correction_bias=bias, routed_scaling_factor=2.5)
        with OpLog() as log:
            moekit.fused_moe(t["x"], t["w13"], t["w2"], router_logits=logits, top_k=K, **routing)
            moekit.fused_moe(hidden_states=t["x"], w1=t["w13"], w2=t["w2"], gating_output=logits, topk=K,
                             use_grouped_topk=True, **routing)
            moekit.fused_moe(t["x"], t["w13"], t["w2"], logits, topk=K, use_grouped_topk=False)
            moekit.fused_experts(hidden_states=t["x"], w1=t["w13"], w2=t["w2"], topk_weights=w, topk_ids=ids)
            mt.route(hidden_states=t["x"], gating_output=logits, topk=K, use_grouped_topk=True, num_expert_group=2,
                     topk_group=1)
    layer_args = (t["x"], t["w13"], t["w2"], logits)
    assert log.calls == [
        ("moekit::fused_moe", layer_args + (None, bias, K, True, "sigmoid", 4, 2, 2.5)),
        ("moekit::fused_moe", layer_args + (None, bias, K, True, "sigmoid", 4, 2, 2.5)),
        ("moekit::fused_moe", layer_args + (None, None, K, False, "softmax", 0, 0, 1.0)),
        ("moekit::fused_experts", (t["x"], t["w13"], t["w2"], w, ids)),
        ("moekit::route", (None, None, logits, None, K, False, "softmax", 2, 1, 1.0)),
    ]


@pytest.mark.parametrize("entry, name, alias", [
    ("fused_moe", "x", "hidden_states"), ("fused_moe", "w13", "w1"), ("fused_moe", "router_logits", "gating_output"),
    ("fused_moe", "top_k", "topk"), ("fused_experts", "x", "hidden_states"), ("fused_experts", "w13", "w1"),
    ("route", "router_logits", "gating_output"), ("route", "top_k", "topk"),
])
def test_an_argument_and_its_vllm_alias_together_raise_type_error(entry, name, alias):
    with FakeTensorMode():
        t = layer()
        value = {"x": t["x"], "w13": t["w13"], "router_logits": z(T, E, dtype=f32), "top_k": K}[name]
        if entry == "fused_experts":
            kw = dict(x=t["x"], w13=t["w13"], w2=t["w2"], topk_weights=z(T, K, dtype=f32), topk_ids=z(T, K, dtype=i32))
            fn = moekit.fused_experts
        else:
            kw = dict(router_logits=z(T, E, dtype=f32), top_k=K)
            kw.update(dict(x=t["x"], w13=t["w13"], w2=t["w2"]) if entry == "fused_moe" else {})
            fn = moekit.fused_moe if entry == "fused_moe" else mt.route
        kw[name], kw[alias] = value, value
        with pytest.raises(TypeError, match=f"moekit.{entry}: got both '{name}' and '{alias}' .vLLM's name"):
            fn(**kw)


def test_vllm_call_errors_name_the_argument():
    with FakeTensorMode():
        t = layer()
        logits = z(T, E, dtype=f32)
        with pytest.raises(TypeError, match=r"fused_moe: missing argument 'x' \(vLLM's name: 'hidden_states'\)"):
            moekit.fused_moe(w1=t["w13"], w2=t["w2"], gating_output=logits, topk=K)
        with pytest.raises(TypeError, match="fused_experts: missing argument 'w13' .vLLM's name: 'w1'"):
            moekit.fused_experts(t["x"], w2=t["w2"], topk_weights=z(T, K, dtype=f32), topk_ids=z(T, K, dtype=i32))
        with pytest.raises(TypeError, match="fused_moe: missing argument 'w2'"):
            moekit.fused_moe(t["x"], t["w13"], gating_output=logits, topk=K)
        # vLLM's positional order (hidden_states, w1, w2, gating_output, topk, renormalize) differs after
        # the fourth argument: the int lands on w_gate, and the error says what to do.
        with pytest.raises(TypeError, match="argument 'w_gate': expected a torch.Tensor, got int .*pass top_k="):
            moekit.fused_moe(t["x"], t["w13"], t["w2"], logits, K, True)
        with pytest.raises(TypeError, match="argument 'use_grouped_topk': expected a bool, got int"):
            moekit.fused_moe(t["x"], t["w13"], t["w2"], logits, topk=K, use_grouped_topk=1)


def test_out_runs_the_out_variant_and_returns_out():
    with FakeTensorMode():
        t = layer()
        out = z(T, H)
        w, ids = z(T, K, dtype=f32), z(T, K, dtype=i32)
        with OpLog() as log:
            assert moekit.fused_moe(t["x"], t["w13"], t["w2"], w_gate=t["w_gate"], top_k=K, out=out) is out
            assert moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids, out=out) is out
        assert [name for name, _ in log.calls] == ["moekit::fused_moe_out", "moekit::fused_experts_out"]
        assert all(args[-1] is out for _, args in log.calls)
        with pytest.raises(moekit.Error, match=r"fused_experts: argument 'out': expected shape \[T, H\]"):
            moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids, out=z(T, H + 1))


def test_module_parameters_and_errors():
    m = mt.MoE(H, F, E, K, renormalize=True, device="cpu")
    assert dict((n, tuple(p.shape)) for n, p in m.named_parameters()) == {
        "w_gate": (E, H), "w13": (E, 2 * F, H), "w2": (E, H, F)}
    assert m.e_score_correction_bias is None
    assert "top_k=2" in repr(m)
    b = mt.MoE(H, F, E, K, scoring_func="sigmoid", num_expert_group=4, topk_group=2, score_bias=True,
               routed_scaling_factor=2.5, device="meta")
    assert b.e_score_correction_bias.shape == (E,) and "e_score_correction_bias" in dict(b.named_buffers())
    with pytest.raises(moekit.Error, match="MoE: argument 'dtype'"):
        mt.MoE(H, F, E, K, dtype=torch.float16)
    with pytest.raises(moekit.Error, match="MoE: argument 'top_k'"):
        mt.MoE(H, F, E, 0)


@pytest.mark.skipif(moekit.device_count() > 0, reason="checks the behaviour without a GPU")
def test_gpu_entry_points_raise_a_clear_error_without_gpu():
    with pytest.raises(moekit.CudaError, match="no CUDA GPU is available"):
        mt.plan(T, H, F, E, K)
    with pytest.raises(moekit.CudaError, match="no CUDA GPU is available"):
        mt.Workspace(T, H, F, E, K)


@pytest.mark.skipif(moekit.device_count() > 0, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("args", [[], ["--backward"]])
def test_bench_without_gpu_says_so_and_exits_2(args, capsys):
    from moekit import bench
    assert bench.main(args + ["--tokens", "4"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_bench_rejects_bad_arguments_before_the_gpu(capsys):
    from moekit import bench
    for bad in (["--backward", "--tokens", "x"], ["--backward", "--presets", "nope"]):
        with pytest.raises(SystemExit) as e:
            bench.main(bad)
        assert e.value.code == 2
    assert "--presets: unknown preset 'nope'" in capsys.readouterr().err


def test_fake_implementations_on_meta():
    t = layer(device="meta")
    y = torch.ops.moekit.fused_moe(t["x"], t["w13"], t["w2"], None, t["w_gate"], None, K, True, "softmax", 0, 0, 1.0)
    assert y.shape == (T, H) and y.dtype == bf16
    w, ids = torch.ops.moekit.route(t["x"], t["w_gate"], None, None, K, False, "softmax", 0, 0, 1.0)
    assert (w.shape, w.dtype, ids.shape, ids.dtype) == ((T, K), f32, (T, K), i32)
    y = torch.ops.moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids)
    assert y.shape == (T, H)
    assert torch.ops.moekit.combine(torch.empty(T * K, H, dtype=bf16, device="meta"), K).shape == (T, H)
    y = torch.empty(T, H, dtype=bf16, device="meta")
    assert torch.ops.moekit.fused_moe_out(t["x"], t["w13"], t["w2"], None, t["w_gate"], None, K, True, "softmax", 0, 0,
                                          1.0, y) is None
    assert torch.ops.moekit.fused_experts_out(t["x"], t["w13"], t["w2"], w, ids, y) is None
    # The out-variants declare y written (schema `Tensor(a!) y`), the counted ops their load counter
    # (`Tensor(a!) expert_load`, required), so functionalization sees the writes; the others write nothing.
    ops = torch.ops.moekit
    written = {name: [a.name for a in getattr(ops, name).default._schema.arguments
                      if a.alias_info and a.alias_info.is_write]
               for name in ("fused_moe", "fused_moe_out", "fused_experts", "fused_experts_out", "fused_moe_counted",
                            "fused_moe_out_counted", "fused_experts_counted", "fused_experts_out_counted")}
    assert written == {"fused_moe": [], "fused_moe_out": ["y"], "fused_experts": [], "fused_experts_out": ["y"],
                       "fused_moe_counted": ["expert_load"], "fused_moe_out_counted": ["y", "expert_load"],
                       "fused_experts_counted": ["expert_load"], "fused_experts_out_counted": ["y", "expert_load"]}
    load = z(E, dtype=torch.int64, device="meta")
    assert ops.fused_experts_counted(t["x"], t["w13"], t["w2"], w, ids, load).shape == (T, H)
    assert ops.fused_moe_counted(t["x"], t["w13"], t["w2"], None, t["w_gate"], None, K, True, "softmax", 0, 0, 1.0,
                                 load).shape == (T, H)
    assert ops.fused_moe_out_counted(t["x"], t["w13"], t["w2"], None, t["w_gate"], None, K, True, "softmax", 0, 0,
                                     1.0, y, load) is None
    assert ops.fused_experts_out_counted(t["x"], t["w13"], t["w2"], w, ids, y, load) is None


def test_dynamo_traces_fused_moe_and_module_without_graph_break():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, w13, w2, w_gate):
        return moekit.fused_moe(x, w13, w2, w_gate=w_gate, top_k=K, renormalize=True) * 2

    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True):
        t = layer()
        y = torch.compile(f, backend=backend, fullgraph=True)(t["x"], t["w13"], t["w2"], t["w_gate"])
        assert y.shape == (T, H) and y.device.type == "cuda"
        m = mt.MoE(H, F, E, K, device="cuda")
        y = torch.compile(m, backend=backend, fullgraph=True)(torch.empty(2, 3, H, dtype=bf16, device="cuda"))
        assert y.shape == (2, 3, H)
        y = torch.compile(lambda x, out: moekit.fused_moe(x, t["w13"], t["w2"], w_gate=t["w_gate"], top_k=K, out=out),
                          backend=backend, fullgraph=True)(t["x"], z(T, H))
        assert y.shape == (T, H)
    assert len(graphs) == 3
    for gm in graphs[:2]:
        assert "torch.ops.moekit.fused_moe" in gm.code
    assert "torch.ops.moekit.fused_moe_out" in graphs[2].code


def test_entries_without_backward_refuse_inputs_that_need_grad():
    """route and combine have no backward: an input that needs grad is refused, naming it and saying
    how to train (the layer entries train: tests/python/test_train_cpu.py)."""
    with FakeTensorMode():
        t = layer()
        x = t["x"].clone().requires_grad_()
        with pytest.raises(moekit.Error, match="route: argument 'x': requires grad, but moekit.route has no backward: "
                                               r"call it under torch.no_grad\(\).*to train, moekit.fused_moe and "
                                               r"moekit.fused_experts have gradients .*moekit.torch.MoE\(..., "
                                               r"trainable=True\)"):
            mt.route(x, t["w_gate"], top_k=K)
        with pytest.raises(moekit.Error, match="combine: argument 'y_rows': requires grad, but moekit.combine has no "
                                               "backward"):
            mt.combine(z(T * K, H).requires_grad_(), K)
        with torch.no_grad():
            assert mt.route(x, t["w_gate"], top_k=K)[0].shape == (T, K)
        m = mt.MoE(H, F, E, K, device=D)
        assert not any(p.requires_grad for p in m.parameters())  # frozen unless trainable=True
        assert m(z(3, H)).shape == (3, H)


def test_binding_reads_torch_capsules():
    """moekit.torch hands tensors over as DLPack capsules: bf16 is recognised, strides and the
    device are checked in the binding, naming the argument."""
    from torch.utils.dlpack import to_dlpack

    y_rows = torch.zeros(8, H, dtype=bf16)
    with pytest.raises(moekit.Error, match="combine: argument 'y_rows': expected a CUDA device array, got one on cpu"):
        moekit.combine(to_dlpack(y_rows), 2, to_dlpack(torch.zeros(4, H, dtype=bf16)))
    with pytest.raises(moekit.Error, match="combine: argument 'y_rows': must be contiguous"):
        moekit.combine(to_dlpack(torch.zeros(H, 8, dtype=bf16).t()), 2, to_dlpack(torch.zeros(4, H, dtype=bf16)))
    with pytest.raises(moekit.Error, match="argument 'y_rows': expected dtype bf16, f32, i32, i64 or e4m3 .*got float16"):
        moekit.combine(to_dlpack(y_rows.half()), 2, None)
    with pytest.raises(moekit.Error, match="argument 'y_rows': expected a CUDA"):  # requires_grad is no obstacle
        moekit.combine(to_dlpack(torch.zeros(8, H, requires_grad=True)), 2, None)


def test_cached_plans_do_not_outlive_the_interpreter():
    """moekit.torch caches Plans (nanobind objects): none may be left at exit for nanobind to report
    as leaked. The script reaches moekit only through names it imported, as `python -m moekit.bench`
    does (then nothing wipes moekit.torch's globals, which torch's operator registry keeps)."""
    script = textwrap.dedent(f"""
        from moekit import _moekit as C
        from moekit.torch import fused_moe  # registers the custom ops
        from moekit._torch_util import _plan

        # Plans for an H200 on any machine: what is checked is the cache, not the device.
        plan_forward, h200 = C.plan_forward, C.DeviceInfo(**{H200!r})
        C.plan_forward = lambda *shape, device=None, **kw: plan_forward(*shape, device=h200, **kw)
        for tokens in (1, 16, 256):
            _plan(tokens, 1024, 512, 16, 4, 0)
        assert _plan.cache_info().currsize == 3
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "nanobind: leaked" not in r.stderr, r.stderr
