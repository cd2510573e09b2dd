#!/usr/bin/env bash
# Session 8, device call 2: the wgmma (prefill) GEMM's epilogue. (1) SiLU without the IEEE
# division's slow-path branch (common/silu.cuh; same bits as canon::silu, checked on all 2^32
# floats by GpuSilu); (2) the next tile's row ids loaded before this tile's epilogue and Down's
# routing weights under the first k-step, so no id -> weight load chain stalls the next tile's
# first proxy fence. Tests (new binary), then A/B of the prefill rows against the binary without
# it (.prebuilt = dfce531), then ncu of Qwen3 T=4096's two wgmma GEMMs with both binaries.
#   here:   .prebuilt from dfce531; .prebuilt-new from the change
#   device: carry [".deps", ".prebuilt", ".prebuilt-new"], command "dev/s8-call2.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/s8
mkdir -p "$L"
sum=()
start=$(date +%s)
t0=$(date +%s)
timeout 120 .prebuilt-new/moekit_gpu_tests --gtest_filter='GpuSilu*:Sm90Gemm*:GemmTest*:ForwardTest.BitwiseDeterministicAcrossRuns:ForwardTest.CudaGraphCaptureAndReplayOnNewInputs' > "$L/tests.log" 2>&1
rc=$?
sum+=("tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$L/tests.log" | tr '\n' ' ') $(( $(date +%s) - t0 )) s")
grep -E "FAILED|Failure|mismatch" "$L/tests.log" | head -20
if [ $rc = 0 ]; then
  for spec in "qwen3-30b-a3b old" "qwen3-30b-a3b new" "mixtral-8x7b old" "mixtral-8x7b new" "deepseek-v3 old" \
              "deepseek-v3 new" "qwen3-30b-a3b old2" "qwen3-30b-a3b new2"; do
    set -- $spec
    exe=.prebuilt-new/moekit; case $2 in old*) exe=.prebuilt/moekit;; esac
    [ $(( $(date +%s) - start )) -gt 420 ] && { sum+=("bench $2 $1: skipped (time)"); continue; }
    t0=$(date +%s)
    timeout 90 $exe bench --preset $1 --tokens 1024,4096,16384 --no-baselines --warmup 5 --steps 20 \
      --json "$L/bench-$2-$1.json" > "$L/bench-$2-$1.log" 2>&1
    sum+=("bench $2 $1: rc=$? $(( $(date +%s) - t0 )) s")
  done
fi
python3 - "$L" <<'PY' | tee "$OUT/summary.txt"
import json, glob, sys, os
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/bench-*.json")):
    run = os.path.basename(f).split("-")[1]
    for r in json.load(open(f))["rows"]:
        if r["impl"] == "moekit" and r["stage"] in ("up", "down", "experts", "layer-graph"):
            rows.setdefault((r["preset"], r["tokens"], r["stage"]), {})[run] = (r["ms"] * 1000, r.get("frac_dense") or 0)
print("us (fraction of the in-run dense ceiling)")
for k in sorted(rows):
    print("%-14s %5d %-11s " % k + "  ".join("%s %.1f (%.3f)" % (n, v[0], v[1]) for n, v in sorted(rows[k].items())))
PY
for bin in new old; do
  left=$(( 560 - ($(date +%s) - start) ))
  [ $left -lt 50 ] && { sum+=("ncu $bin: skipped (time)"); continue; }
  exe=.prebuilt-new/moekit; [ $bin = old ] && exe=.prebuilt/moekit
  t0=$(date +%s)
  timeout $(( left - 10 )) ncu --clock-control none -k regex:sm90_expert_gemm -c 2 --section SpeedOfLight \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    $exe bench --preset qwen3-30b-a3b --tokens 4096 --no-baselines --warmup 0 --steps 1 > "$L/ncu-$bin.txt" 2>&1
  sum+=("ncu $bin: rc=$? $(( $(date +%s) - t0 )) s")
  cp "$L/ncu-$bin.txt" "$OUT/"
done
tar czf "$OUT/logs.tgz" -C "$(dirname "$L")" s8
printf '\n=== summary\n'; printf '%s\n' "${sum[@]}"
