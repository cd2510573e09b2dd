"""scripts/ab on the CPU, with stand-in `moekit` binaries that write bench JSON: the sides' order
rotates round by round, several new builds each get their own table against old, the ratios are
the JSONs' own times, and a JSON written by another binary than its label's is a failure."""
import json
import os
import pathlib
import re
import stat
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
AB = ROOT / "scripts" / "ab"

# A stand-in for `moekit bench --preset P --tokens L --json PATH ...`: every stage's time is
# T * 1e-3 times the factor in the file `speed` beside it, its SM clock 1700 MHz over that factor;
# `lie` beside it writes another argv[0].
FAKE = r'''#!/usr/bin/env python3
import json, os, sys
here = os.path.dirname(os.path.abspath(sys.argv[0]))
a = sys.argv[1:]
preset, tokens, path = a[a.index("--preset") + 1], a[a.index("--tokens") + 1], a[a.index("--json") + 1]
speed = float(open(os.path.join(here, "speed")).read())
argv0 = "/elsewhere/moekit" if os.path.exists(os.path.join(here, "lie")) else sys.argv[0]
stages = (("backward", "backward-graph", "forward+backward", "backward-saved-h", "forward+backward-saved-h")
          if "--backward" in a else ("up", "down", "experts", "layer-graph"))
rows = [{"preset": preset, "tokens": int(t), "stage": s, "impl": "moekit", "ms": int(t) * 1e-3 * speed,
         "sm_clock_MHz": round(1700 / speed)} for t in tokens.split(",") for s in stages]
json.dump({"command": " ".join([argv0] + a), "gpu": "stand-in", "read_ceiling_TBps": 4.0,
           "dense_ceiling_TFLOPs": 700.0, "rows": rows}, open(path, "w"))
'''


def build(tmp, name, speed, lie=False):
    d = tmp / name
    d.mkdir()
    exe = d / "moekit"
    exe.write_text(FAKE)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    (d / "speed").write_text(str(speed))
    (d / "commit").write_text(f"{name}-commit\n")
    if lie:
        (d / "lie").write_text("")
    return d


def ab(tmp, *builds, rounds=3, bench_args=()):
    out = tmp / "out"
    extra = ["--", *bench_args] if bench_args else []
    r = subprocess.run([str(AB), *map(str, builds), "--presets", "p1,p2", "--tokens", "16,1024", "--rounds",
                        str(rounds), "--budget", "120", "--out", str(out), *extra], capture_output=True, text=True)
    return r, out


def test_several_new_builds_each_against_old(tmp_path):
    old, fast, slow = build(tmp_path, "old", 1.0), build(tmp_path, "fast", 0.9), build(tmp_path, "slow", 1.1)
    r, out = ab(tmp_path, old, fast, slow)
    assert r.returncode == 0, r.stdout + r.stderr
    # Rotation: round 1 old new1 new2, round 2 new1 new2 old, round 3 new2 old new1.
    starts = re.findall(r"^=== (\w+)-r(\d)-p1:", r.stdout, re.M)
    assert starts == [("old", "1"), ("new1", "1"), ("new2", "1"), ("new1", "2"), ("new2", "2"), ("old", "2"),
                      ("new2", "3"), ("old", "3"), ("new1", "3")]
    summary = (out / "summary.txt").read_text()
    assert "--- new1 (fast-commit) against old" in summary and "--- new2 (slow-commit) against old" in summary
    blocks = summary.split("--- ")[1:]
    for block, ratio in zip(blocks, (0.9, 1.1)):
        ratios = [float(m) for m in re.findall(r"^p\d +\d+ [\w-]+ +[\d.]+ +[\d.]+ +([\d.]+)", block, re.M)]
        assert len(ratios) == 2 * 2 * 4  # presets x T x stages
        assert all(abs(x - ratio) < 1e-3 for x in ratios)
    assert re.search(r"geomean new1/old: experts 0\.900.*geomean new2/old: experts 1\.100", summary)


