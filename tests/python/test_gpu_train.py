"""GPU tests of training through moekit.torch (moekit._train, moekit's backward): gradients against
PyTorch autograd of the naive per-expert loop in FP32 (moekit.reference) for each router gradient
and each choice of what needs grad, with the forward keeping h (save_h) and without, exact zeros for
the experts no token chose, determinism; a
torch.compile(fullgraph=True) training step and a CUDA-graph-captured forward + backward, both
bitwise the eager gradients; and a 30-step Adam run of a small MoE whose loss curve and updates
follow those of the same model in plain PyTorch. Skipped without a Hopper GPU (see conftest.py)."""
import contextlib

import pytest

torch = pytest.importorskip("torch")

import moekit  # noqa: E402
import moekit.torch as mt  # noqa: E402
from moekit.reference import experts_reference, rel_norm_error, routing_weights_reference  # noqa: E402

from gpu_util import capture, randn  # noqa: E402

pytestmark = pytest.mark.gpu

H, F, E, K = 256, 512, 8, 2
U = 2.0 ** -8  # bf16's unit roundoff
# The bound of every gradient's relative norm error against FP32 autograd on the same bf16 inputs.
# moekit's backward rounds h, act_w and dh to bf16 and writes bf16 dx / dW; tests/gpu/backward_util.hpp
# derives from those roundings ≈0.6-0.9U RMS for dx, dW13, dW2 and d_topk_weights (the last against the
# norm of its dot products' terms, ‖D ⊙ act‖: see dw_term_scale), held there to 4U against a double
# oracle; FP32 autograd with TF32 off is within ~2^-24·√K of that oracle, nothing next to these. The
# router's gradients are end to end here: d_topk_weights' errors (≈0.6U of its terms' norm, about its
# own size for random terms) pass linearly through the router's Jacobian (softmax or sigmoid,
# renormalisation, the scale) into d_router_logits and d_w_gate (whose bf16 output adds ≈0.43U), ≈0.8U,
# and dx's router part d_logits·w_gate carries that relative error on a part smaller than the experts'.
# 4U everywhere is ~5x the estimates; a wrong row, expert, slot or weight, or a missing term, is O(1).
TOL = 4 * U


