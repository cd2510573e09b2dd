"""GPU tests: moekit against the PyTorch FP32 reference (the naive per-expert loop) for the
docs/design.md presets and adversarial routings, the staged API, determinism, vLLM's argument names
and the low-level DLPack entries. Every output compared is written into a NaN-poisoned buffer
(out=, a poisoned Workspace), so a row the kernels skip fails the comparison. Skipped without a
Hopper GPU (see conftest.py)."""
import pytest

torch = pytest.importorskip("torch")

import moekit  # noqa: E402
import moekit.stages as stages  # noqa: E402
import moekit.torch as mt  # noqa: E402
from moekit.bench import grouped_mm_experts, make_weights  # noqa: E402
from moekit.presets import PRESETS  # noqa: E402
from moekit.reference import experts_reference, rel_norm_error, routing_matches  # noqa: E402

from gpu_util import BOUND, poison_, poisoned, randn, small_layer  # noqa: E402

pytestmark = pytest.mark.gpu


# Full-size weights of each preset (DeepSeek-V3 all 256 experts: 22.5 GB of bf16, fits the H200).
@pytest.fixture(scope="module", params=list(PRESETS))
def preset(request):
    p = PRESETS[request.param]
    w = make_weights(p, "cuda", seed=7)
    yield p, w
    del w
    torch.cuda.empty_cache()


@pytest.mark.parametrize("tokens", [1, 33, 256, 1024])
def test_preset_against_fp32_reference(preset, tokens):
    p, w = preset
    x = randn(tokens, p.hidden, seed=tokens)
    bias = w["e_score_correction_bias"]
    with torch.no_grad():
        topk_w, topk_ids = mt.route(x, w["w_gate"], top_k=p.top_k, e_score_correction_bias=bias, **p.routing)
        # Routing: the chosen experts are a top-k of the FP32 reference scores. The weights agree to
        # 1e-4 here: both sides compute the logits in FP32 but sum the H products in different orders
        # (|Δlogit| up to ~sqrt(H)·2^-24, and a softmax weight moves by about Δlogit relative).
        logits = torch.nn.functional.linear(x.float(), w["w_gate"].float())
        why = routing_matches(logits, topk_w, topk_ids, p.top_k, e_score_correction_bias=bias, rtol=1e-4,
                              **p.routing)
        assert why is None, why
        y = moekit.fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=p.top_k, e_score_correction_bias=bias,
                             out=poisoned(tokens, p.hidden), **p.routing)
        want = experts_reference(x, w["w13"], w["w2"], topk_w, topk_ids)
    assert y.shape == (tokens, p.hidden) and y.dtype == torch.bfloat16
    err = rel_norm_error(y, want)
    assert err <= BOUND, f"{p.name} T={tokens}: relative norm error {err:.2e} > {BOUND}"
    # Same kernels, same bits: the whole layer equals router + experts.
    assert torch.equal(y, moekit.fused_experts(x, w["w13"], w["w2"], topk_w, topk_ids, out=poisoned(tokens, p.hidden)))
    # Router logits given instead of w_gate: the same routing contract.
    y_logits = moekit.fused_moe(x, w["w13"], w["w2"], router_logits=logits, top_k=p.top_k,
                                e_score_correction_bias=bias, out=poisoned(tokens, p.hidden), **p.routing)
    w_l, ids_l = mt.route(router_logits=logits, top_k=p.top_k, e_score_correction_bias=bias, **p.routing)
    assert torch.equal(y_logits, moekit.fused_experts(x, w["w13"], w["w2"], w_l, ids_l, out=poisoned(tokens, p.hidden)))
    # Same logits on both sides: only exp/sigmoid and the sums differ, the weights agree to 1e-5.
    why = routing_matches(logits, w_l, ids_l, p.top_k, e_score_correction_bias=bias, **p.routing)
    assert why is None, why


def test_preset_torch_baseline_agrees(preset):
    """The benchmark's torch._grouped_mm pipeline computes the same layer (bench sanity)."""
    p, w = preset
    x = randn(64, p.hidden, seed=3)
    topk_w, topk_ids = mt.route(x, w["w_gate"], top_k=p.top_k, e_score_correction_bias=w["e_score_correction_bias"],
                                **p.routing)
    want = experts_reference(x, w["w13"], w["w2"], topk_w, topk_ids)
    assert rel_norm_error(grouped_mm_experts(x, w["w13"], w["w2"], topk_w, topk_ids), want) <= BOUND


def counts_routing(counts, k, seed):
    """topk_ids [T, k] whose expert e appears counts[e] times, shuffled (sum(counts) % k == 0)."""
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in enumerate(counts)])
    g = torch.Generator().manual_seed(seed)
    return ids[torch.randperm(ids.numel(), generator=g)].view(-1, k).cuda()


