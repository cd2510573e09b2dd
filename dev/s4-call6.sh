#!/usr/bin/env bash
# Session 4, call 6: the pipelined gate kernel with each slice's x rows prefetched into L2 a slice
# ahead, and used only from 64 CTAs. Router tests and their sanitizers; the prefill table; ncu.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
timeout 200 .prebuilt/moekit_gpu_tests --gtest_filter='Router*' > $OUT/gpu-tests.log 2>&1
echo "router tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|exception|Expected|Which is" $OUT/gpu-tests.log | head -30
for tool in racecheck memcheck; do
  t0=$(date +%s)
  timeout 120 compute-sanitizer --tool $tool .prebuilt/moekit_gpu_tests --gtest_filter='RouterTest.TensorCoreLogitsSmall' > $OUT/san-$tool.log 2>&1
  echo "$tool rc=$? ($(( $(date +%s)-t0 )) s): $(grep -E 'SUMMARY' $OUT/san-$tool.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)' $OUT/san-$tool.log | tr '\n' ' ')"
done
for preset in deepseek-v3 qwen3-30b-a3b; do
  t0=$(date +%s)
  timeout 150 .prebuilt/moekit bench --preset $preset --tokens 1024,2048,4096,16384 --no-baselines --json $OUT/bench-$preset.json > $OUT/bench-$preset.log 2>&1
  echo "=== bench $preset rc=$? ($(( $(date +%s)-t0 )) s)"
  grep -E "^(deepseek|qwen|mixtral)" $OUT/bench-$preset.log | grep -E " router | align | combine | experts | layer-graph " | awk '{printf "%s %s %-12s %s %s\n",$1,$2,$3,$5,$10}'
done
for spec in "deepseek-v3 16384" "qwen3-30b-a3b 16384"; do
  set -- $spec
  timeout 60 ncu --cache-control none --clock-control none -k regex:gate_logits -c 1 \
    --metrics gpu__time_duration.sum,lts__t_bytes.sum,dram__bytes_read.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed \
    --csv .prebuilt/moekit check --preset $1 --tokens $2 > $OUT/ncu-gate-$1.csv 2> $OUT/ncu-gate-$1.err
  echo "=== ncu gate $1 T=$2"; grep -E "gate" $OUT/ncu-gate-$1.csv | awk -F'","' '{print substr($5,1,40), $(NF-2), $(NF-1), $NF}' | tr -d '"'
done
