"""GPU tests: the torch custom ops under torch.compile (fullgraph, dynamic shapes, inductor's
CUDA graphs) and under torch.cuda.graph capture + replay on new inputs, the out= variants too.
Same kernels, so the results must equal eager ones bit for bit."""
import pytest

torch = pytest.importorskip("torch")

import moekit  # noqa: E402
import moekit.stages as stages  # noqa: E402
import moekit.torch as mt  # noqa: E402

from gpu_util import capture, randn, small_layer  # noqa: E402

pytestmark = pytest.mark.gpu

H, F, E, K = 1024, 512, 16, 4
ROUTING = dict(top_k=K, renormalize=True)


@pytest.fixture(scope="module")
def layer():
    return small_layer(H, F, E, seed=21)


def moe(w, x):
    return moekit.fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], **ROUTING)


def test_torch_compile_fullgraph_matches_eager(layer):
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: moe(layer, x) * 1.0, fullgraph=True, dynamic=True)
    for T in (1, 7, 64, 300):
        x = randn(T, H, seed=T)
        assert torch.equal(compiled(x), moe(layer, x)), f"T={T}"


def test_torch_compile_module_reduce_overhead():
    """mode="reduce-overhead": inductor records the ops in a CUDA graph (cudagraph trees)."""
    torch._dynamo.reset()
    m = mt.MoE(H, F, E, K, renormalize=True, device="cuda")
    compiled = torch.compile(m, mode="reduce-overhead", fullgraph=True)
    x = randn(2, 50, H, seed=5)
    with torch.inference_mode():
        want = m(x)
        for _ in range(4):  # warm-up runs, then recorded, then replayed
            got = compiled(x).clone()
    assert torch.equal(got, want)


def test_torch_compile_route_and_experts(layer):
    torch._dynamo.reset()

    def two_step(x):
        topk_w, topk_ids = mt.route(x, layer["w_gate"], **ROUTING)
        return moekit.fused_experts(x, layer["w13"], layer["w2"], topk_w, topk_ids)

    x = randn(100, H, seed=8)
    assert torch.equal(torch.compile(two_step, fullgraph=True)(x), moe(layer, x))


def test_out_variant_under_compile_and_graph_capture(layer):
    """fused_moe(out=...) runs moekit::fused_moe_out, an op that declares its write to out: inductor
    functionalizes it, and a captured graph writes the same static buffer on every replay."""
    torch._dynamo.reset()
    T = 40

    def into(x, out):
        moekit.fused_moe(x, layer["w13"], layer["w2"], w_gate=layer["w_gate"], out=out, **ROUTING)
        return out * 1.0

    x = randn(T, H, seed=12)
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = torch.compile(into, fullgraph=True)(x, out)
    assert torch.equal(got, moe(layer, x)) and torch.equal(out, got)
    static_x = randn(T, H, seed=13)
    static_out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    g, _ = capture(lambda: moekit.fused_moe(static_x, layer["w13"], layer["w2"], w_gate=layer["w_gate"],
                                            out=static_out, **ROUTING))
    static_out.fill_(float("nan"))
    static_x.copy_(x)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, moe(layer, x))


@pytest.mark.parametrize("T", [1, 200])
def test_cuda_graph_capture_and_replay_on_new_inputs(layer, T):
    static_x = randn(T, H, seed=0)
    g, static_y = capture(lambda: moe(layer, static_x))
    for seed in range(1, 4):
        x = randn(T, H, seed=seed)
        static_x.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, moe(layer, x)), f"replay {seed}"


def test_cuda_graph_module_experts_and_stages(layer):
    T = 77
    static_x = randn(T, H, seed=1)
    m = mt.MoE(H, F, E, K, renormalize=True, device="cuda")
    g_mod, y_mod = capture(lambda: m(static_x))
    topk_w, topk_ids = mt.route(static_x, layer["w_gate"], **ROUTING)
    g_exp, y_exp = capture(lambda: moekit.fused_experts(static_x, layer["w13"], layer["w2"], topk_w, topk_ids))
    ws = stages.Workspace(T, H, F, E, K)

    def staged():
        stages.align(ws, topk_ids)
        stages.expert_up(ws, static_x, layer["w13"])
        stages.expert_down(ws, layer["w2"], topk_w)
        return stages.combine(ws)

    g_st, y_st = capture(staged)
    x = randn(T, H, seed=2)
    static_x.copy_(x)
    new_w, new_ids = mt.route(x, layer["w_gate"], **ROUTING)
    topk_w.copy_(new_w)
    topk_ids.copy_(new_ids)
    for g in (g_mod, g_exp, g_st):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_mod, m(x))
    want = moekit.fused_experts(x, layer["w13"], layer["w2"], new_w, new_ids)
    assert torch.equal(y_exp, want) and torch.equal(y_st, want)
    assert torch.equal(want, moe(layer, x))


def test_graph_replays_on_a_side_stream_without_touching_the_default_stream(layer):
    """No call syncs or orders against the legacy default stream (a DLPack export without a
    stream would): a capture in cudaStreamCaptureModeGlobal fails on any such call."""
    static_x = randn(16, H, seed=3)
    g = torch.cuda.CUDAGraph()
    moe(layer, static_x)  # warm (plan cache, allocator)
    with torch.cuda.graph(g, capture_error_mode="global"):
        static_y = moe(layer, static_x)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, moe(layer, static_x))
    assert static_y.isfinite().all() and static_y.float().norm() > 0