@contextlib.contextmanager
def fp32_matmuls():
    """A true FP32 reference: no TF32 in the reference's forward or backward GEMMs."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def probe(*shape, seed):
    """dL/dy of the loss (y.float() · probe).sum(): bf16 values held in FP32, so moekit's dy (y's
    gradient, cast to y's bf16) is exactly the reference's."""
    return randn(*shape, seed=seed).float()


# name -> (entry, routing options, gate dtype, the inputs that need grad)
CASES = {
    "gate softmax": ("w_gate", dict(renormalize=True), torch.bfloat16, ("x", "w_gate", "w13", "w2")),
    "gate sigmoid grouped biased scaled": ("w_gate", dict(renormalize=True, scoring_func="sigmoid",
                                                          num_expert_group=4, topk_group=2, routed_scaling_factor=2.5),
                                           torch.bfloat16, ("x", "w_gate", "w13", "w2")),
    "gate f32 w_gate": ("w_gate", dict(), torch.float32, ("x", "w_gate", "w13", "w2")),
    "gate frozen experts": ("w_gate", dict(renormalize=True), torch.bfloat16, ("x", "w_gate")),
    "gate router only": ("w_gate", dict(renormalize=True), torch.bfloat16, ("w_gate",)),
    "logits softmax": ("router_logits", dict(), torch.bfloat16, ("x", "router_logits", "w13", "w2")),
    "logits sigmoid scaled": ("router_logits", dict(renormalize=True, scoring_func="sigmoid",
                                                    routed_scaling_factor=2.5), torch.bfloat16,
                              ("router_logits", "w2")),
    "experts": ("experts", dict(), torch.bfloat16, ("x", "topk_weights", "w13", "w2")),
}


def make_inputs(name, T, seed=0):
    entry, routing, gate_dtype, _ = CASES[name]
    t = dict(x=randn(T, H, seed=seed), w13=randn(E, 2 * F, H, seed=seed + 1, std=H ** -0.5),
             w2=randn(E, H, F, seed=seed + 2, std=F ** -0.5),
             w_gate=randn(E, H, seed=seed + 3, std=H ** -0.5).to(gate_dtype))
    if entry == "router_logits":
        t["router_logits"] = randn(T, E, seed=seed + 4, dtype=torch.float32)
    bias = randn(E, seed=seed + 5, dtype=torch.float32, std=0.1) if "biased" in name else None
    with torch.no_grad():  # the routing moekit's router picks (the same kernels as fused_moe's)
        logits = t.get("router_logits")
        w, ids = mt.route(t["x"] if logits is None else None, None if logits is not None else t["w_gate"], logits,
                          top_k=K, e_score_correction_bias=bias, **routing)
    if entry == "experts":
        t["topk_weights"] = w
    return t, ids, bias


def moekit_grads(name, t, bias, dy, save_h=False):
    entry, routing, _, grad = CASES[name]
    leaves = {k: v.detach().clone().requires_grad_(k in grad) for k, v in t.items()}
    if entry == "experts":
        y = moekit.fused_experts(leaves["x"], leaves["w13"], leaves["w2"], leaves["topk_weights"], t["topk_ids"],
                                 save_h=save_h)
    else:
        y = moekit.fused_moe(leaves["x"], leaves["w13"], leaves["w2"], router_logits=leaves.get("router_logits"),
                             w_gate=leaves["w_gate"] if entry == "w_gate" else None, top_k=K,
                             e_score_correction_bias=bias, save_h=save_h, **routing)
    (y.float() * dy).sum().backward()
    return {k: leaves[k].grad for k in grad}


def reference_grads(name, t, ids, dy):
    """FP32 autograd of the naive loop on the same bf16 values, at moekit's selection (a constant)."""
    entry, routing, _, grad = CASES[name]
    leaves = {k: v.detach().clone().requires_grad_(k in grad) for k, v in t.items() if k != "topk_ids"}
    with fp32_matmuls():
        if entry == "experts":
            weights = leaves["topk_weights"]
        else:
            logits = leaves["router_logits"] if entry == "router_logits" else \
                leaves["x"].float() @ leaves["w_gate"].float().t()
            scaling = routing.get("routed_scaling_factor", 1.0)
            weights = routing_weights_reference(logits, ids, routing.get("renormalize", False),
                                                routing.get("scoring_func", "softmax"), scaling)
        y = experts_reference(leaves["x"], leaves["w13"], leaves["w2"], weights, ids)
        (y * dy).sum().backward()
    return {k: leaves[k].grad for k in grad}


def dw_term_scale(x, w13, w2, ids, dy):
    """‖D ⊙ act‖ of each assignment (D = dy_t·W2_e, act = silu(g)·u, FP32): the scale of
    d_topk_weights' rounding errors (a dot product's error follows its terms, not its sum)."""
    T, k = ids.shape
    scale = torch.zeros(T * k, device="cuda")
    tokens = torch.arange(T, device="cuda").repeat_interleave(k)
    with fp32_matmuls():
        for e in range(E):
            rows = (ids.reshape(-1) == e).nonzero().squeeze(1)
            if rows.numel():
                xe, w13e = x[tokens[rows]].float(), w13[e].float()
                act = torch.nn.functional.silu(xe @ w13e[:F].t()) * (xe @ w13e[F:].t())
                scale[rows] = ((dy[tokens[rows]] @ w2[e].float()) * act).norm(dim=1)
    return scale.view(T, k)


def router_dependent(name) -> set:
    """The gradients that go through the router's backward (with w_gate, x's has a router part)."""
    entry = CASES[name][0]
    return {"w_gate", "x"} if entry == "w_gate" else {"router_logits"} if entry == "router_logits" else set()


