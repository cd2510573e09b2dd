#!/usr/bin/env bash
# Session 7, device call 2: the mma.sync (decode) GEMM's K-stream runs across work items — the
# next item's first K-tiles load while the current item finishes, its routing fetched an item
# ahead. Tests first (every config against the oracle, incl. the new many-items-per-CTA case,
# determinism, graph replay, split-K); then the decode rows of every preset, A/B against the
# binary without it (.prebuilt-old, built at 03b946e), alternating old/new twice, no baselines;
# then memcheck and racecheck of the GEMM tests if time is left.
#   here:   .prebuilt-old from 03b946e (moekit, moekit_gpu_tests); .prebuilt from the change
#   device: carry [".deps", ".prebuilt", ".prebuilt-old"], command "dev/s7-call2.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
P=.prebuilt
L=$(mktemp -d)/s7
mkdir -p "$L"
sum=()
start=$(date +%s)
t0=$(date +%s)
timeout 150 $P/moekit_gpu_tests --gtest_filter='GemmTest*:ForwardTest.BitwiseDeterministicAcrossRuns:ForwardTest.CudaGraphCaptureAndReplayOnNewInputs:ForwardTest.SplitKDecodeLayer' > "$L/gemm-tests.log" 2>&1
rc=$?
sum+=("gemm tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$L/gemm-tests.log" | tr '\n' ' ') $(( $(date +%s) - t0 )) s")
grep -E "FAILED|Failure" "$L/gemm-tests.log" | head -20
if [ $rc = 0 ]; then
  for rep in 1 2; do
    for bin in old new; do
      exe=$P/moekit; [ $bin = old ] && exe=.prebuilt-old/moekit
      for p in deepseek-v3 mixtral-8x7b qwen3-30b-a3b; do
        t0=$(date +%s)
        timeout 80 $exe bench --preset $p --tokens 1,2,4,8,16,32,64 --no-baselines \
          --json "$L/bench-$bin$rep-$p.json" > "$L/bench-$bin$rep-$p.log" 2>&1
        sum+=("bench $bin$rep $p: rc=$? $(( $(date +%s) - t0 )) s")
      done
    done
  done
fi
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
for tool in memcheck racecheck; do
  left=$(( 540 - ($(date +%s) - start) ))
  [ $left -lt 40 ] && { sum+=("$tool: skipped (time)"); continue; }
  filter='GemmTest.AdversarialRoutings:GemmTest.ManyItemsPerCta'
  t0=$(date +%s)
  timeout $(( left - 20 )) compute-sanitizer --tool $tool --error-exitcode 99 $P/moekit_gpu_tests \
    --gtest_filter="$filter" > "$L/sanitize-$tool.log" 2>&1
  sum+=("$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/sanitize-$tool.log" | tail -1) $(( $(date +%s) - t0 )) s")
done
tar czf "$OUT/logs.tgz" -C "$(dirname "$L")" s7
printf '\n=== summary\n'; printf '%s\n' "${sum[@]}"
