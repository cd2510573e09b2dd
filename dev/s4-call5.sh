#!/usr/bin/env bash
# Session 4, call 5: the pipelined prefill gate kernel (E > 8) and the wgmma GEMM with the live
# warpgroups published by the producer (producer 64 / consumers 216 registers). Router, GEMM,
# forward and EP tests; sanitizers on the new kernels' small cases; the prefill table; ncu of the
# gate kernels at T=16384.
set -uo pipefail
cd "$(dirname "$0")/.."
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
timeout 240 .prebuilt/moekit_gpu_tests --gtest_filter='Router*:Sm90Gemm*:Forward*:Ep*' > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|exception|Expected|Which is" $OUT/gpu-tests.log | head -30
for tool in racecheck memcheck; do
  t0=$(date +%s)
  timeout 150 compute-sanitizer --tool $tool .prebuilt/moekit_gpu_tests \
    --gtest_filter='RouterTest.TensorCoreLogitsSmall:Sm90GemmTest.AdversarialRoutings:Sm90GemmTest.SmallIntegersAreExact' > $OUT/san-$tool.log 2>&1
  echo "$tool rc=$? ($(( $(date +%s)-t0 )) s): $(grep -E 'SUMMARY' $OUT/san-$tool.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)' $OUT/san-$tool.log | tr '\n' ' ')"
done
for preset in deepseek-v3 qwen3-30b-a3b mixtral-8x7b; do
  t0=$(date +%s)
  timeout 150 .prebuilt/moekit bench --preset $preset --tokens 1024,4096,16384 --no-baselines --json $OUT/bench-$preset.json > $OUT/bench-$preset.log 2>&1
  echo "=== bench $preset rc=$? ($(( $(date +%s)-t0 )) s)"
  grep -E "^(deepseek|qwen|mixtral)" $OUT/bench-$preset.log | grep -E " router | up | down | experts | layer-graph " | awk '{printf "%s %s %-12s %s %s %s\n",$1,$2,$3,$5,$7,$10}'
done
for spec in "deepseek-v3 16384" "qwen3-30b-a3b 16384"; do
  set -- $spec
  timeout 60 ncu --cache-control none --clock-control none -k regex:gate_logits -c 1 \
    --metrics gpu__time_duration.sum,lts__t_bytes.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread \
    --csv .prebuilt/moekit check --preset $1 --tokens $2 > $OUT/ncu-gate-$1.csv 2> $OUT/ncu-gate-$1.err
  echo "=== ncu gate $1 T=$2"; grep -E "gate" $OUT/ncu-gate-$1.csv | awk -F'","' '{print substr($5,1,40), $(NF-2), $(NF-1), $NF}' | tr -d '"'
done