# T = 1: the decode layouts (block_m 16, split-K of dx); its router gradients are not held to the bound.
# One token's router gradient is a difference of its two d_topk_weights (renormalised top-2:
# ds_1 = r·s_2·(dw_1 − dw_2)/S², and the like for softmax without renormalisation), whose relative error
# has no floor when they are close; over 16 tokens and more the norm is carried by the tokens where
# they are not (the chance that the error still exceeds 4U there is negligible).
@pytest.mark.parametrize("save_h", [False, True], ids=["recompute", "save_h"])
@pytest.mark.parametrize("T", [1, 16, 200])
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_fp32_autograd(name, T, save_h):
    t, ids, bias = make_inputs(name, T, seed=T)
    t["topk_ids"] = ids
    dy = probe(T, H, seed=T + 100)
    got = moekit_grads(name, t, bias, dy, save_h)
    want = reference_grads(name, t, ids, dy)
    assert set(got) == set(CASES[name][3])
    for arg, g in got.items():
        assert g is not None and g.shape == t[arg].shape and g.dtype == t[arg].dtype, arg
        if T == 1 and arg in router_dependent(name):
            continue
        if arg == "topk_weights":
            err, bound = (g - want[arg]).norm(), TOL * dw_term_scale(t["x"], t["w13"], t["w2"], ids, dy).norm()
            assert err <= bound, f"{name} T={T} d_topk_weights: error {float(err):.3e} > {float(bound):.3e}"
        else:
            err = rel_norm_error(g, want[arg])
            assert err <= TOL, f"{name} T={T} d{arg}: relative norm error {err:.3e} > {TOL:.3e} (4U)"
    untouched = [e for e in range(E) if not (ids == e).any()]
    for arg in ("w13", "w2"):
        if arg in got:
            assert all(bool((got[arg][e] == 0).all()) for e in untouched), f"d{arg} of an expert with no rows"
    again = moekit_grads(name, t, bias, dy, save_h)
    assert all(torch.equal(again[k], got[k]) for k in got), "not deterministic"


def test_a_loss_on_the_router_logits_reaches_w_gate_and_x():
    """The training op returns the layer's logits; a loss on them (a load-balancing loss, a z-loss)
    reaches the backward as d_logits_aux: d_w_gate and dx gain its part, as in FP32 autograd."""
    T = 64
    t, ids, _ = make_inputs("gate softmax", T, seed=9)
    dy, d_logits = probe(T, H, seed=10), randn(T, E, seed=11, dtype=torch.float32)
    x, w_gate = t["x"].clone().requires_grad_(), t["w_gate"].clone().requires_grad_()
    y, _, topk_ids, logits, *_ = torch.ops.moekit.fused_moe_train(x, t["w13"], t["w2"], None, w_gate, None, K, True,
                                                                   "softmax", 0, 0, 1.0, False)
    assert torch.equal(topk_ids, ids)
    ((y.float() * dy).sum() + (logits * d_logits).sum()).backward()
    xr, wr = t["x"].clone().requires_grad_(), t["w_gate"].clone().requires_grad_()
    with fp32_matmuls():
        logits_r = xr.float() @ wr.float().t()
        y_r = experts_reference(xr, t["w13"], t["w2"], routing_weights_reference(logits_r, ids, True), ids)
        ((y_r * dy).sum() + (logits_r * d_logits).sum()).backward()
    assert rel_norm_error(w_gate.grad, wr.grad) <= TOL and rel_norm_error(x.grad, xr.grad) <= TOL


def test_torch_compile_fullgraph_training_step_matches_eager():
    """torch.compile(fullgraph=True, dynamic=True) of a training step: the same ops, so the same
    gradients bit for bit (dy = probe exactly on both sides); the loss within inductor's reordered sum."""
    torch._dynamo.reset()
    torch.manual_seed(3)
    m = mt.MoE(H, F, E, K, renormalize=True, device="cuda", trainable=True)

    def step(x, dy):
        return (m(x).float() * dy).sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for T in (64, 100):
        x, dy = randn(T, H, seed=T).requires_grad_(), probe(T, H, seed=T + 1)
        loss = compiled(x, dy)
        loss.backward()
        got = [x.grad] + [p.grad for p in m.parameters()]
        x.grad = None
        m.zero_grad(set_to_none=True)
        want_loss = step(x, dy)
        want_loss.backward()
        want = [x.grad] + [p.grad for p in m.parameters()]
        m.zero_grad(set_to_none=True)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"T={T}"
        assert abs(loss.item() - want_loss.item()) <= 1e-4 * abs(want_loss.item()), f"T={T}"


@pytest.mark.parametrize("save_h,T", [(False, 96), (True, 300)], ids=["recompute", "save_h"])
def test_cuda_graph_captures_forward_and_backward(save_h, T):
    """One graph holds the forward and the backward (the whole-network recipe of torch.cuda.graph):
    each replay on new inputs writes the gradients eager autograd gives, bit for bit. With save_h the
    forward's h lives in the graph's pool and the backward reads it (T = 300: the wgmma prefill plan)."""
    torch.manual_seed(4)
    m = mt.MoE(H, F, E, K, renormalize=True, device="cuda", trainable=True, save_h=save_h)
    static_x, static_dy = randn(T, H, seed=1).requires_grad_(), probe(T, H, seed=2)

    def step():
        m.zero_grad(set_to_none=True)
        static_x.grad = None
        loss = (m(static_x).float() * static_dy).sum()
        loss.backward()
        return loss

    g, _ = capture(step)
    grads = [static_x.grad] + [p.grad for p in m.parameters()]  # the graph's own buffers
    for seed in (5, 6, 7):
        x, dy = randn(T, H, seed=seed), probe(T, H, seed=seed + 10)
        with torch.no_grad():
            static_x.copy_(x)
            static_dy.copy_(dy)
        g.replay()
        torch.cuda.synchronize()
        x = x.requires_grad_()
        want = torch.autograd.grad((m(x).float() * dy).sum(), [x, *m.parameters()])
        assert all(got is not None and torch.equal(got, w) for got, w in zip(grads, want)), f"replay {seed}"