def adversarial(name, E, k):
    """topk_ids [T, k] of the routings that break index arithmetic and padding."""
    cuda = dict(dtype=torch.int32, device="cuda")
    if name == "all_tokens_one_expert":
        return torch.full((300, k), 3, **cuda)
    if name == "all_tokens_same_k_experts":
        return torch.arange(k, **cuda).repeat(257, 1)
    if name == "two_experts_rest_empty":
        return torch.tensor([0, E - 1], **cuda).repeat(200, k // 2)
    if name == "one_token":
        return torch.randperm(E, device="cuda")[:k].int().view(1, k)
    # 0, 1, 16, 17, 64, 65, 128, 129 rows: empty, single, exact block_m and block_m + 1 (block_m 64 here).
    assert name == "counts_around_block_m"
    return counts_routing([0, 1, 16, 17, 64, 65, 128, 129] * (E // 8), k, seed=5)


ADVERSARIAL = ["all_tokens_one_expert", "all_tokens_same_k_experts", "two_experts_rest_empty", "one_token",
               "counts_around_block_m"]


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_adversarial_routings(name):
    E, k = 16, 4
    w = small_layer(E=E)
    ids = adversarial(name, E, k)
    T = ids.shape[0]
    x = randn(T, 1024, seed=11)
    weights = torch.rand((T, k), generator=torch.Generator(device="cuda").manual_seed(3), device="cuda") + 0.1
    with torch.no_grad():
        y = moekit.fused_experts(x, w["w13"], w["w2"], weights, ids, out=poisoned(T, 1024))
        want = experts_reference(x, w["w13"], w["w2"], weights, ids)
    err = rel_norm_error(y, want)
    assert err <= BOUND, f"{name}: relative norm error {err:.2e} > {BOUND}"
    assert torch.equal(y, moekit.fused_experts(x, w["w13"], w["w2"], weights, ids, out=poisoned(T, 1024))), \
        "not deterministic"


def test_block_m_of_adversarial_counts():
    # counts_around_block_m holds block_m and block_m + 1 rows for every block_m the plan picks.
    bm = mt.plan(840 // 4, 1024, 512, 16, 4).block_m
    assert {bm, bm + 1} <= {0, 1, 16, 17, 64, 65, 128, 129}


def test_empty_batch():
    w = small_layer()
    x = torch.empty((0, 1024), dtype=torch.bfloat16, device="cuda")
    assert moekit.fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=4).shape == (0, 1024)
    ids = torch.empty((0, 4), dtype=torch.int32, device="cuda")
    assert moekit.fused_experts(x, w["w13"], w["w2"], torch.empty((0, 4), device="cuda"), ids).shape == (0, 1024)


def test_qwen3_shape_one_token_per_expert_and_decode():
    p = PRESETS["qwen3-30b-a3b"]
    w = make_weights(p, "cuda", seed=1)
    for T in (1, 2, 16):  # decode: block_m 16, most experts empty
        x = randn(T, p.hidden, seed=T)
        ids = torch.stack([torch.randperm(p.experts, device="cuda")[:p.top_k] for _ in range(T)]).int()
        weights = torch.softmax(randn(T, p.top_k, seed=T + 1, dtype=torch.float32), dim=-1)
        y = moekit.fused_experts(x, w["w13"], w["w2"], weights, ids, out=poisoned(T, p.hidden))
        assert rel_norm_error(y, experts_reference(x, w["w13"], w["w2"], weights, ids)) <= BOUND


def test_bitwise_deterministic():
    w = small_layer()
    x = randn(513, 1024, seed=2)
    runs = [moekit.fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=4, renormalize=True,
                             out=poisoned(513, 1024)) for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])


@pytest.mark.parametrize("T", [2, 300])  # decode (the down GEMM may split K) and prefill
def test_staged_api_matches_fused_and_exposes_the_aligned_layout(T):
    E, k, H, F = 16, 4, 1024, 512
    w = small_layer(H, F, E)
    x = randn(T, H, seed=4)
    topk_w, topk_ids = mt.route(x, w["w_gate"], top_k=k, renormalize=True)
    ws = stages.Workspace(T, H, F, E, k)
    poison_(ws.buffer)  # every stage must write what the next one reads
    stages.align(ws, topk_ids)
    stages.expert_up(ws, x, w["w13"])
    stages.expert_down(ws, w["w2"], topk_w)
    y = stages.combine(ws, out=poisoned(T, H))
    assert torch.equal(y, moekit.fused_experts(x, w["w13"], w["w2"], topk_w, topk_ids, out=poisoned(T, H)))
    if ws.plan.down_splits == 1:
        assert torch.equal(y, mt.combine(ws.view("y_rows"), k))
    else:
        parts = ws.view("y_partials")  # [S, T·k, H] f32: summed over s, then over the k slots
        assert parts.shape == (ws.plan.down_splits, T * k, H)
        assert rel_norm_error(y, parts.sum(0).view(T, k, H).sum(1)) < 1e-2
    ws.check_status()
    # The aligned layout: counts, then a stable expert-sorted order padded per expert to block_m.
    bm = ws.plan.block_m
    counts = torch.bincount(topk_ids.view(-1).long(), minlength=E)
    assert torch.equal(ws.view("expert_counts").long(), counts)
    rows = int(ws.view("num_rows_padded").item())
    assert rows == int(((counts + bm - 1) // bm * bm).sum())
    sorted_ids = ws.view("sorted_ids")[:rows].long()
    real = sorted_ids[sorted_ids < T * k]
    assert torch.equal(real.sort().values, torch.arange(T * k, device="cuda"))
    experts = topk_ids.view(-1).long()[real]
    key = experts * (T * k) + real  # expert-major, then ascending assignment: a stable sort
    assert torch.equal(key, key.sort().values)
    block_expert = ws.view("block_expert")[:rows // bm].long()
    assert torch.equal(block_expert, torch.repeat_interleave(torch.arange(E, device="cuda"), (counts + bm - 1) // bm))


def test_vllm_names_give_the_same_layer():
    """A call with vLLM's names (hidden_states, w1, gating_output, topk, use_grouped_topk) is the same
    layer, bit for bit, as moekit's (DeepSeek-V3's routing options: grouped, sigmoid, biased)."""
    E, k, T = 16, 4, 37
    w = small_layer(E=E)
    x = randn(T, 1024, seed=9)
    logits = randn(T, E, seed=10, dtype=torch.float32)
    bias = randn(E, seed=11, dtype=torch.float32, std=0.1)
    routing = dict(renormalize=True, scoring_func="sigmoid", num_expert_group=4, topk_group=2,
                   e_score_correction_bias=bias, routed_scaling_factor=2.5)
    y = moekit.fused_moe(x, w["w13"], w["w2"], router_logits=logits, top_k=k, out=poisoned(T, 1024), **routing)
    y_vllm = moekit.fused_moe(hidden_states=x, w1=w["w13"], w2=w["w2"], gating_output=logits, topk=k,
                              use_grouped_topk=True, out=poisoned(T, 1024), **routing)
    assert torch.equal(y, y_vllm)
    topk_w, topk_ids = mt.route(router_logits=logits, top_k=k, **routing)
    assert rel_norm_error(y, experts_reference(x, w["w13"], w["w2"], topk_w, topk_ids)) <= BOUND
    assert torch.equal(y, moekit.fused_experts(hidden_states=x, w1=w["w13"], w2=w["w2"], topk_weights=topk_w,
                                               topk_ids=topk_ids, out=poisoned(T, 1024)))


def test_out_of_range_ids_are_reported():
    E, k, T = 16, 4, 8
    ids = torch.randint(0, E, (T, k), device="cuda", dtype=torch.int32)
    ws = stages.Workspace(T, 1024, 512, E, k)
    stages.align(ws, ids)
    ws.check_status()  # valid ids: no bit set
    bad = ids.clone()
    bad[2, 1], bad[5, 0] = E, -1
    stages.align(ws, bad)
    with pytest.raises(moekit.Error, match="argument 'topk_ids': an expert id is outside"):
        ws.check_status()
    assert int(ws.view("expert_counts").sum()) == T * k - 2  # the two bad assignments were skipped
    stages.align(ws, ids)
    ws.check_status()  # align rewrites the status: the next good batch is clean


def test_low_level_entries_take_any_dlpack_array():
    """The nanobind entries on torch tensors directly (Tensor.__dlpack__) and on an explicit stream."""
    T, k, H = 33, 4, 1024
    y_rows = randn(T * k, H, seed=1)
    y = poisoned(T, H)
    s = torch.cuda.current_stream()
    moekit.combine(y_rows, k, y, stream=s.cuda_stream)
    assert torch.equal(y, mt.combine(y_rows, k))
    want = y_rows.float().view(T, k, H).sum(1).bfloat16()
    assert rel_norm_error(y, want) < 1e-2
    p = moekit.plan_forward(T, H, 512, 16, k)
    assert p.block_m in (16, 64, 128) and p.workspace_bytes > 0
    assert moekit.query_device().cc_major == 9
