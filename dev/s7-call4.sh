#!/usr/bin/env bash
# Session 7, device call 4. Call 3 ruled out the shared-memory suspect (variant C = new). The
# other difference: the cross-item kernel inlined its loader in the unrolled prologue and the loop
# (4096+ SASS instructions against the old kernel's 1,500-2,700), and the T=1 layers, whose CTAs
# run one item each, lost their up -> down overlap. Now every piece is inlined once (old size,
# 120-154 registers). Tests, then old / new, alternating, twice, on call 3's points; then memcheck
# and racecheck of the GEMM tests.
#   device: carry [".deps", ".prebuilt", ".prebuilt-old"], command "dev/s7-call4.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
P=.prebuilt
L=$(mktemp -d)/s7c4
mkdir -p "$L"
sum=()
t0=$(date +%s)
timeout 150 $P/moekit_gpu_tests --gtest_filter='GemmTest*:ForwardTest.BitwiseDeterministicAcrossRuns:ForwardTest.CudaGraphCaptureAndReplayOnNewInputs:ForwardTest.SplitKDecodeLayer' > "$L/gemm-tests.log" 2>&1
rc=$?
sum+=("gemm tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$L/gemm-tests.log" | tr '\n' ' ') $(( $(date +%s) - t0 )) s")
grep -E "FAILED|Failure" "$L/gemm-tests.log" | head -20
if [ $rc = 0 ]; then
  for rep in 1 2; do
    for bin in old new; do
      exe=$P/moekit; [ $bin = old ] && exe=.prebuilt-old/moekit
      for pt in qwen3-30b-a3b:1,2,8,16 mixtral-8x7b:1,2,8,16 deepseek-v3:1,4; do
        p=${pt%%:*} t=${pt#*:}
        t0=$(date +%s)
        timeout 60 $exe bench --preset $p --tokens $t --no-baselines \
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
        if r["impl"] == "moekit" and r["stage"] in ("up", "down", "experts", "layer-graph"):
            rows.setdefault((r["preset"], r["tokens"], r["stage"]), {})[run] = r["ms"] * 1e3
print("us")
for k in sorted(rows):
    print("%-14s %3d %-11s " % k + "  ".join("%s %.1f" % kv for kv in sorted(rows[k].items())))
PY
for tool in memcheck racecheck; do
  t0=$(date +%s)
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 99 $P/moekit_gpu_tests \
    --gtest_filter='GemmTest.AdversarialRoutings:GemmTest.ManyItemsPerCta' > "$L/sanitize-$tool.log" 2>&1
  sum+=("$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/sanitize-$tool.log" | tail -1) $(( $(date +%s) - t0 )) s")
done
tar czf "$OUT/logs.tgz" -C "$(dirname "$L")" s7c4
printf '\n=== summary\n'; printf '%s\n' "${sum[@]}"