class Twin(torch.nn.Module):
    """The same layer in plain PyTorch: its own FP32 router (softmax, top-k, renormalised) and the
    naive per-expert loop (moekit.reference), on bf16 parameters like moekit.torch.MoE's."""

    def __init__(self, moe: mt.MoE):
        super().__init__()
        self.w_gate, self.w13, self.w2 = (torch.nn.Parameter(p.detach().clone()) for p in (moe.w_gate, moe.w13, moe.w2))

    def forward(self, x):
        with fp32_matmuls():
            logits = x.float() @ self.w_gate.float().t()
            ids = logits.topk(K, dim=-1).indices.to(torch.int32)  # softmax is monotone: the same top-k
            return experts_reference(x, self.w13, self.w2, routing_weights_reference(logits, ids, True), ids)


def test_training_run_matches_plain_pytorch():
    """30 steps of Adam (lr 3e-3) on a small MoE (H=256, F=512, E=8, k=2; 512 fresh tokens a step,
    regressing a teacher MoE's outputs) from the same bf16 start: moekit.torch.MoE against its twin in
    plain PyTorch (FP32 arithmetic).

    The tolerances, measured on the CPU with these shapes, optimizer and three seeds: the same twin
    computing every matmul in bf16 (outputs rounded, forward and backward: at least as coarse as
    moekit's FP32 accumulators with bf16 h, act and dh) against the FP32 twin: the loss curves within
    2.3e-3 relative at every step, each parameter's total update ‖Δp‖ within 0.3%, and the updates'
    difference ‖Δp − Δp_twin‖ at most 0.24 of ‖Δp_twin‖ (Adam's normalised steps amplify noise on
    elements whose gradient is near zero; it grows with the steps). Bounds: 2e-2, 5% and 0.6. The loss
    falls by ~43% in 30 steps, so a missing or wrong expert gradient is far outside them (w2 frozen:
    the curve moves by 11%); a frozen router moves the curve by only 0.6%, but leaves ‖Δw_gate‖ = 0
    and a router of the wrong sign doubles its update difference — and test_gradients_match_fp32_autograd
    checks d_w_gate itself."""
    torch.manual_seed(0)
    m = mt.MoE(H, F, E, K, renormalize=True, device="cuda", trainable=True)
    twin = Twin(m)
    torch.manual_seed(99)
    teacher = Twin(mt.MoE(H, F, E, K, renormalize=True, device="cuda"))
    start = [p.detach().clone() for p in m.parameters()]
    losses = {}
    for model in (m, twin):
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        curve = losses[model] = []
        for step in range(30):
            x = randn(512, H, seed=1000 + step)
            with torch.no_grad():
                target = teacher(x)
            loss = ((model(x).float() - target) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            curve.append(loss.item())
    got, want = losses[m], losses[twin]
    assert want[-1] < 0.75 * want[0], f"the twin barely learns ({want[0]:.4g} -> {want[-1]:.4g}): the test is mistuned"
    worst = max(abs(g - w) / w for g, w in zip(got, want))
    assert worst <= 2e-2, f"loss curves differ by {worst:.3e} relative (bound 2e-2): moekit {got}, twin {want}"
    for name, p0, p, q in zip(("w_gate", "w13", "w2"), start, m.parameters(), twin.parameters()):
        dp, dq = (p.detach().float() - p0.float()), (q.detach().float() - p0.float())
        ratio, diff = float(dp.norm() / dq.norm()), float((dp - dq).norm() / dq.norm())
        assert abs(ratio - 1) <= 0.05, f"{name}: update norm {ratio:.4f} of the twin's (bound 5%)"
        assert diff <= 0.6, f"{name}: update differs from the twin's by {diff:.3f} of it (bound 0.6)"