def test_two_builds_keep_the_old_new_table(tmp_path):
    r, out = ab(tmp_path, build(tmp_path, "old", 1.0), build(tmp_path, "new", 0.95), rounds=2)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (out / "summary.txt").read_text()
    assert not re.search(r"^--- ", summary, re.M), "one new build: no per-build headers"
    assert re.search(r"^preset +T stage +old ms +new ms +new/old", summary, re.M)
    assert "geomean new/old: experts 0.950" in summary
    # each row with the SM clock both sides' timed steps ran at
    assert re.search(r"^p1 +16 up .*  MHz 1700/1789$", summary, re.M), summary
    assert re.findall(r"^=== (\w+)-r(\d)-p1:", r.stdout, re.M) == [("old", "1"), ("new", "1"), ("new", "2"), ("old", "2")]


def test_a_json_from_another_binary_fails_the_label_check(tmp_path):
    r, out = ab(tmp_path, build(tmp_path, "old", 1.0), build(tmp_path, "new", 1.0, lie=True), rounds=1)
    assert r.returncode == 1
    assert "labelled new" in (out / "summary.txt").read_text()


def test_backward_rows_are_tabled(tmp_path):
    # `-- --backward`: the bench writes the backward's five rows instead of the forward's stages.
    r, out = ab(tmp_path, build(tmp_path, "old", 1.0), build(tmp_path, "new", 0.8), rounds=1,
                bench_args=("--backward", "--no-baselines"))
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (out / "summary.txt").read_text()
    ratios = [float(m) for m in re.findall(r"^p\d +\d+ [\w+-]+ +[\d.]+ +[\d.]+ +([\d.]+)", summary, re.M)]
    assert len(ratios) == 2 * 2 * 5  # presets x T x the backward's rows
    assert all(abs(x - 0.8) < 1e-3 for x in ratios)
    assert "geomean new/old: backward-saved-h 0.800" in summary


# A stand-in for `ncu --csv ... EXE bench ...`: the process line ncu prints first, then two kernels
# per launch row in ncu's CSV (12 columns), each taking 1e6 ns times the `speed` beside EXE.
FAKE_NCU = r'''#!/usr/bin/env python3
import csv, os, sys
exe = next(a for a in sys.argv[1:] if a.endswith("/moekit"))
here = os.path.dirname(exe)
speed = float(open(os.path.join(here, "speed")).read())
shown = "/elsewhere/moekit" if os.path.exists(os.path.join(here, "lie")) else exe
with open(os.path.join(here, "ncu_args"), "a") as log:  # what each item asked the bench for
    log.write(" ".join(sys.argv[sys.argv.index(exe) + 1:]) + "\n")
print(f"==PROF== Connected to process 7 ({shown})")
w = csv.writer(sys.stdout, quoting=csv.QUOTE_ALL)
w.writerow(["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Metric Name", "Metric Unit", "Metric Value"])
asked = sys.argv[sys.argv.index("--metrics") + 1].split(",")
base_metrics = ["gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                "lts__t_sectors.avg.pct_of_peak_sustained_elapsed"]
assert asked[:3] == base_metrics, asked
for i, (kernel, base) in enumerate((("void moekit::kernels::gemm::wg<0>(P)", 2.0), ("void moekit::kernels::small(Q)", 0.1))):
    for launch in range(3):
        row = [i, 7, "moekit", "h", kernel, 1, 13, "(384, 1, 1)", "(132, 1, 1)", 0, "9.0"]
        w.writerow(row + ["gpu__time_duration.sum", "ns", f"{base * 1e6 * speed:.0f}"])
        w.writerow(row + ["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "%", f"{50 / speed:.1f}"])
        w.writerow(row + ["lts__t_sectors.avg.pct_of_peak_sustained_elapsed", "%", f"{40 / speed:.1f}"])
        for metric in asked[3:]:  # --ncu-metrics: 7 / speed each
            w.writerow(row + [metric, "%", f"{7 / speed:.2f}"])
'''


def fake_ncu(tmp):
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    ncu = bin_dir / "ncu"
    ncu.write_text(FAKE_NCU)
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def ab_ncu(tmp, *builds, rounds=0, items="p1:16384:backward,p2:1024", more=()):
    out = tmp / "out"
    r = subprocess.run([str(AB), *map(str, builds), "--presets", "p1", "--tokens", "16", "--rounds", str(rounds),
                        "--budget", "120", "--out", str(out), "--ncu", items, *more],
                       capture_output=True, text=True, env=fake_ncu(tmp))
    return r, out


