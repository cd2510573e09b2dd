#!/usr/bin/env bash
# Session 4, call 8: the pipelined gate kernel with its step table in shared memory (4 steps x 4
# stages). Router tests (bitwise batch invariance against the cluster kernels), its sanitizers,
# ncu time against call 7 (477 / 128 / 110 µs).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
timeout 200 .prebuilt/moekit_gpu_tests --gtest_filter='Router*' > $OUT/gpu-tests.log 2>&1
echo "router tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|exception|Expected|Which is" $OUT/gpu-tests.log | head -20
timeout 100 compute-sanitizer --tool racecheck .prebuilt/moekit_gpu_tests --gtest_filter='RouterTest.TensorCoreLogitsSmall' > $OUT/san-racecheck.log 2>&1
echo "racecheck rc=$?: $(grep -E 'SUMMARY' $OUT/san-racecheck.log | tail -1)"
for spec in "deepseek-v3 16384" "deepseek-v3 4096" "qwen3-30b-a3b 16384"; do
  set -- $spec
  timeout 60 ncu --cache-control none --clock-control none -k regex:gate_logits -c 1 \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active \
    --csv .prebuilt/moekit check --preset $1 --tokens $2 --check-tokens 4 > $OUT/ncu-$1-$2.csv 2>/dev/null
  echo "$1 T=$2: $(grep -E 'gate' $OUT/ncu-$1-$2.csv | awk -F'","' '{print $(NF-2)"="$NF}' | tr -d '"' | tr '\n' ' ')"
done
