"""CPU tests of fused_moe / fused_experts with FP8 experts (vLLM's use_fp8_w8a8, w1_scale, w2_scale,
block_shape): argument validation names the argument, the custom ops receive the block scales,
their fake implementations, and torch.compile tracing with no graph break (on fake CUDA tensors)."""
import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import moekit  # noqa: E402
import moekit.torch as mt  # noqa: E402

from test_torch_cpu import OpLog, z  # noqa: E402

# H and F multiples of 16 but not of 128: partial last blocks, ceil(H/128) = ceil(F/128) = 2.
T, H, F, E, K = 5, 160, 144, 8, 2
bf16, f32, i32, e4m3 = torch.bfloat16, torch.float32, torch.int32, torch.float8_e4m3fn
HB, FB = 2, 2


def fp8_layer(**over):
    t = dict(x=z(T, H), w13=z(E, 2 * F, H, dtype=e4m3), w2=z(E, H, F, dtype=e4m3),
             w1_scale=z(E, 2 * FB, HB, dtype=f32), w2_scale=z(E, HB, FB, dtype=f32), logits=z(T, E, dtype=f32))
    t.update(over)
    return t


def call(**over):
    """fused_moe as vLLM calls it with DeepSeek-V3's FP8 experts; `over` replaces an argument."""
    t = fp8_layer(**{k: v for k, v in over.items() if k in ("x", "w13", "w2", "w1_scale", "w2_scale")})
    kw = dict(gating_output=t["logits"], topk=K, use_fp8_w8a8=True, w1_scale=t["w1_scale"],
              w2_scale=t["w2_scale"], block_shape=[128, 128])
    kw.update({k: v for k, v in over.items() if k not in ("x", "w13", "w2", "w1_scale", "w2_scale")})
    return moekit.fused_moe(hidden_states=t["x"], w1=t["w13"], w2=t["w2"], **kw)


@pytest.mark.parametrize("over, match", [
    (lambda: dict(w13=z(E, 2 * F, H)), "argument 'w13': expected dtype float8_e4m3fn, got bfloat16"),
    (lambda: dict(w2=z(E, H, F, dtype=torch.float8_e5m2)),
     "argument 'w2': expected dtype float8_e4m3fn, got float8_e5m2"),
    (lambda: dict(x=z(T, H, dtype=e4m3)), "argument 'x': expected dtype bfloat16, got float8_e4m3fn"),
    (lambda: dict(w1_scale=z(E, 2 * FB, HB)), "argument 'w13_scale': expected dtype float32, got bfloat16"),
    (lambda: dict(w1_scale=z(E, FB, HB, dtype=f32)),
     r"argument 'w13_scale': expected shape \[E, 2\*ceil\(F/128\), ceil\(H/128\)\] = \[8, 4, 2\], got \[8, 2, 2\]"),
    (lambda: dict(w2_scale=z(E, FB, HB + 1, dtype=f32)),
     r"argument 'w2_scale': expected shape \[E, ceil\(H/128\), ceil\(F/128\)\] = \[8, 2, 2\], got \[8, 2, 3\]"),
    (lambda: dict(w2_scale=z(E, HB, FB, dtype=f32, device="cpu")), "argument 'w2_scale': expected a CUDA tensor"),
    (lambda: dict(w2_scale=z(E, FB, HB, dtype=f32).transpose(1, 2)), "argument 'w2_scale': must be contiguous"),
    (lambda: dict(w1_scale=None),
     r"argument 'w13_scale': is required with use_fp8_w8a8=True \(vLLM's name: 'w1_scale'\)"),
    (lambda: dict(w2_scale=None), "argument 'w2_scale': is required with use_fp8_w8a8=True"),
    (lambda: dict(block_shape=None), r"argument 'block_shape': FP8 experts need block_shape=\[128, 128\] .*got None"),
    (lambda: dict(block_shape=[64, 64]), r"argument 'block_shape': .*got \[64, 64\]"),
    (lambda: dict(block_shape=[128]), "argument 'block_shape'"),
    (lambda: dict(block_shape=(128, 128.0)), "argument 'block_shape'"),
    (lambda: dict(block_shape="128x128"), "argument 'block_shape'"),
    (lambda: dict(a1_scale=z(1, dtype=f32)), "argument 'a1_scale': static activation scales are not supported"),
    (lambda: dict(a2_scale=z(1, dtype=f32)), "argument 'a2_scale': static activation scales are not supported"),
    (lambda: dict(use_fp8_w8a8=False), "argument 'w13_scale': is an FP8 argument: pass use_fp8_w8a8=True"),
    (lambda: dict(use_fp8_w8a8=False, w1_scale=None, w2_scale=None, block_shape=None),
     "argument 'w13': is float8_e4m3fn: FP8 experts need use_fp8_w8a8=True"),
    (lambda: dict(x=z(T, 72), w13=z(E, 2 * F, 72, dtype=e4m3), w2=z(E, 72, F, dtype=e4m3),
                  w1_scale=z(E, 2 * FB, 1, dtype=f32), w2_scale=z(E, 1, FB, dtype=f32)),
     "argument 'w13': FP8 needs H and F multiples of 16 .*got H=72, F=144"),
    (lambda: dict(out=z(T, H, dtype=e4m3)), "argument 'out': expected dtype bfloat16, got float8_e4m3fn"),
])
def test_fp8_validation_names_the_argument(over, match):
    with FakeTensorMode():
        kw = over()
        with pytest.raises(moekit.Error, match=match):
            call(**kw)


