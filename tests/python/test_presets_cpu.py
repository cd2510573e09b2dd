"""The layers the benchmarks know (moekit.presets), on the CPU: the models beyond the presets cover
the shapes the planner must handle without a table entry, and the command-line tool knows the same
names (tests/cpu/plan_test.cpp plans the tool's shapes at every T)."""
import os
import re
import shutil
import subprocess

import pytest

from moekit.presets import LAYERS, MODELS, PRESETS


def test_models_cover_the_untuned_edges():
    assert not set(MODELS) & set(PRESETS)
    assert any(m.experts & (m.experts - 1) for m in MODELS.values())  # E not a power of two
    assert any(m.hidden % 128 for m in MODELS.values())
    assert any(m.inter % 256 for m in MODELS.values())
    assert {m.top_k for m in MODELS.values()} == {1, 2, 4, 6, 8}
    assert set(LAYERS) == set(PRESETS) | set(MODELS)


def _cli():
    for path in (os.environ.get("MOEKIT_CLI", ""), "build/moekit", shutil.which("moekit") or ""):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


@pytest.mark.skipif(_cli() is None, reason="no moekit command-line tool built (build/moekit)")
def test_the_tool_knows_the_same_layers():
    out = subprocess.run([_cli(), "bench", "--help"], capture_output=True, text=True, check=True).stdout
    line = " ".join(out.split())
    for name in LAYERS:
        assert re.search(r"\b" + re.escape(name) + r"\b", line), name
