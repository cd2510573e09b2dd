"""GPU tests of the training forward that keeps h (save_h=True: the training ops return h, the backward
reads it, SavedActivations::h), on the shape of tests/gpu/backward_test.cu's TrainingForwardKeepsH: y
is bitwise the forward's without h (and the inference op's); the kept h is g | u of every sorted row,
in the layout's order; the gradients of fused_moe (router from w_gate, every input needing grad) and
of fused_experts are bitwise those of the recomputing backward where the forward's up GEMM and the
backward's recomputation are one kernel family (the C++ test's rule: wgmma in the planner's prefill
layout, block_m 128, mma.sync in its decode one); a torch.compile(fullgraph=True) training step gives
the eager gradients bit for bit. Against FP32 autograd, for every router gradient:
test_gpu_train.py's test_gradients_match_fp32_autograd[save_h-...]; captured in a CUDA graph:
its test_cuda_graph_captures_forward_and_backward[save_h]. Skipped without a Hopper
GPU (see conftest.py)."""
import pytest

torch = pytest.importorskip("torch")

import moekit  # noqa: E402
import moekit.torch as mt  # noqa: E402
from moekit import _train  # noqa: E402
from moekit.reference import rel_norm_error  # noqa: E402

from gpu_util import randn  # noqa: E402
from test_gpu_train import TOL, fp32_matmuls, probe  # noqa: E402

pytestmark = pytest.mark.gpu

H, F, E, K = 256, 128, 8, 2
ROUTING = dict(top_k=K, renormalize=True)
DECODE, PREFILL = 16, 300  # 4 and 75 rows an expert: the planner's block_m 16 and 128 layouts


def one_family(T: int) -> bool:
    """Whether the forward's up GEMM and the recomputing backward's are one kernel family on this GPU:
    then the kept h is bitwise the recomputed one, and so is every gradient."""
    forward = mt.plan(T, H, F, E, K)
    return forward.up.startswith("wgmma") == moekit.plan_backward(forward).h_wgmma


def inputs(entry: str, T: int, seed: int) -> dict:
    t = dict(x=randn(T, H, seed=seed), w13=randn(E, 2 * F, H, seed=seed + 1, std=H ** -0.5),
             w2=randn(E, H, F, seed=seed + 2, std=F ** -0.5), w_gate=randn(E, H, seed=seed + 3, std=H ** -0.5))
    if entry == "fused_experts":  # the routing moekit's router picks, its weights a leaf of their own
        with torch.no_grad():
            t["topk_weights"], t["topk_ids"] = mt.route(t["x"], t.pop("w_gate"), **ROUTING)
    return t


def train_step(entry: str, t: dict, dy, save_h: bool, grad: bool = True):
    """y, and the gradient of every float input of the loss (y.float() · dy).sum() (grad=False: y of the
    inference path)."""
    leaves = {k: v.detach().clone().requires_grad_(grad and v.is_floating_point()) for k, v in t.items()}
    with torch.set_grad_enabled(grad):
        if entry == "fused_moe":
            y = moekit.fused_moe(leaves["x"], leaves["w13"], leaves["w2"], w_gate=leaves["w_gate"], save_h=save_h,
                                 **ROUTING)
        else:
            y = moekit.fused_experts(leaves["x"], leaves["w13"], leaves["w2"], leaves["topk_weights"],
                                     leaves["topk_ids"], save_h=save_h)
    if grad:
        (y.float() * dy).sum().backward()
    return y.detach(), {k: v.grad for k, v in leaves.items() if v.requires_grad}


@pytest.fixture
def saved_log(monkeypatch):
    """The `saved` of every backward plan the backward op asks for (moekit._train._backward_plan's)."""
    log, plan = [], _train._backward_plan

    def recording(*key):
        log.append(key[6])  # (T, H, F, E, k, device, saved, router, input_grad, weight_grads)
        return plan(*key)

    monkeypatch.setattr(_train, "_backward_plan", recording)
    return log