def test_fp8_python_type_errors():
    with FakeTensorMode():
        t = fp8_layer()
        with pytest.raises(TypeError, match="argument 'use_fp8_w8a8': expected a bool, got int"):
            call(use_fp8_w8a8=1)
        with pytest.raises(TypeError, match="got both 'w13_scale' and 'w1_scale'"):
            call(w13_scale=t["w1_scale"])


def test_bf16_calls_refuse_fp8_arguments():
    with FakeTensorMode():
        x, w13, w2 = z(T, H), z(E, 2 * F, H), z(E, H, F)
        for kw, arg in ((dict(block_shape=[128, 128]), "block_shape"), (dict(a1_scale=z(1, dtype=f32)), "a1_scale"),
                        (dict(w2_scale=z(E, HB, FB, dtype=f32)), "w2_scale")):
            with pytest.raises(moekit.Error, match=f"fused_moe: argument '{arg}': is an FP8 argument"):
                moekit.fused_moe(x, w13, w2, router_logits=z(T, E, dtype=f32), top_k=K, **kw)
        with pytest.raises(moekit.Error, match="fused_experts: argument 'w2': is float8_e4m3fn"):
            moekit.fused_experts(x, w13, z(E, H, F, dtype=e4m3), z(T, K, dtype=f32), z(T, K, dtype=i32))


