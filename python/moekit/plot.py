"""python -m moekit.plot — charts of `moekit bench --json` runs (bf16 and fp8 files together).

  python -m moekit.plot BENCH_JSON... --out DIR [--presets P,...]
  python -m moekit.plot docs/perf/latest/bench-*.json --out docs/perf/latest     (the run of record)

Per preset, two PNGs:

* roofline-<preset>.png — moekit's experts (up + down GEMMs) and layer (the whole forward, replayed
  as one CUDA graph: the `layer-graph` rows) time per T against the roofline, log-log, one colour
  per dtype. The roofline of a row is max(read_time_ms, flops / ceiling): the streaming read of its
  weight bytes and its FLOPs at the dense ceiling, both measured in the same run (the FP8 ceiling
  for fp8 rows); time / roofline is the row's `x_roof` (docs/design.md, "What the benchmarks
  report").
* stages-<preset>.png — per T, each stage's share of the stages' summed time (router, quantize for
  fp8, align, up, down, combine: each timed alone), stacked, one panel per dtype; the sum in ms above
  each bar. Shares rather than ms, so that T = 1 (µs) and T = 16384 (tens of ms) read on one axis.

The data side (load, roofline, series) needs only the standard library; drawing needs matplotlib
(pyproject.toml's `plot` extra pins it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from ._requires import missing

__all__ = ["Run", "load", "roof_ms", "roofline_series", "stage_breakdown", "plot_roofline", "plot_stages", "main"]

STAGES = ("router", "quantize", "align", "up", "down", "combine")  # pipeline order (quantize: fp8 plans only)
DTYPE_COLORS = {"bf16": "#1f77b4", "fp8": "#d62728"}
STAGE_COLORS = {"router": "#8c564b", "quantize": "#e377c2", "align": "#7f7f7f", "up": "#1f77b4", "down": "#ff7f0e",
                "combine": "#2ca02c"}
DPI = 100  # 800 x 500 px figures: a few tens of KB per PNG


@dataclass
class Run:
    """One `moekit bench --json` file: its ceilings and its rows (moekit's own, per preset and dtype)."""
    path: str
    doc: dict
    rows: list = field(default_factory=list)

    @property
    def gpu(self) -> str:
        return self.doc.get("gpu", "?")


def _dtype(row: dict) -> str:
    return row.get("dtype") or "bf16"  # bf16 runs predate the field


def load(paths: Iterable[str]) -> list[Run]:
    """The runs of `moekit bench --json` files. Raises ValueError naming a file that is not one."""
    runs = []
    for path in paths:
        with open(path) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
            raise ValueError(f"{path}: expected `moekit bench --json` output (an object with a 'rows' list); "
                             "`python -m moekit.bench --json` files are not supported")
        runs.append(Run(path, doc, [r for r in doc["rows"] if isinstance(r, dict) and "preset" in r]))
    return runs


def roof_ms(row: dict, doc: dict) -> Optional[float]:
    """max(read_time_ms, flops / ceiling) of a row, in ms: the ceiling is the run's FP8 one for fp8
    rows, else the row's dense bf16 one. None where the row has no read time (align, combine)."""
    read_ms = row.get("read_time_ms")
    if read_ms is None:
        return None
    ceiling = doc.get("fp8_ceiling_TFLOPs") if _dtype(row) == "fp8" else None
    ceiling = ceiling or row.get("dense_ceiling_TFLOPs") or doc.get("dense_ceiling_TFLOPs")
    compute_ms = row.get("flops", 0.0) / (ceiling * 1e12) * 1e3 if ceiling else 0.0
    return max(read_ms, compute_ms)


def _moekit_rows(runs: Sequence[Run], preset: str, stage: str):
    """(dtype, run, row) of moekit's own rows of one preset and stage (not the baselines, nor the
    fp8 file's bf16 reference rows, impl 'moekit-bf16')."""
    for run in runs:
        for row in run.rows:
            if row["preset"] == preset and row.get("stage") == stage and row.get("impl") == "moekit" and \
                    row.get("ms") is not None:
                yield _dtype(row), run, row


def roofline_series(runs: Sequence[Run], preset: str) -> dict:
    """{dtype: {"experts": [(T, ms)], "layer": [(T, ms)], "roof": [(T, roof ms)]}}, sorted by T. The
    layer is the CUDA-graph replay (`layer-graph`; `layer` where a run has no graph rows); the roof
    is the experts' (the layer's adds the router's few weight bytes)."""
    out: dict = {}
    for stage, key in (("experts", "experts"), ("layer-graph", "layer")):
        for dtype, run, row in _moekit_rows(runs, preset, stage):
            s = out.setdefault(dtype, {"experts": [], "layer": [], "roof": []})
            s[key].append((row["tokens"], row["ms"]))
            if key == "experts":
                roof = roof_ms(row, run.doc)
                if roof is not None:
                    s["roof"].append((row["tokens"], roof))
    for dtype, s in out.items():
        if not s["layer"]:
            s["layer"] = [(row["tokens"], row["ms"]) for d, _, row in _moekit_rows(runs, preset, "layer") if d == dtype]
        for k in s:
            s[k].sort()
    return out


def stage_breakdown(runs: Sequence[Run], preset: str) -> dict:
    """{dtype: {T: {stage: ms}}} of the stages timed alone (STAGES), moekit's rows."""
    out: dict = {}
    for stage in STAGES:
        for dtype, _, row in _moekit_rows(runs, preset, stage):
            out.setdefault(dtype, {}).setdefault(row["tokens"], {})[stage] = row["ms"]
    return {d: dict(sorted(by_t.items())) for d, by_t in sorted(out.items())}


def presets_of(runs: Sequence[Run]) -> list[str]:
    seen: dict = {}
    for run in runs:
        for row in run.rows:
            seen.setdefault(row["preset"], None)
    return list(seen)


# ---- drawing (matplotlib) --------------------------------------------------------------------

def _figure(width: float, height: float):
    # NOTES: a bare Figure, not pyplot: no global figure state, no GUI backend chosen, and the
    # module can draw inside a test process or a notebook without changing either.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _save(fig, path: str) -> str:
    fig.savefig(path, dpi=DPI, metadata={"Software": None})  # no version string: redraws compare equal
    return path


def _title(runs: Sequence[Run], preset: str) -> str:
    gpus = sorted({r.gpu for r in runs if any(row["preset"] == preset for row in r.rows)})
    return f"{preset} on {', '.join(gpus)}"


def plot_roofline(runs: Sequence[Run], preset: str, path: str) -> str:
    """roofline-<preset>.png: experts and layer ms per T against each dtype's roofline, log-log."""
    series = roofline_series(runs, preset)
    fig = _figure(8, 5)
    ax = fig.add_subplot()
    for dtype in sorted(series):
        s, color = series[dtype], DTYPE_COLORS.get(dtype, "black")
        for key, style, marker in (("experts", "-", "o"), ("layer", "--", "s")):
            if s[key]:
                t, ms = zip(*s[key])
                ax.plot(t, ms, style, marker=marker, markersize=4, color=color, label=f"{dtype} {key}")
        if s["roof"]:
            t, ms = zip(*s["roof"])
            ax.plot(t, ms, ":", color=color, linewidth=2, alpha=0.7, label=f"{dtype} roofline")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens T")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"{_title(runs, preset)}: time per T against the roofline\n"
                 "roofline = max(weight read time, FLOPs at the in-run dense ceiling; the FP8 one for fp8)",
                 fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, path)


