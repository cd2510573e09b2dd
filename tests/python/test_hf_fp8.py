"""CPU tests of moekit.hf on DeepSeek-V3's FP8 checkpoint layout: per expert
`experts.<e>.{gate,up,down}_proj.weight` float8_e4m3fn [out, in] with `.weight_scale_inv` float32
[ceil(out/128), ceil(in/128)], in a small safetensors file the test writes, packed as stored into
moekit's FP8 layout (w13 gate rows then up rows, w13_scale gate's blocks then up's). F and H are
not multiples of 128, so every projection has partial last blocks."""
import types

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import moekit  # noqa: E402
from moekit.fp8 import dequantize_fp8_weights, dequantize_weight_blocks, quantize_weight_blocks_reference  # noqa: E402
from moekit.hf import pack_experts_fp8, pack_hf_moe, pack_hf_safetensors, pack_hf_state_dict  # noqa: E402

E, F, H = 4, 144, 272  # ceil(F/128) = 2, ceil(H/128) = 3
FB, HB = 2, 3
PREFIX = "model.layers.3.mlp"
e4m3 = torch.float8_e4m3fn


def quantized(out_features, in_features, seed):
    """One projection in the checkpoint's form: (weight e4m3 [out, in], weight_scale_inv f32)."""
    w = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * (1 + seed)
    q, s = quantize_weight_blocks_reference(w.bfloat16()[None])
    return q[0], s[0]


def deepseek_fp8_state_dict():
    sd = {f"{PREFIX}.gate.weight": torch.randn(E, H).bfloat16(),
          f"{PREFIX}.gate.e_score_correction_bias": torch.randn(E) * 0.1}
    for e in range(E):
        for i, (name, shape) in enumerate((("gate_proj", (F, H)), ("up_proj", (F, H)), ("down_proj", (H, F)))):
            q, s = quantized(*shape, seed=10 * e + i)
            sd[f"{PREFIX}.experts.{e}.{name}.weight"] = q
            sd[f"{PREFIX}.experts.{e}.{name}.weight_scale_inv"] = s
    for name, shape in (("gate_proj", (F, H)), ("up_proj", (F, H)), ("down_proj", (H, F))):  # not routed experts
        q, s = quantized(*shape, seed=99)
        sd[f"{PREFIX}.shared_experts.{name}.weight"], sd[f"{PREFIX}.shared_experts.{name}.weight_scale_inv"] = q, s
    sd["model.layers.4.mlp.experts.0.gate_proj.weight"] = torch.zeros(F, H, dtype=e4m3)  # another layer's
    return sd


def raw(t):
    return t.view(torch.uint8) if t.dtype == e4m3 else t


def check_fp8_packing(p, sd):
    assert p["arch"] == "deepseek_v3"
    assert (p["w13"].dtype, p["w13"].shape, p["w2"].dtype, p["w2"].shape) == (e4m3, (E, 2 * F, H), e4m3, (E, H, F))
    assert (p["w13_scale"].dtype, p["w13_scale"].shape) == (torch.float32, (E, 2 * FB, HB))
    assert (p["w2_scale"].dtype, p["w2_scale"].shape) == (torch.float32, (E, HB, FB))
    for e in range(E):
        key = f"{PREFIX}.experts.{e}."
        assert torch.equal(raw(p["w13"][e, :F]), raw(sd[key + "gate_proj.weight"]))  # gate rows first: bytes as stored
        assert torch.equal(raw(p["w13"][e, F:]), raw(sd[key + "up_proj.weight"]))
        assert torch.equal(raw(p["w2"][e]), raw(sd[key + "down_proj.weight"]))
        assert torch.equal(p["w13_scale"][e, :FB], sd[key + "gate_proj.weight_scale_inv"])  # gate's blocks, then up's
        assert torch.equal(p["w13_scale"][e, FB:], sd[key + "up_proj.weight_scale_inv"])
        assert torch.equal(p["w2_scale"][e], sd[key + "down_proj.weight_scale_inv"])
    assert torch.equal(p["w_gate"], sd[f"{PREFIX}.gate.weight"])
    assert torch.equal(p["e_score_correction_bias"], sd[f"{PREFIX}.gate.e_score_correction_bias"])


