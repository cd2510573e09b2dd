#!/usr/bin/env bash
# Session 3, call 3 (nvidia-h200-x2): EP under compute-sanitizer (memcheck, racecheck) on its own,
# then scripts/gpu-check: every GPU test (EP R = 1 and R = 2 included), memcheck, CPU tests, and
# `moekit bench --ep 2` for every preset (the single-GPU bench is skipped: --tokens none).
set -uo pipefail
cd "$(dirname "$0")/.."
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
for tool in memcheck racecheck; do
  t0=$(date +%s)
  LD_LIBRARY_PATH=$nccl_dir timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 .prebuilt/moekit_gpu_tests \
    --gtest_filter='EpTest.BadArgumentsAreNamed' > $OUT/ep-$tool.log 2>&1
  echo "EP $tool rc=$? ($(( $(date +%s)-t0 )) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/ep-$tool.log | tail -1)"
done
timeout 420 scripts/gpu-check --prebuilt .prebuilt --skip-racecheck --tokens none --ep-tokens 1,16,128,1024,4096