def plot_stages(runs: Sequence[Run], preset: str, path: str) -> str:
    """stages-<preset>.png: per T, each stage's share of the stages' summed ms, stacked; a panel per dtype."""
    by_dtype = stage_breakdown(runs, preset)
    fig = _figure(8, 5)
    axes = fig.subplots(1, max(1, len(by_dtype)), sharey=True, squeeze=False)[0]
    for ax, (dtype, by_t) in zip(axes, by_dtype.items()):
        tokens = list(by_t)
        x = range(len(tokens))
        bottom = [0.0] * len(tokens)
        totals = [sum(by_t[t].values()) for t in tokens]
        for stage in STAGES:
            share = [100 * by_t[t].get(stage, 0.0) / tot if tot else 0.0 for t, tot in zip(tokens, totals)]
            if not any(share):
                continue
            ax.bar(x, share, bottom=bottom, color=STAGE_COLORS[stage], label=stage, width=0.75)
            bottom = [b + s for b, s in zip(bottom, share)]
        for i, tot in enumerate(totals):
            ax.text(i, 101, f"{tot:.3g}", ha="center", va="bottom", fontsize=6.5, rotation=90)
        ax.set_xticks(list(x), [str(t) for t in tokens], rotation=90, fontsize=8)
        ax.set_xlabel("tokens T")
        ax.set_ylim(0, 118)
        ax.set_title(dtype, fontsize=10)
    axes[0].set_ylabel("share of the stages' summed time (%)")
    handles, labels = axes[-1].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right center", fontsize=8)
    fig.suptitle(f"{_title(runs, preset)}: stage breakdown per T (each stage timed alone; sum in ms above)",
                 fontsize=10)
    return _save(fig, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moekit.plot", description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", metavar="BENCH_JSON", help="`moekit bench --json` files (bf16 and fp8)")
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for roofline-<preset>.png, stages-<preset>.png")
    ap.add_argument("--presets", help="comma-separated presets to draw (default: every preset in the files)")
    args = ap.parse_args(argv)
    try:
        runs = load(args.files)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    presets = presets_of(runs)
    if args.presets:
        wanted = [p for p in args.presets.split(",") if p]
        unknown = [p for p in wanted if p not in presets]
        if unknown:
            ap.error(f"--presets: {', '.join(unknown)} not in the files (they hold {', '.join(presets) or 'none'})")
        presets = wanted
    if not presets:
        ap.error("the files hold no rows")
    os.makedirs(args.out, exist_ok=True)
    for preset in presets:
        for draw, stem in ((plot_roofline, "roofline"), (plot_stages, "stages")):
            path = draw(runs, preset, os.path.join(args.out, f"{stem}-{preset}.png"))
            print(f"wrote {path} ({math.ceil(os.path.getsize(path) / 1024)} KB)")
    return 0


if __name__ == "__main__":
    if missing("moekit.plot", "matplotlib"):
        print(missing("moekit.plot", "matplotlib"), file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
