#!/usr/bin/env bash
# Session 7, device call 3. Call 2's A/B: the cross-item K-stream made every decode GEMM faster
# alone (up 1-8%, down 1-8%), and the layer graph faster at T >= 2, but slower at T = 1
# (Qwen3-30B-A3B 37.2 -> 41.3 us). One suspect: the change also dropped the kernel's 4*BM bytes
# of s_ids from its shared memory, and a waiting (PDL) down CTA of 16x64 (82,944 B with the
# reserve) now fits exactly beside three 16x32 up CTAs. Variant C (.prebuilt-c) keeps the old
# shared-memory size. old / new / C, alternating, twice; the decode points that moved.
# Meanwhile the Python package builds (CPU only); its GPU tests run after the benchmarks.
#   device: carry [".deps", ".prebuilt", ".prebuilt-old", ".prebuilt-c"], command "dev/s7-call3.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/s7c3
mkdir -p "$L"
sum=()
export PATH=/usr/local/cuda/bin:$PATH CUDACXX=/usr/local/cuda/bin/nvcc CMAKE_BUILD_PARALLEL_LEVEL=12 PIP_BREAK_SYSTEM_PACKAGES=1
( python3 -m pip install --no-build-isolation --no-deps --no-index -v . > "$L/python-build.log" 2>&1; echo "rc=$?" > "$L/python-build.rc" ) &
build=$!
for rep in 1 2; do
  for bin in old new c; do
    exe=.prebuilt/moekit; [ $bin = old ] && exe=.prebuilt-old/moekit; [ $bin = c ] && exe=.prebuilt-c/moekit
    for pt in qwen3-30b-a3b:1,2,8 mixtral-8x7b:1,2,8 deepseek-v3:1,4; do
      p=${pt%%:*} t=${pt#*:}
      t0=$(date +%s)
      timeout 60 $exe bench --preset $p --tokens $t --no-baselines \
        --json "$L/bench-$bin$rep-$p.json" > "$L/bench-$bin$rep-$p.log" 2>&1
      sum+=("bench $bin$rep $p: rc=$? $(( $(date +%s) - t0 )) s")
    done
  done
done
python3 - "$L" <<'PY' | tee "$OUT/summary.txt"
import json, glob, sys, os
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/bench-*.json")):
    run = os.path.basename(f).split("-")[1]
    for r in json.load(open(f))["rows"]:
        if r["impl"] == "moekit" and r["stage"] in ("up", "down", "experts", "layer-graph"):
            rows.setdefault((r["preset"], r["tokens"], r["stage"]), {})[run] = r["ms"] * 1e3
print("us")
for k in sorted(rows):
    print("%-14s %3d %-11s " % k + "  ".join("%s %.1f" % kv for kv in sorted(rows[k].items())))
PY
wait $build
sum+=("python build: $(cat "$L/python-build.rc")")
timeout 200 python3 -m pytest -q -rs tests/python > "$L/python-tests.log" 2>&1
sum+=("python tests: rc=$? $(tail -1 "$L/python-tests.log")")
tail -15 "$L/python-tests.log"
grep -q "^nanobind: leaked" "$L/python-tests.log" && sum+=("python: nanobind reported leaks")
tar czf "$OUT/logs.tgz" -C "$(dirname "$L")" s7c3
printf '\n=== summary\n'; printf '%s\n' "${sum[@]}"
