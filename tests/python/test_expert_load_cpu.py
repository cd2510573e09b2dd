"""CPU tests of the opt-in load counter in moekit.torch (need PyTorch, not a GPU): expert_load=
reaches the counting ops (moekit::*_counted) and only them, MoE(track_expert_load=True)'s buffer
(non-persistent, reset, refused when not tracking), and torch.compile tracing the counting module
with no graph break (on fake CUDA tensors). The validation errors: test_torch_cpu.py."""
import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import moekit  # noqa: E402
import moekit.torch as mt  # noqa: E402

from test_torch_cpu import E, F, H, K, T, OpLog, f32, i32, layer, z  # noqa: E402


def test_module_load_counter_buffer():
    m = mt.MoE(H, F, E, K, device="meta", track_expert_load=True)
    assert (m.expert_load.shape, m.expert_load.dtype) == ((E,), torch.int64)
    assert "expert_load" in dict(m.named_buffers()) and "expert_load" not in m.state_dict()  # persistent=False
    assert "track_expert_load=True" in repr(m)
    c = mt.MoE(H, F, E, K, device="cpu", track_expert_load=True)
    c.expert_load.fill_(3)
    c.reset_expert_load()
    assert not c.expert_load.any()
    plain = mt.MoE(H, F, E, K, device="cpu")
    assert plain.expert_load is None and "track_expert_load" not in repr(plain)
    plain.load_state_dict(c.state_dict())  # the counter is in neither state dict
    with pytest.raises(moekit.Error, match="MoE.reset_expert_load: argument 'track_expert_load': is False"):
        plain.reset_expert_load()
    with FakeTensorMode():
        f = mt.MoE(H, F, E, K, device="cuda", track_expert_load=True)
        with OpLog() as log:
            assert f(z(2, 3, H)).shape == (2, 3, H)
        assert log.calls[0][0] == "moekit::fused_moe_counted" and log.calls[0][1][-1] is f.expert_load


def test_load_counter_reaches_the_ops():
    with FakeTensorMode():
        t = layer()
        load, out = z(E, dtype=torch.int64), z(T, H)
        w, ids = z(T, K, dtype=f32), z(T, K, dtype=i32)
        with OpLog() as log:
            moekit.fused_moe(t["x"], t["w13"], t["w2"], w_gate=t["w_gate"], top_k=K, expert_load=load)
            moekit.fused_moe(t["x"], t["w13"], t["w2"], w_gate=t["w_gate"], top_k=K, out=out, expert_load=load)
            moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids, expert_load=load)
            moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids, out=out, expert_load=load)
        assert [name for name, _ in log.calls] == ["moekit::fused_moe_counted", "moekit::fused_moe_out_counted",
                                                   "moekit::fused_experts_counted", "moekit::fused_experts_out_counted"]
        assert all(args[-1] is load for _, args in log.calls)
        assert log.calls[1][1][-2] is out and log.calls[3][1][-2] is out
        with pytest.raises(moekit.Error, match="fused_experts: argument 'expert_load': expected shape"):
            moekit.fused_experts(t["x"], t["w13"], t["w2"], w, ids, expert_load=z(E - 1, dtype=torch.int64))


def test_dynamo_traces_the_counting_module_without_graph_break():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True):
        m = mt.MoE(H, F, E, K, device="cuda", track_expert_load=True)
        y = torch.compile(m, backend=backend, fullgraph=True)(torch.empty(2, 3, H, dtype=torch.bfloat16, device="cuda"))
        assert y.shape == (2, 3, H)
    assert len(graphs) == 1 and "torch.ops.moekit.fused_moe_counted" in graphs[0].code