def test_pack_deepseek_fp8_safetensors_as_stored(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    sd = deepseek_fp8_state_dict()
    path = tmp_path / "model-00001-of-00002.safetensors"
    st.save_file(sd, str(path))
    loaded = st.load_file(str(path))
    assert loaded[f"{PREFIX}.experts.0.gate_proj.weight"].dtype == e4m3  # the file holds F8_E4M3 tensors
    check_fp8_packing(pack_hf_state_dict(loaded, PREFIX), sd)
    # Straight from the file(s), reading only the block's tensors; shards split anywhere.
    check_fp8_packing(pack_hf_safetensors(path, PREFIX), sd)
    keys = sorted(sd)
    half = len(keys) // 2
    shards = []
    for i, part in enumerate((keys[:half], keys[half:])):
        shards.append(tmp_path / f"shard-{i}.safetensors")
        st.save_file({k: sd[k] for k in part}, str(shards[-1]))
    check_fp8_packing(pack_hf_safetensors(shards, PREFIX + "."), sd)


def test_fp8_dequantized_packing_is_the_stored_experts():
    """dtype=bf16 dequantizes (q · scale per block) instead: the same as dequantizing the packed
    FP8 layout, expert by expert, projection by projection."""
    sd = deepseek_fp8_state_dict()
    p = pack_hf_state_dict(sd, PREFIX)
    b = pack_hf_state_dict(sd, PREFIX, dtype=torch.float32)
    assert b["w13"].dtype == torch.float32 and b["w13_scale"] is None and b["w2_scale"] is None
    d13, d2 = dequantize_fp8_weights(p["w13"], p["w13_scale"], p["w2"], p["w2_scale"])
    assert torch.equal(b["w13"], d13) and torch.equal(b["w2"], d2)
    key = f"{PREFIX}.experts.1.up_proj."
    up = dequantize_weight_blocks(sd[key + "weight"][None], sd[key + "weight_scale_inv"][None])[0]
    assert torch.equal(d13[1, F:], up)
    assert pack_hf_state_dict(sd, PREFIX, dtype=torch.bfloat16)["w13"].dtype == torch.bfloat16


class FP8Linear(nn.Module):
    """transformers' FP8Linear as it holds DeepSeek-V3's weights: weight e4m3, weight_scale_inv f32."""

    def __init__(self, weight, scale):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(scale, requires_grad=False)


def fp8_layer(sd):
    layer = nn.Module()
    layer.mlp = nn.Module()
    layer.mlp.gate = nn.Module()
    layer.mlp.gate.weight = nn.Parameter(sd[f"{PREFIX}.gate.weight"])
    layer.mlp.gate.register_buffer("e_score_correction_bias", sd[f"{PREFIX}.gate.e_score_correction_bias"])
    layer.mlp.experts = nn.ModuleList()
    for e in range(E):
        expert = nn.Module()
        for name in ("gate_proj", "up_proj", "down_proj"):
            key = f"{PREFIX}.experts.{e}.{name}."
            setattr(expert, name, FP8Linear(sd[key + "weight"], sd[key + "weight_scale_inv"]))
        layer.mlp.experts.append(expert)
    return layer


def test_pack_fp8_modules_as_stored():
    sd = deepseek_fp8_state_dict()
    layer = fp8_layer(sd)
    check_fp8_packing(pack_hf_moe(layer), sd)
    assert torch.equal(pack_hf_moe(layer, dtype=torch.float32)["w13"],
                       pack_hf_state_dict(sd, PREFIX, dtype=torch.float32)["w13"])
    mt = pytest.importorskip("moekit.torch")
    cfg = types.SimpleNamespace(model_type="deepseek_v3", num_experts_per_tok=2, n_group=1, topk_group=1)
    with pytest.raises(moekit.Error, match="moe_from_hf: argument 'layer': has FP8 experts"):
        mt.moe_from_hf(layer, cfg)


def test_fp8_packing_errors_name_the_argument():
    sd = deepseek_fp8_state_dict()
    missing = dict(sd)
    del missing[f"{PREFIX}.experts.2.up_proj.weight_scale_inv"]
    with pytest.raises(moekit.Error, match=f"pack_hf_state_dict: argument 'state_dict': holds float8_e4m3fn expert "
                                           f"weights but no key {PREFIX}.experts.2.up_proj.weight_scale_inv"):
        pack_hf_state_dict(missing, PREFIX)
    bad = dict(sd)
    bad[f"{PREFIX}.experts.1.down_proj.weight_scale_inv"] = torch.ones(HB, FB + 1)
    with pytest.raises(moekit.Error, match=r"argument 'down_scale\[1\]': expected shape \[3, 2\] \(one scale per "
                                           r"128 x 128 block\), got \[3, 3\]"):
        pack_hf_state_dict(bad, PREFIX)
    gate = [sd[f"{PREFIX}.experts.{e}.gate_proj.weight"] for e in range(E)]
    scales = [sd[f"{PREFIX}.experts.{e}.gate_proj.weight_scale_inv"] for e in range(E)]
    down = [sd[f"{PREFIX}.experts.{e}.down_proj.weight"] for e in range(E)]
    dscales = [sd[f"{PREFIX}.experts.{e}.down_proj.weight_scale_inv"] for e in range(E)]
    with pytest.raises(moekit.Error, match=r"argument 'up\[0\]': expected dtype float8_e4m3fn, got bfloat16"):
        pack_experts_fp8(gate, [g.bfloat16() for g in gate], down, scales, scales, dscales)
    with pytest.raises(moekit.Error, match=r"argument 'up_scale\[3\]': expected float32 block scales, got int32"):
        pack_experts_fp8(gate, gate, down, scales, scales[:3] + [scales[3].int()], dscales)
    with pytest.raises(moekit.Error, match="argument 'down_scale': expected 4 tensors"):
        pack_experts_fp8(gate, gate, down, scales, scales, dscales[:2])
    layer = fp8_layer(sd)
    del layer.mlp.experts[0].gate_proj.weight_scale_inv
    with pytest.raises(moekit.Error, match=r"pack_hf_moe: argument 'layer': .* no experts\[0\].gate_proj.weight_scale"):
        pack_hf_moe(layer)
