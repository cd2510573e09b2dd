#!/usr/bin/env bash
# Session 3, call 6 (one H200): the one-warp decode align (tests: align against the oracle around
# both switches, the forward layer, EP with R = 1, combine), then the small stages of the three
# presets at decode sizes (router + align + combine in-graph) against docs/perf/2026-11-29-final.
set -uo pipefail
cd "$(dirname "$0")/.."
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
timeout 240 .prebuilt/moekit_gpu_tests --gtest_filter='AlignTest.*:ForwardTest.*:EpTest.*:CombineTest.*:RouterTest.*' \
  > $OUT/tests.log 2>&1; echo "tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" $OUT/tests.log | head -30
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 99 .prebuilt/moekit_gpu_tests \
  --gtest_filter='AlignTest.WarpAndCtaKernelsAroundTheSwitch' > $OUT/racecheck.log 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY' $OUT/racecheck.log | tail -1)"
for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3; do
  timeout 90 .prebuilt/moekit bench --preset $p --tokens 1,4,16,64 --no-baselines --json $OUT/bench-$p.json \
    > $OUT/bench-$p.log 2>&1; echo "bench $p rc=$?"
  grep -E " (router|align|combine|experts|layer-graph) " $OUT/bench-$p.log | grep moekit
done
