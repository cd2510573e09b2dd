"""scripts/perf-summary on the run of record (docs/perf/latest/bench-*.json), on the CPU: the
x_roof table has a row per file and a column per T, its cells are the JSON's own x_roof (experts
and the layer as a CUDA graph), a value above issue 19's bounds is marked, and the default table
runs on files without cuBLAS baselines (the fp8 ones); a `--skew` file gets the table of its
experts' x_roof against the busiest expert's floor."""
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "perf-summary"
FILES = sorted((ROOT / "docs" / "perf" / "latest").glob("bench-*-*.json"))


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, check=True).stdout


def test_x_roof_table_is_the_json_x_roof():
    files = [f for f in FILES if f.name.endswith(("-bf16.json", "-fp8.json"))]
    assert files
    out = run("--x-roof", *files)
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| preset")
            and not line.startswith("| ---")]
    assert len(rows) == len(files)
    docs = [json.load(open(f)) for f in files]
    tokens = sorted({r["tokens"] for d in docs for r in d["rows"]})  # the columns: every file's T
    for d, line in zip(docs, rows):
        by = {(r["tokens"], r["stage"]): r for r in d["rows"] if r["impl"] == "moekit"}
        cells = [c.strip() for c in line.strip("|").split("|")][2:-1]
        assert len(cells) == len(tokens)
        for t, cell in zip(tokens, cells):
            if (t, "experts") not in by:
                assert cell == "—"
                continue
            a, b = (float(re.sub(r"\*$", "", x.strip())) for x in cell.split("/"))
            assert abs(a - by[(t, "experts")]["x_roof"]) < 0.006 and abs(b - by[(t, "layer-graph")]["x_roof"]) < 0.006
            assert ("*" in cell.split("/")[0]) == (by[(t, "experts")]["x_roof"] > 1.15)
            assert ("*" in cell.split("/")[1]) == (by[(t, "layer-graph")]["x_roof"] > 1.20)
    assert re.search(r"^(\d+) value\(s\) above the bounds$", out, re.M)


def test_default_table_runs_on_every_file():
    for f in FILES:
        if f.name.endswith(("-bf16.json", "-fp8.json")):
            assert "| preset | T | experts ms" in run(f)


def test_skewed_file_gets_the_busiest_expert_table(tmp_path):
    src = next(f for f in FILES if f.name.endswith("-bf16.json"))
    d = json.load(open(src))
    for i, r in enumerate(d["rows"]):
        r["skew"] = True
        r["x_roof_busiest"] = 0.5 + i * 1e-3  # distinct per row, so a cell names its own row
    skewed = tmp_path / "bench-skew.json"
    skewed.write_text(json.dumps(d))
    out = run("--x-roof", src, skewed)
    assert "skewed routing: experts x_roof / x_roof against the busiest expert's floor" in out
    line = next(l for l in out.splitlines() if l.startswith(f"| {d['rows'][0]['preset']} | bf16 skew |")
                and "/" in l and l.count("|") == len({r['tokens'] for r in d['rows']}) + 3)
    by = {r["tokens"]: r for r in d["rows"] if r["stage"] == "experts" and r["impl"] == "moekit"}
    cells = [c.strip() for c in line.strip("|").split("|")][2:]
    for t, cell in zip(sorted(by), cells):
        a, b = (float(x) for x in cell.split("/"))
        assert abs(a - by[t]["x_roof"]) < 0.006 and abs(b - by[t]["x_roof_busiest"]) < 0.006


def test_tiles_table_counts_padding_tails_and_waves(tmp_path):
    # Four experts of 128, 129, 64 and 1 rows on the 128 x 256 wgmma tile: warpgroup rows 128 + 192
    # + 64 + 64 = 448, blocks 1 + 2 + 1 + 1 = 5 (640 tile rows), tail blocks (64 or fewer rows in
    # an expert's last block) 3; up's 128 act columns a tile at F = 128: 5 tiles on 132 SMs; every
    # tile's FLOPs at 500 TFLOP/s take 1e12 x 640 / 322 / 5e14 s = 3.975 ms, so 7.950 ms is 2.00x.
    # A decode (mma.sync) row has no such table row.
    counts = [128, 129, 64, 1]
    row = {"preset": "p", "dtype": "bf16", "tokens": 161, "stage": "up", "impl": "moekit", "ms": 7.950,
           "x_roof": 1.5, "flops": 1e12, "tokens_per_expert": counts, "hidden": 256, "inter": 128,
           "config": "T=161 up=wgmma-m128n256k64w12x1s4 down=wgmma-m128n256k64w12x1s4 source=given"}
    decode = dict(row, tokens=1, config="T=1 up=m16n64k128w1x4s4 down=m16n64k128w1x4s4")
    doc = {"command": "moekit bench --preset p --json x", "date": "-", "gpu": "-", "sm_count": 132,
           "read_ceiling_TBps": 3.0, "dense_ceiling_TFLOPs": 500.0, "rows": [row, decode]}
    path = tmp_path / "bench-p-bf16.json"
    path.write_text(json.dumps(doc))
    lines = [l for l in run("--tiles", path).splitlines() if l.startswith("| p |")]
    assert len(lines) == 1
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[2:] == ["161", "up", "7.950", "1.50", f"{448 / 322:.3f}", f"{640 / 322:.3f}", "3 of 5", "0.0", "2.00"]
