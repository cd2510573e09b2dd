"""CPU tests of the Hugging Face packing helpers (moekit.hf) and of the PyTorch reference that the
GPU tests trust (moekit.reference), on tiny fake Mixtral, Qwen3-MoE and DeepSeek-V3 modules."""
import types

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import moekit  # noqa: E402
from moekit.hf import pack_experts, pack_hf_moe, pack_hf_state_dict, routing_from_hf_config  # noqa: E402
from moekit.reference import experts_reference, rel_norm_error, route_reference, routing_matches  # noqa: E402

H, F, E = 16, 8, 8


class Expert(nn.Module):
    def __init__(self, gate, up, down):
        super().__init__()
        self.names = (gate, up, down)
        setattr(self, gate, nn.Linear(H, F, bias=False))
        setattr(self, up, nn.Linear(H, F, bias=False))
        setattr(self, down, nn.Linear(F, H, bias=False))

    def forward(self, x):  # the HF SwiGLU MLP
        g, u, d = (getattr(self, n) for n in self.names)
        return d(nn.functional.silu(g(x)) * u(x))


class DeepseekGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, H))
        self.register_buffer("e_score_correction_bias", torch.randn(E) * 0.1)


class Block(nn.Module):
    def __init__(self, names, deepseek=False):
        super().__init__()
        self.gate = DeepseekGate() if deepseek else nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList(Expert(*names) for _ in range(E))
        if deepseek:
            self.shared_experts = Expert("gate_proj", "up_proj", "down_proj")


class FusedExperts(nn.Module):  # newer transformers: experts stored as 3-D tensors
    def __init__(self):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * F, H))
        self.down_proj = nn.Parameter(torch.randn(E, H, F))


def mixtral_layer():
    layer = nn.Module()
    layer.block_sparse_moe = Block(("w1", "w3", "w2"))
    return layer


def qwen3_layer():
    layer = nn.Module()
    layer.mlp = Block(("gate_proj", "up_proj", "down_proj"))
    return layer


def deepseek_layer():
    layer = nn.Module()
    layer.mlp = Block(("gate_proj", "up_proj", "down_proj"), deepseek=True)
    return layer


def hf_experts_forward(block, x, weights, ids):
    """The HF loop: each token's k experts, weighted, in FP32."""
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            y[t] += weights[t, j] * block.experts[int(ids[t, j])](x[t])
    return y


