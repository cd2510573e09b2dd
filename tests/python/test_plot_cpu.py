"""python -m moekit.plot on the run of record (docs/perf/latest/bench-*.json): the roofline it
draws is the JSON's own (time / roofline = x_roof on every row), and the PNGs are written. A CPU
test; the drawing part is skipped, with the reason shown, where matplotlib is not installed."""
import importlib.util
import math
import pathlib
import subprocess
import sys

import pytest

from moekit import plot

RUN = pathlib.Path(__file__).resolve().parents[2] / "docs" / "perf" / "latest"
FILES = sorted(str(p) for p in RUN.glob("bench-*.json"))
PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="drawing needs matplotlib (pip install 'moekit[plot]')")


def test_the_run_of_record_has_both_dtypes():
    assert FILES, f"no bench-*.json in {RUN}"
    runs = plot.load(FILES)
    assert set(plot.presets_of(runs)) == set(PRESETS)
    for preset in PRESETS:
        assert set(plot.roofline_series(runs, preset)) == {"bf16", "fp8"}


def test_roofline_reproduces_x_roof():
    """max(read_time_ms, flops / ceiling) is the row's roofline: ms / it = x_roof (1e-9: the JSON's
    float printing), for the experts and layer rows of both dtypes (FP8 rows: the FP8 ceiling)."""
    checked = 0
    for run in plot.load(FILES):
        for row in run.rows:
            if row.get("stage") in ("experts", "layer", "layer-graph") and row.get("x_roof") is not None:
                assert math.isclose(row["ms"] / plot.roof_ms(row, run.doc), row["x_roof"], rel_tol=1e-9), row
                checked += 1
    assert checked > 100


def test_stage_breakdown_has_quantize_for_fp8_only():
    runs = plot.load(FILES)
    stages = plot.stage_breakdown(runs, "deepseek-v3")
    assert set(stages["bf16"][1]) == {"router", "align", "up", "down", "combine"}
    assert set(stages["fp8"][1]) == {"router", "quantize", "align", "up", "down", "combine"}
    assert list(stages["fp8"]) == sorted(stages["fp8"])


def test_not_a_bench_file_is_named(tmp_path):
    bad = tmp_path / "python-bench.json"
    bad.write_text('{"results": []}')
    with pytest.raises(ValueError, match="python-bench.json: expected `moekit bench --json` output"):
        plot.load([str(bad)])


@needs_matplotlib
def test_plot_writes_the_pngs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "moekit.plot", *FILES, "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for preset in PRESETS:
        for stem in ("roofline", "stages"):
            png = tmp_path / f"{stem}-{preset}.png"
            assert png.is_file(), r.stdout
            data = png.read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 200_000, (png, len(data))
    assert r.stdout.count("wrote ") == 6


@needs_matplotlib
def test_plot_cli_errors(tmp_path):
    r = subprocess.run([sys.executable, "-m", "moekit.plot", *FILES, "--out", str(tmp_path), "--presets", "llama"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--presets: llama not in the files" in r.stderr
