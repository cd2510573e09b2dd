#!/usr/bin/env bash
# Session 3, call 7 (one H200): the warp align with coalesced fills (align tests against the
# oracle, the forward and EP tests that run it), then the decode small stages of every preset.
set -uo pipefail
cd "$(dirname "$0")/.."
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
timeout 150 .prebuilt/moekit_gpu_tests --gtest_filter='AlignTest.*:ForwardTest.*:EpTest.*' > $OUT/tests.log 2>&1
echo "tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" $OUT/tests.log | head -30
for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3; do
  timeout 60 .prebuilt/moekit bench --preset $p --tokens 1,4,16,64 --no-baselines --json $OUT/bench-$p.json \
    > $OUT/bench-$p.log 2>&1; echo "bench $p rc=$?"
  grep -E " (router|align|combine) " $OUT/bench-$p.log | grep moekit | awk '{printf "%s T=%s %s %.1f us\n", $1, $2, $3, $5*1000}'
done
