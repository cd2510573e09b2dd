#!/usr/bin/env bash
# Session 6, device call 4: even waves for the mma.sync (decode) expert GEMM — the items dealt to
# as few CTAs as keep ceil(items / grid) each. The mma.sync GEMM tests, then the decode rows of
# every preset, A/B against the binary without it (.prebuilt/moekit-base, built at 86abc85),
# alternating base/new twice, no baselines.
#   here:   cmake --build build -j2 at 86abc85; cp build/moekit .prebuilt/moekit-base; then with the
#           change: cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/s6-call4.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
P=.prebuilt
L=$(mktemp -d)/s6
mkdir -p "$L"
sum=()
t0=$(date +%s)
timeout 150 $P/moekit_gpu_tests --gtest_filter='GemmTest*:ForwardTest.BitwiseDeterministicAcrossRuns:ForwardTest.CudaGraphCaptureAndReplayOnNewInputs:ForwardTest.SplitKDecodeLayer' > "$L/gemm-tests.log" 2>&1
sum+=("gemm tests: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$L/gemm-tests.log" | tr '\n' ' ') $(( $(date +%s) - t0 )) s")
for rep in 1 2; do
  for bin in base new; do
    exe=$P/moekit; [ $bin = base ] && exe=$P/moekit-base
    for p in deepseek-v3 mixtral-8x7b qwen3-30b-a3b; do
      t0=$(date +%s)
      timeout 80 $exe bench --preset $p --tokens 1,2,4,8,16,32,64 --no-baselines \
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
        if r["impl"] == "moekit" and r["stage"] in ("up", "down", "experts") and r.get("read_time_ms"):
            rows.setdefault((r["preset"], r["tokens"], r["stage"]), {})[run] = r["ms"] / r["read_time_ms"]
print("ms / read time of the same bytes (issue 3's definition)")
for k in sorted(rows):
    print("%-14s %3d %-8s " % k + "  ".join("%s %.3f" % kv for kv in sorted(rows[k].items())))
PY
tar czf "$OUT/logs.tgz" -C "$(dirname "$L")" s6
printf '\n=== summary\n'; printf '%s\n' "${sum[@]}"