@pytest.mark.parametrize("T", [DECODE, PREFILL])
@pytest.mark.parametrize("entry", ["fused_moe", "fused_experts"])
def test_kept_h_gives_the_recomputing_backwards_gradients(entry, T, saved_log):
    t, dy = inputs(entry, T, seed=T), probe(T, H, seed=T + 1)
    y_kept, kept = train_step(entry, t, dy, save_h=True)
    y_recomputed, recomputed = train_step(entry, t, dy, save_h=False)
    y_inference, _ = train_step(entry, t, dy, save_h=True, grad=False)
    assert saved_log == ["h", "recompute"], "the backward did not read the kept h, or read it without save_h"
    assert torch.equal(y_kept, y_recomputed) and torch.equal(y_kept, y_inference), "save_h changed y"
    want = {"x", "w13", "w2", "w_gate" if entry == "fused_moe" else "topk_weights"}
    assert set(kept) == set(recomputed) == want and all(g is not None for g in kept.values())
    if not one_family(T):
        assert T != PREFILL, "the planner's prefill layout must run wgmma in both up GEMMs: pick another shape"
        pytest.skip("the two up GEMMs are of two kernel families here: test_gpu_train.py holds these gradients "
                    "to FP32 autograd")
    for arg in want:
        assert torch.equal(kept[arg], recomputed[arg]), f"{entry} T={T}: d{arg} with the kept h is not the " \
                                                        f"recomputing backward's, bitwise"


@pytest.mark.parametrize("T", [DECODE, PREFILL])
def test_kept_h_is_g_and_u_of_each_sorted_row(T):
    """Row r of h is g | u = x[t]·W13[e]ᵀ of sorted row r's assignment a = t·k + j (sorted_ids[r] = a, e =
    topk_ids[t, j]); every assignment has its row. h is the FP32 accumulators rounded to bf16 once
    (≤ U/2 relative each), held to test_gpu_train.py's 4U: a wrong row or expert is O(1)."""
    t = inputs("fused_experts", T, seed=T + 7)
    with torch.no_grad():
        _, sorted_ids, _, _, _, h = torch.ops.moekit.fused_experts_train(t["x"], t["w13"], t["w2"], t["topk_weights"],
                                                                         t["topk_ids"], True)
    assert h.shape == (_train._layout_rows(T, K, E), 2 * F) and h.dtype == torch.bfloat16
    rows = sorted_ids[:mt.plan(T, H, F, E, K).max_rows].long()
    used = (rows < T * K).nonzero().squeeze(1)  # the other rows are the layout's padding
    assignment = rows[used]
    assert torch.equal(assignment.sort().values, torch.arange(T * K, device="cuda"))
    experts = t["topk_ids"].reshape(-1).long()[assignment]
    with fp32_matmuls():
        want = torch.einsum("nh,nfh->nf", t["x"][assignment // K].float(), t["w13"][experts].float())
    err = rel_norm_error(h[used], want)
    assert err <= TOL, f"T={T}: the kept h is {err:.3e} from g | u (bound {TOL:.3e})"


def test_torch_compile_fullgraph_training_step_keeping_h():
    """torch.compile(fullgraph=True, dynamic=True) of a training step of MoE(save_h=True), at the decode and
    the prefill layout (h's rows symbolic in T): the same ops as eager, so the same gradients bit for bit."""
    torch._dynamo.reset()
    torch.manual_seed(3)
    m = mt.MoE(H, F, E, K, renormalize=True, device="cuda", trainable=True, save_h=True)

    def step(x, dy):
        return (m(x).float() * dy).sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for T in (DECODE, PREFILL):
        x, dy = randn(T, H, seed=T).requires_grad_(), probe(T, H, seed=T + 1)
        compiled(x, dy).backward()
        got = [x.grad] + [p.grad for p in m.parameters()]
        x.grad = None
        m.zero_grad(set_to_none=True)
        step(x, dy).backward()
        want = [x.grad] + [p.grad for p in m.parameters()]
        m.zero_grad(set_to_none=True)
        assert all(g is not None and torch.equal(g, w) for g, w in zip(got, want)), f"T={T}"
