"""GPU tests of the FP8 path (DeepSeek-V3's format) from Python: fused_moe / fused_experts with
use_fp8_w8a8=True against the PyTorch FP32 reference, the staged API, CUDA-graph capture and
replay, torch.compile, and the GPU quantizer bit for bit against moekit.fp8's CPU reference.
Skipped without a Hopper GPU (see conftest.py).

The bound: calc_diff(y, reference) = 1 − 2·Σxy / (Σx² + Σy²) < 5e-3 (≈ ε²/2 for a relative norm
error ε), the one tests/gpu/fp8_forward_test.cu derives for the whole layer: four e4m3 roundings
(x, w13, act, w2), each of relative RMS 0.0265, give calc_diff ≈ 1.7e-3 against the unquantized
bf16 layer. Against the reference on the dequantized weights only x's and act's roundings remain,
so the same bound holds with room to spare; a wrong expert, row or scale block is O(1)."""
import pytest

torch = pytest.importorskip("torch")

import moekit  # noqa: E402
import moekit.stages as stages  # noqa: E402
import moekit.torch as mt  # noqa: E402
from moekit.fp8 import dequantize_fp8_weights, quantize_fp8_weights_reference, quantize_weight_blocks_reference  # noqa: E402
from moekit.reference import experts_reference  # noqa: E402

from gpu_util import poison_, poisoned, randn, small_layer  # noqa: E402
from test_gpu_graph_compile import capture  # noqa: E402

pytestmark = pytest.mark.gpu

LAYER_CALC_DIFF = 5e-3
K = 4
FP8 = dict(use_fp8_w8a8=True, block_shape=[128, 128])


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 4: torch.int32}[t.element_size()]).cpu()


# (H, F, E): blocks whole, and partial in both H (2064 = 16·128 + 16) and F (784 = 6·128 + 16).
@pytest.fixture(scope="module", params=[(1024, 512, 16), (2064, 784, 8)], ids=["whole-blocks", "partial-blocks"])
def layer(request):
    H, F, E = request.param
    w = small_layer(H, F, E, seed=41)
    w13_q, w13_s, w2_q, w2_s = moekit.quantize_fp8_weights(w["w13"], w["w2"])
    w.update(H=H, F=F, E=E, w13_q=w13_q, w13_s=w13_s, w2_q=w2_q, w2_s=w2_s)
    return w


def fp8_moe(w, x, logits, **kw):
    return moekit.fused_moe(x, w["w13_q"], w["w2_q"], router_logits=logits, top_k=K, renormalize=True,
                            w1_scale=w["w13_s"], w2_scale=w["w2_s"], **FP8, **kw)


@pytest.mark.parametrize("T", [1, 33, 300, 2048])  # decode (split-K) to prefill (wgmma tiles)
def test_fp8_layer_against_the_references(layer, T):
    H, E = layer["H"], layer["E"]
    x = randn(T, H, seed=T)
    logits = randn(T, E, seed=T + 1, dtype=torch.float32)
    with torch.no_grad():
        y = fp8_moe(layer, x, logits, out=poisoned(T, H))
        assert y.dtype == torch.bfloat16 and y.isfinite().all()
        topk_w, topk_ids = mt.route(router_logits=logits, top_k=K, renormalize=True)
        d13, d2 = dequantize_fp8_weights(layer["w13_q"], layer["w13_s"], layer["w2_q"], layer["w2_s"])
        unquantized = calc_diff(y, experts_reference(x, layer["w13"], layer["w2"], topk_w, topk_ids))
        dequantized = calc_diff(y, experts_reference(x, d13, d2, topk_w, topk_ids))
    assert unquantized < LAYER_CALC_DIFF, f"T={T}: calc_diff {unquantized:.2e} against the bf16 layer"
    assert dequantized < LAYER_CALC_DIFF, f"T={T}: calc_diff {dequantized:.2e} against the dequantized weights"
    # The routing given: the same kernels, the same bits; vLLM's names: the same layer.
    kw = dict(w1_scale=layer["w13_s"], w2_scale=layer["w2_s"], **FP8)
    assert torch.equal(y, moekit.fused_experts(x, layer["w13_q"], layer["w2_q"], topk_w, topk_ids,
                                               out=poisoned(T, H), **kw))
    assert torch.equal(y, moekit.fused_moe(hidden_states=x, w1=layer["w13_q"], w2=layer["w2_q"], gating_output=logits,
                                           topk=K, renormalize=True, **kw))
    assert torch.equal(y, fp8_moe(layer, x, logits))  # deterministic


@pytest.mark.parametrize("T", [1, 8, 77])
def test_fp8_stages_match_the_fused_layer(layer, T):
    """quantize_tokens -> align -> expert_up -> expert_down -> combine in a poisoned Workspace: the
    fused layer's bits; x_q / x_scale are the CPU reference's per-token quantization (a 1 x 128
    block is a token's group of 128 columns: the same contract). T = 1 and 8 plan both GEMMs on
    mma.sync, where the fused layer crosses the up -> down boundary (up signals late, down
    prefetches before its PDL wait) and the stages do not: the same bits all the same."""
    H, F, E = layer["H"], layer["F"], layer["E"]
    x = randn(T, H, seed=5)
    topk_w, topk_ids = mt.route(router_logits=randn(T, E, seed=6, dtype=torch.float32), top_k=K, renormalize=True)
    ws = stages.Workspace(T, H, F, E, K, precision="fp8")
    assert ws.plan.precision == "fp8"
    poison_(ws.buffer)
    stages.quantize_tokens(ws, x)
    stages.align(ws, topk_ids)
    stages.expert_up(ws, ws.view("x_q"), layer["w13_q"], layer["w13_s"])
    stages.expert_down(ws, layer["w2_q"], topk_w, layer["w2_s"])
    y = stages.combine(ws, out=poisoned(T, H))
    ws.check_status()
    assert torch.equal(y, moekit.fused_experts(x, layer["w13_q"], layer["w2_q"], topk_w, topk_ids,
                                               w1_scale=layer["w13_s"], w2_scale=layer["w2_s"], **FP8))
    q, s = quantize_weight_blocks_reference(x.cpu().view(T, 1, H))
    assert torch.equal(bits(ws.view("x_q")), bits(q.view(T, H)))
    assert torch.equal(bits(ws.view("x_scale")), bits(s.view(T, -1)))
    with pytest.raises(moekit.Error, match="expert_up: argument 'x': an fp8 plan's up GEMM reads ws.x_q"):
        stages.expert_up(ws, ws.view("x_q").clone(), layer["w13_q"], layer["w13_s"])
    with pytest.raises(moekit.Error, match="expert_down: argument 'w2_scale': is required for an fp8 plan"):
        stages.expert_down(ws, layer["w2_q"], topk_w)