def test_fp8_calls_reach_the_ops_with_the_scales():
    """moekit's and vLLM's names both reach the layer ops with the block scales as trailing
    arguments (the bf16 calls leave them out, so their op arguments are unchanged)."""
    with FakeTensorMode():
        t = fp8_layer()
        w, ids, out = z(T, K, dtype=f32), z(T, K, dtype=i32), z(T, H)
        fp8 = dict(use_fp8_w8a8=True, w2_scale=t["w2_scale"], block_shape=(128, 128))
        with OpLog() as log:
            y = moekit.fused_moe(hidden_states=t["x"], w1=t["w13"], w2=t["w2"], gating_output=t["logits"], topk=K,
                                 w1_scale=t["w1_scale"], **fp8)
            moekit.fused_moe(t["x"], t["w13"], t["w2"], t["logits"], top_k=K, w13_scale=t["w1_scale"], **fp8)
            assert moekit.fused_moe(t["x"], t["w13"], t["w2"], t["logits"], top_k=K, w13_scale=t["w1_scale"],
                                    out=out, **fp8) is out
            moekit.fused_experts(hidden_states=t["x"], w1=t["w13"], w2=t["w2"], topk_weights=w, topk_ids=ids,
                                 w1_scale=t["w1_scale"], **fp8)
            moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids, w1_scale=t["w1_scale"], out=out, **fp8)
    assert y.shape == (T, H) and y.dtype == bf16
    scales = (t["w1_scale"], t["w2_scale"])
    layer = (t["x"], t["w13"], t["w2"], t["logits"], None, None, K, False, "softmax", 0, 0, 1.0)
    assert log.calls == [
        ("moekit::fused_moe", layer + scales),
        ("moekit::fused_moe", layer + scales),
        ("moekit::fused_moe_out", layer + (out,) + scales),
        ("moekit::fused_experts", (t["x"], t["w13"], t["w2"], w, ids) + scales),
        ("moekit::fused_experts_out", (t["x"], t["w13"], t["w2"], w, ids, out) + scales),
    ]


def test_fp8_fake_implementations_on_meta():
    m = "meta"
    x, w13, w2 = z(T, H, device=m), z(E, 2 * F, H, dtype=e4m3, device=m), z(E, H, F, dtype=e4m3, device=m)
    s13, s2 = z(E, 2 * FB, HB, dtype=f32, device=m), z(E, HB, FB, dtype=f32, device=m)
    y = torch.ops.moekit.fused_moe(x, w13, w2, z(T, E, dtype=f32, device=m), None, None, K, True, "softmax", 0, 0,
                                   1.0, s13, s2)
    assert (y.shape, y.dtype) == ((T, H), bf16)
    y = torch.ops.moekit.fused_experts(x, w13, w2, z(T, K, dtype=f32, device=m), z(T, K, dtype=i32, device=m), s13, s2)
    assert (y.shape, y.dtype) == ((T, H), bf16)
    schema = str(torch.ops.moekit.fused_moe.default._schema)
    assert schema.endswith("Tensor? w13_scale=None, Tensor? w2_scale=None) -> Tensor"), schema


def test_dynamo_traces_fp8_fused_moe_without_graph_break():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True):
        t = fp8_layer()

        def f(x, logits):
            return moekit.fused_moe(x, t["w13"], t["w2"], logits, top_k=K, renormalize=True, use_fp8_w8a8=True,
                                    w1_scale=t["w1_scale"], w2_scale=t["w2_scale"], block_shape=[128, 128]) * 2

        y = torch.compile(f, backend=backend, fullgraph=True)(t["x"], t["logits"])
        assert y.shape == (T, H) and y.dtype == bf16
    assert len(graphs) == 1 and "torch.ops.moekit.fused_moe" in graphs[0].code


def test_quantizer_validates_before_any_launch():
    with FakeTensorMode():
        with pytest.raises(moekit.Error, match="quantize_fp8_weights: argument 'w13': expected dtype bfloat16"):
            mt.quantize_fp8_weights(z(E, 2 * F, H, dtype=f32), z(E, H, F))
        with pytest.raises(moekit.Error, match="argument 'w13': .*odd row count"):
            mt.quantize_fp8_weights(z(E, 2 * F + 1, H), z(E, H, F))
        with pytest.raises(moekit.Error, match=r"argument 'w2': expected shape \[E, H, F\] = \[8, 160, 144\]"):
            mt.quantize_fp8_weights(z(E, 2 * F, H), z(E, F, H))
        with pytest.raises(moekit.Error, match="argument 'w13': FP8 needs H and F multiples of 16"):
            mt.quantize_fp8_weights(z(E, 2 * 40, H), z(E, H, 40))
    with pytest.raises(moekit.Error, match="argument 'w13': expected a CUDA tensor"):
        moekit.quantize_fp8_weights(torch.zeros(E, 2 * F, H, dtype=bf16), torch.zeros(E, H, F, dtype=bf16))
