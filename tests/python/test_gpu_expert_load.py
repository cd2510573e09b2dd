"""GPU tests: the opt-in load counter through moekit.torch. fused_moe / fused_experts with
expert_load= add exactly the histogram of the routed ids over many calls (the layer's own routing,
and adversarial given ids: every token on the same experts, a few experts for all, one token),
with y bitwise the one without a counter; MoE(track_expert_load=True) keeps it as a buffer through
eager calls, torch.cuda.graph replays (N replays add N times) and torch.compile; reset_expert_load
zeroes it. (opcheck of the counting ops: test_gpu_opcheck.py.)"""
import pytest

torch = pytest.importorskip("torch")

import moekit  # noqa: E402
import moekit.torch as mt  # noqa: E402

from gpu_util import capture, randn, small_layer  # noqa: E402

pytestmark = pytest.mark.gpu

H, F, E, K = 1024, 512, 16, 4
ROUTING = dict(top_k=K, renormalize=True)


@pytest.fixture(scope="module")
def layer():
    return small_layer(H, F, E, seed=41)


def histogram(ids: torch.Tensor) -> torch.Tensor:
    return torch.bincount(ids.flatten().long(), minlength=E)


def zeros() -> torch.Tensor:
    return torch.zeros(E, dtype=torch.int64, device="cuda")


def test_fused_moe_counts_the_routed_ids_over_many_calls(layer):
    load, want = zeros(), zeros()
    # T*k from 4 to 20000: align's one-warp, one-CTA and grid kernels; decode and prefill tiles.
    tokens = [1, 3, 16, 64, 65, 300, 1024, 5000]
    for call in range(20):
        T = tokens[call % len(tokens)]
        x = randn(T, H, seed=100 + call)
        y = moekit.fused_moe(x, layer["w13"], layer["w2"], w_gate=layer["w_gate"], expert_load=load, **ROUTING)
        assert torch.equal(y, moekit.fused_moe(x, layer["w13"], layer["w2"], w_gate=layer["w_gate"], **ROUTING)), \
            f"call {call}: y with the counter differs"
        _, ids = mt.route(x, layer["w_gate"], **ROUTING)  # the layer's routing: batch-invariant, bitwise
        want += histogram(ids)
    assert torch.equal(load, want)


def adversarial_ids(call: int, T: int, g: torch.Generator) -> torch.Tensor:
    kind = call % 4
    if kind == 0:  # uniform, distinct per token
        ids = torch.rand(T, E, generator=g, device="cuda").argsort(dim=1)[:, :K]
    elif kind == 1:  # every token on experts 0..k-1: the others empty
        ids = torch.arange(K, device="cuda").expand(T, K)
    elif kind == 2:  # five experts serve everything
        pool = torch.tensor([3, 5, 8, 9, 12], device="cuda")
        ids = pool[torch.rand(T, len(pool), generator=g, device="cuda").argsort(dim=1)[:, :K]]
    else:  # slot 0 always on the last expert
        ids = torch.cat([torch.full((T, 1), E - 1, device="cuda"), torch.arange(1, K, device="cuda").expand(T, K - 1)],
                        dim=1)
    return ids.to(torch.int32).contiguous()


def test_fused_experts_counts_adversarial_given_ids(layer):
    g = torch.Generator(device="cuda").manual_seed(7)
    load, want = zeros(), zeros()
    for call in range(20):
        T = (1, 7, 64, 300, 1500)[call % 5]
        ids = adversarial_ids(call, T, g)
        w = torch.rand(T, K, generator=g, device="cuda")
        x = randn(T, H, seed=call)
        y = moekit.fused_experts(x, layer["w13"], layer["w2"], w, ids, expert_load=load)
        assert torch.equal(y, moekit.fused_experts(x, layer["w13"], layer["w2"], w, ids)), f"call {call}"
        want += histogram(ids)
    assert torch.equal(load, want)
    out = torch.empty(9, H, dtype=torch.bfloat16, device="cuda")  # the out= variant counts too
    ids = adversarial_ids(1, 9, g)
    moekit.fused_experts(randn(9, H, seed=99), layer["w13"], layer["w2"], torch.rand(9, K, device="cuda"), ids,
                         out=out, expert_load=load)
    assert torch.equal(load, want + histogram(ids))


def modules():
    """A tracking MoE and a plain one with the same weights (the counter is in no state_dict)."""
    m = mt.MoE(H, F, E, K, renormalize=True, device="cuda", track_expert_load=True)
    plain = mt.MoE(H, F, E, K, renormalize=True, device="cuda")
    plain.load_state_dict(m.state_dict())
    return m, plain


def test_module_buffer_eager_and_reset():
    m, plain = modules()
    assert m.expert_load.dtype == torch.int64 and m.expert_load.shape == (E,) and not m.expert_load.any()
    assert "expert_load" not in m.state_dict() and "expert_load" in dict(m.named_buffers())
    want = zeros()
    for call in range(20):
        x = randn(2, 5 + 40 * call, H, seed=call)
        assert torch.equal(m(x), plain(x)), f"call {call}"
        _, ids = mt.route(x.reshape(-1, H), m.w_gate, **ROUTING)
        want += histogram(ids)
    assert torch.equal(m.expert_load, want)
    m.reset_expert_load()
    assert not m.expert_load.any()


def test_module_buffer_graph_replays_add_each_time():
    m, plain = modules()
    static_x = randn(33, H, seed=50)
    g, static_y = capture(lambda: m(static_x))  # the warm-up runs count: reset after capture
    m.reset_expert_load()
    for _ in range(5):
        g.replay()
    _, ids = mt.route(static_x, m.w_gate, **ROUTING)
    torch.cuda.synchronize()
    assert torch.equal(m.expert_load, 5 * histogram(ids))
    x = randn(33, H, seed=51)  # new inputs in the same buffer
    static_x.copy_(x)
    g.replay()
    _, new_ids = mt.route(x, m.w_gate, **ROUTING)
    torch.cuda.synchronize()
    assert torch.equal(m.expert_load, 5 * histogram(ids) + histogram(new_ids))
    assert torch.equal(static_y, plain(x))


def test_module_buffer_under_torch_compile():
    torch._dynamo.reset()
    m, plain = modules()
    compiled = torch.compile(m, fullgraph=True)
    want = zeros()
    for call in range(4):
        x = randn(64, H, seed=60 + call)
        assert torch.equal(compiled(x), plain(x)), f"call {call}"
        _, ids = mt.route(x, m.w_gate, **ROUTING)
        want += histogram(ids)
    assert torch.equal(m.expert_load, want)