def test_ncu_metrics_get_a_table_each_for_the_main_kernels(tmp_path):
    r, out = ab_ncu(tmp_path, build(tmp_path, "old", 1.0), build(tmp_path, "new", 0.5), items="p1:1024",
                    more=("--ncu-metrics", "l1tex__a.sum,smsp__b.avg"))
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (out / "summary.txt").read_text()
    for metric in ("l1tex__a.sum", "smsp__b.avg"):
        assert f"ncu p1:1024: {metric} (median a launch)" in summary, summary
    # old 7, new 14; small (0.1 ms against 2 ms: not over 5% of the slowest) has no row
    assert re.findall(r"^gemm::wg<0> +([\d.]+) +([\d.]+)$", summary, re.M) == [("7", "14")] * 2, summary
    assert not re.search(r"^small +[\d.]+ +[\d.]+$", summary, re.M)


def test_ncu_metrics_need_ncu_and_names(tmp_path):
    old, new = build(tmp_path, "old", 1.0), build(tmp_path, "new", 1.0)
    r = subprocess.run([str(AB), str(old), str(new), "--ncu-metrics", "a.b"], capture_output=True, text=True)
    assert r.returncode == 2 and "--ncu-metrics needs --ncu" in r.stderr, r.stderr
    r, _ = ab_ncu(tmp_path, old, new, more=("--ncu-metrics", "a b;rm"))
    assert r.returncode == 2 and "not a comma-separated list of ncu metric names" in r.stderr, r.stderr


def test_ncu_items_pick_the_bench_mode(tmp_path):
    old, new = build(tmp_path, "old", 1.0), build(tmp_path, "new", 0.8)
    r, out = ab_ncu(tmp_path, old, new, items="p1:16384:backward,p2:1024:fp8,p3:64")
    assert r.returncode == 0, r.stdout + r.stderr
    for side in (old, new):
        args = (side / "ncu_args").read_text().splitlines()
        assert [a.split(" --warmup")[0] for a in args] == [
            "bench --backward --preset p1 --tokens 16384", "bench --dtype fp8 --preset p2 --tokens 1024",
            "bench --preset p3 --tokens 64"], args
    assert "ncu p2:1024:fp8" in (out / "summary.txt").read_text()


def test_ncu_item_of_no_mode_is_refused_by_name(tmp_path):
    r, _ = ab_ncu(tmp_path, build(tmp_path, "old", 1.0), build(tmp_path, "new", 1.0), items="p1:16:fp16")
    assert r.returncode == 2 and "--ncu p1:16:fp16: not PRESET:T" in r.stderr, r.stderr


def test_ncu_tables_per_kernel_at_the_locked_clock(tmp_path):
    r, out = ab_ncu(tmp_path, build(tmp_path, "old", 1.0), build(tmp_path, "new", 0.8))
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (out / "summary.txt").read_text()
    assert "ncu p1:16384:backward" in summary and "ncu p2:1024" in summary
    assert not re.search(r"^preset +T stage", summary, re.M), "--rounds 0: no bench table"
    # per kernel: old ms, new ms, new/old, then the tensor pipe of each side, then its L2 throughput
    rows = re.findall(r"^gemm::wg<0> +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", summary, re.M)
    assert rows == [("2.000", "1.600", "0.800", "50.0", "62.5", "40.0", "50.0")] * 2, summary
    assert re.search(r"^small +0\.100 +0\.080 +0\.800", summary, re.M)


def test_ncu_of_another_binary_fails_the_label_check(tmp_path):
    r, out = ab_ncu(tmp_path, build(tmp_path, "old", 1.0), build(tmp_path, "new", 1.0, lie=True))
    assert r.returncode == 1
    assert "labelled new" in (out / "summary.txt").read_text()


def test_rounds_zero_needs_ncu(tmp_path):
    r, _ = ab(tmp_path, build(tmp_path, "old", 1.0), build(tmp_path, "new", 1.0), rounds=0)
    assert r.returncode == 2 and "--rounds 0 needs --ncu" in r.stderr