def test_fp8_ops_without_scales_are_refused_by_the_library(layer):
    """The ops called directly (no Python checks): the C++ entry names the missing argument."""
    T, H = 8, layer["H"]
    x = randn(T, H, seed=1)
    topk_w, topk_ids = mt.route(router_logits=randn(T, layer["E"], seed=2, dtype=torch.float32), top_k=K)
    with pytest.raises(moekit.Error, match="experts_forward: argument 'w13_scale': an fp8 plan needs the weights' block"):
        torch.ops.moekit.fused_experts(x, layer["w13_q"], layer["w2_q"], topk_w, topk_ids)


@pytest.mark.parametrize("T", [1, 200])
def test_fp8_cuda_graph_capture_and_replay_on_new_inputs(layer, T):
    H, E = layer["H"], layer["E"]
    static_x, static_logits = randn(T, H, seed=0), randn(T, E, seed=100, dtype=torch.float32)
    g, static_y = capture(lambda: fp8_moe(layer, static_x, static_logits))
    static_out = poisoned(T, H)
    g_out, _ = capture(lambda: fp8_moe(layer, static_x, static_logits, out=static_out))
    for seed in range(1, 4):
        x, logits = randn(T, H, seed=seed), randn(T, E, seed=100 + seed, dtype=torch.float32)
        static_x.copy_(x)
        static_logits.copy_(logits)
        static_out.fill_(float("nan"))
        g.replay()
        g_out.replay()
        torch.cuda.synchronize()
        want = fp8_moe(layer, x, logits)
        assert torch.equal(static_y, want) and torch.equal(static_out, want), f"replay {seed}"


def test_fp8_torch_compile_matches_eager(layer):
    torch._dynamo.reset()
    H, E = layer["H"], layer["E"]
    compiled = torch.compile(lambda x, logits: fp8_moe(layer, x, logits) * 1.0, fullgraph=True, dynamic=True)
    for T in (1, 7, 64, 300):
        x, logits = randn(T, H, seed=T), randn(T, E, seed=T + 50, dtype=torch.float32)
        assert torch.equal(compiled(x, logits), fp8_moe(layer, x, logits)), f"T={T}"
    torch._dynamo.reset()
    overhead = torch.compile(lambda x, logits: fp8_moe(layer, x, logits), mode="reduce-overhead", fullgraph=True)
    x, logits = randn(50, H, seed=9), randn(50, E, seed=10, dtype=torch.float32)
    with torch.inference_mode():
        for _ in range(4):  # warm-up runs, then recorded, then replayed
            got = overhead(x, logits).clone()
    assert torch.equal(got, fp8_moe(layer, x, logits))


@pytest.mark.parametrize("E, F, H", [(3, 784, 2064), (2, 128, 256)])
def test_gpu_quantizer_is_bitwise_the_cpu_reference(E, F, H):
    """moekit.quantize_fp8_weights (the library's quantize_weights) against moekit.fp8's CPU reference,
    with docs/design.md's edge cases planted: a zero block, a tiny one, the bf16 maximum, a NaN, an Inf."""
    w13 = randn(E, 2 * F, H, seed=E, std=H ** -0.5)
    w2 = randn(E, H, F, seed=E + 1, std=F ** -0.5) * torch.logspace(-4, 4, H, device="cuda")[None, :, None].bfloat16()
    w13[0, :128, :128] = 0
    w13[0, 3, 5] = -0.0
    w13[0, :128, 128:256] = 2.0 ** -110
    w13[0, F:F + 128, :128] = torch.finfo(torch.bfloat16).max  # up's first block: its own scale
    w13[-1, 2 * F - 1, H - 1] = float("nan")  # up's last, partial block
    w2[0, 130, 17] = float("inf")
    q13, s13, q2, s2 = moekit.quantize_fp8_weights(w13, w2)
    assert (q13.dtype, q13.shape, s13.shape) == (torch.float8_e4m3fn, w13.shape, (E, 2 * -(-F // 128), -(-H // 128)))
    assert (q2.dtype, q2.shape, s2.shape) == (torch.float8_e4m3fn, w2.shape, (E, -(-H // 128), -(-F // 128)))
    r13, rs13, r2, rs2 = quantize_fp8_weights_reference(w13, w2)
    for got, want, name in ((q13, r13, "w13"), (s13, rs13, "w13_scale"), (q2, r2, "w2"), (s2, rs2, "w2_scale")):
        diff = (bits(got) != bits(want)).nonzero()
        assert diff.numel() == 0, f"{name}: {diff.shape[0]} values differ, first at {diff[0].tolist()}"
