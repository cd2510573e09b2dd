"""GPU test of `python -m moekit.bench --backward` (moekit/bench_train.py) on a small layer: both
sides' gradients pass the check against FP32 autograd, every step is timed (graph and eager), and
the JSON says what it measured. The presets' runs are the device script's (scripts/python-check).
Skipped without a Hopper GPU (see conftest.py)."""
import json

import pytest

torch = pytest.importorskip("torch")

from moekit import bench, bench_train  # noqa: E402
from moekit.presets import Preset  # noqa: E402

pytestmark = pytest.mark.gpu

SMALL = Preset("small", hidden=256, inter=512, experts=8, top_k=2, routing=dict(renormalize=True))


def test_small_layer_is_checked_and_timed():
    device = torch.device("cuda", torch.cuda.current_device())
    rows = bench_train.bench_train_preset(SMALL, [1, 40, 300], bench.Timer(device, 1, 3), True, 0, device)
    assert [r["tokens"] for r in rows] == [1, 40, 300]
    for r in rows:
        assert "failed" not in r, r
        for side in ("moekit", "torch"):
            for g in bench_train.GRADS:
                if side == "torch" and f"err_torch_{g}" not in r:  # grouped_mm without autograd: a note
                    assert any(n.startswith("torch check") for n in r.get("notes", [])), r
                    continue
                assert 0 <= r[f"err_{side}_{g}"] <= bench_train.GRAD_BOUND, (side, g, r)
        for mode in ("graph", "eager"):
            assert r[f"moekit_{mode}_ms"] > 0 and r[f"moekit_experts_{mode}_ms"] > 0, r
        assert r["flops"] == 3 * SMALL.flops(r["tokens"]) and r["moekit_TFLOPps"] > 0


def test_main_writes_the_train_step_rows(tmp_path, monkeypatch):
    monkeypatch.setitem(bench.PRESETS, "small", SMALL)
    out = tmp_path / "train.json"
    assert bench.main(["--backward", "--presets", "small", "--tokens", "64", "--iters", "2", "--warmup", "1",
                       "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "train-step" and doc["error_bound"] == bench_train.GRAD_BOUND
    assert [r["stage"] for r in doc["results"]] == ["train-step"]