@pytest.mark.parametrize("make, arch, block_name, names", [
    (mixtral_layer, "mixtral", "block_sparse_moe", ("w1", "w3", "w2")),
    (qwen3_layer, "qwen3_moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
    (deepseek_layer, "deepseek_v3", "mlp", ("gate_proj", "up_proj", "down_proj")),
])
def test_pack_layer(make, arch, block_name, names):
    torch.manual_seed(0)
    layer = make()
    block = getattr(layer, block_name)
    p = pack_hf_moe(layer, dtype=torch.float32)
    assert p["arch"] == arch
    assert p["w13"].shape == (E, 2 * F, H) and p["w2"].shape == (E, H, F) and p["w_gate"].shape == (E, H)
    g, u, d = names
    for e in range(E):
        assert torch.equal(p["w13"][e, :F], getattr(block.experts[e], g).weight)  # gate rows first
        assert torch.equal(p["w13"][e, F:], getattr(block.experts[e], u).weight)
        assert torch.equal(p["w2"][e], getattr(block.experts[e], d).weight)
    assert torch.equal(p["w_gate"], block.gate.weight)
    if arch == "deepseek_v3":
        assert torch.equal(p["e_score_correction_bias"], block.gate.e_score_correction_bias)
    else:
        assert p["e_score_correction_bias"] is None
    # The packed layout computes what the HF modules compute.
    x = torch.randn(6, H)
    weights, ids = route_reference(x @ p["w_gate"].t(), 2, renormalize=True)
    with torch.no_grad():
        want = hf_experts_forward(block, x, weights, ids)
    assert rel_norm_error(experts_reference(x, p["w13"], p["w2"], weights, ids), want) < 1e-6
    # The block itself and the state dict give the same packing; bf16 by default.
    assert torch.equal(pack_hf_moe(block, dtype=torch.float32)["w13"], p["w13"])
    sd = layer.state_dict()
    q = pack_hf_state_dict(sd, block_name, dtype=torch.float32)
    assert q["arch"] == arch
    for k in ("w_gate", "w13", "w2"):
        assert torch.equal(q[k], p[k]), k
    assert pack_hf_moe(layer)["w13"].dtype == torch.bfloat16


def test_pack_fused_layout():
    layer = nn.Module()
    layer.mlp = nn.Module()
    layer.mlp.gate = nn.Linear(H, E, bias=False)
    layer.mlp.experts = FusedExperts()
    p = pack_hf_moe(layer, dtype=torch.float32)
    assert torch.equal(p["w13"], layer.mlp.experts.gate_up_proj) and torch.equal(p["w2"], layer.mlp.experts.down_proj)
    q = pack_hf_state_dict(layer.state_dict(), "mlp", dtype=torch.float32)
    assert torch.equal(q["w13"], p["w13"])


def test_pack_errors_name_the_argument():
    w = [torch.zeros(F, H)] * 3
    with pytest.raises(moekit.Error, match=r"argument 'up\[1\]': expected shape \[8, 16\], got \[8, 15\]"):
        pack_experts(w, [torch.zeros(F, H), torch.zeros(F, H - 1), torch.zeros(F, H)], [torch.zeros(H, F)] * 3)
    with pytest.raises(moekit.Error, match="argument 'down': expected 3 weights"):
        pack_experts(w, w, [torch.zeros(H, F)] * 2)
    with pytest.raises(moekit.Error, match="argument 'layer': Module has no MoE block"):
        pack_hf_moe(nn.Module())
    with pytest.raises(moekit.Error, match="argument 'prefix'"):
        pack_hf_state_dict({}, "model.layers.0.mlp")


def test_routing_from_hf_config():
    ns = types.SimpleNamespace
    assert routing_from_hf_config(ns(model_type="mixtral", num_experts_per_tok=2)) == dict(
        top_k=2, renormalize=True, scoring_func="softmax")
    assert routing_from_hf_config(ns(model_type="qwen3_moe", num_experts_per_tok=8, norm_topk_prob=True)) == dict(
        top_k=8, renormalize=True, scoring_func="softmax")
    ds = ns(model_type="deepseek_v3", num_experts_per_tok=8, norm_topk_prob=True, scoring_func="sigmoid",
            n_group=8, topk_group=4, routed_scaling_factor=2.5)
    assert routing_from_hf_config(ds) == dict(top_k=8, renormalize=True, scoring_func="sigmoid", num_expert_group=8,
                                              topk_group=4, routed_scaling_factor=2.5)
    with pytest.raises(moekit.Error, match="argument 'arch'"):
        routing_from_hf_config(ns(model_type="llama", num_experts_per_tok=2))


def test_moe_from_hf():
    mt = pytest.importorskip("moekit.torch")
    layer = deepseek_layer()
    cfg = types.SimpleNamespace(model_type="deepseek_v3", num_experts_per_tok=4, norm_topk_prob=True,
                                scoring_func="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5)
    m = mt.MoE.from_hf(layer, cfg)
    assert (m.hidden, m.inter, m.experts, m.top_k) == (H, F, E, 4)
    assert (m.num_expert_group, m.topk_group, m.routed_scaling_factor, m.scoring_func) == (4, 2, 2.5, "sigmoid")
    assert m.w13.dtype == torch.bfloat16 and m.w13.shape == (E, 2 * F, H)
    assert torch.equal(m.e_score_correction_bias, layer.mlp.gate.e_score_correction_bias)
    q = mt.moe_from_hf(qwen3_layer(), top_k=2)  # no config: the arch's defaults, overridden
    assert q.top_k == 2 and q.renormalize and q.e_score_correction_bias is None
    assert not any(p.requires_grad for p in m.parameters())  # frozen, for inference, by default
    trained = mt.MoE.from_hf(layer, cfg, trainable=True)
    assert all(p.requires_grad for p in trained.parameters()) and not trained.e_score_correction_bias.requires_grad


def test_reference_routing_mixtral_matches_hf():
    torch.manual_seed(1)
    logits = torch.randn(32, E)
    w, ids = route_reference(logits, 2, renormalize=True)
    probs = torch.softmax(logits, dim=-1)  # HF Mixtral: softmax, top-k, renormalise
    hw, hids = torch.topk(probs, 2, dim=-1)
    hw = hw / hw.sum(-1, keepdim=True)
    assert torch.equal(ids.long(), hids) and torch.allclose(w, hw)
    assert routing_matches(logits, hw, hids.int(), 2, renormalize=True) is None
    swapped = hids.flip(-1).int()  # same set, other order: still a top-2, but weights must follow
    assert routing_matches(logits, hw.flip(-1), swapped, 2, renormalize=True) is None
    wrong = hids.clone().int()
    wrong[3, 1] = int(torch.argsort(probs[3])[0])  # the worst expert instead of the second best
    assert "not a top-2" in routing_matches(logits, hw, wrong, 2, renormalize=True)


def test_reference_routing_deepseek_grouped_topk():
    """Against a per-token transcription of DeepSeek-V3's noaux_tc gate."""
    torch.manual_seed(2)
    Tn, En, G, TG, k = 16, 32, 4, 2, 4
    logits, bias = torch.randn(Tn, En), torch.randn(En) * 0.1
    w, ids = route_reference(logits, k, renormalize=True, scoring_func="sigmoid", num_expert_group=G,
                             topk_group=TG, e_score_correction_bias=bias, routed_scaling_factor=2.5)
    for t in range(Tn):
        s = torch.sigmoid(logits[t])
        c = s + bias
        groups = [sorted(c[g * En // G:(g + 1) * En // G].tolist(), reverse=True) for g in range(G)]
        gscore = [gs[0] + gs[1] for gs in groups]
        keep = sorted(range(G), key=lambda g: -gscore[g])[:TG]
        allowed = [e for e in range(En) if e // (En // G) in keep]
        chosen = sorted(allowed, key=lambda e: -float(c[e]))[:k]
        want = s[chosen] / s[chosen].sum() * 2.5
        assert ids[t].tolist() == chosen
        assert torch.allclose(w[t], want)
