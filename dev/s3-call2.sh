#!/usr/bin/env bash
# Session 3, call 2 (nvidia-h200-x2): the EP tests (R = 1 in process, R = 2 as two processes),
# the stages touched by the align/combine refactor, then `moekit bench --ep 2` for two presets.
set -uo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
ls -la $nccl_dir 2>&1 | head -3
export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
timeout 240 .prebuilt/moekit_gpu_tests --gtest_filter='Ep*' > $OUT/ep-tests.log 2>&1; echo "EP tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED|  OK  ) |Failure|error|Expected|Which is|rank" $OUT/ep-tests.log | head -60
t0=$(date +%s)
timeout 200 .prebuilt/moekit_gpu_tests --gtest_filter='CombineTest.*:AlignTest.*:ForwardTest.*' > $OUT/stage-tests.log 2>&1
echo "stage tests rc=$? ($(( $(date +%s)-t0 )) s)"; grep -E "^\[  (FAILED|PASSED) " $OUT/stage-tests.log | head
for p in mixtral-8x7b deepseek-v3; do
  t0=$(date +%s)
  timeout 150 .prebuilt/moekit bench --ep 2 --preset $p --tokens 1,16,128,1024,4096 --steps 20 --warmup 5 \
    --json $OUT/bench-ep2-$p.json > $OUT/bench-ep2-$p.log 2>&1
  echo "bench --ep 2 $p rc=$? ($(( $(date +%s)-t0 )) s)"; tail -12 $OUT/bench-ep2-$p.log
done
