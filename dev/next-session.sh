#!/usr/bin/env bash
# Prepared for the next session's first device call (not yet run): everything once more at session
# 4's final commit, then issue 4's skew target, never measured yet (--skew: loads 0.5-1.5x the
# mean, one expert at 4x; compare with the uniform rows of the same run).
# Not run on a GPU after session 4's last device call: f70b1fe (the router launcher's shared
# token-chunk loop, host arithmetic only) and 0c62c10 (dev/sm90_gemm_bench's counter). On the
# nvidia-h200-x2 kind (if lent) the EP tests and bench run with R = 2.
#   here:   scripts/stage-deps; cmake --build build -j2; mkdir -p .prebuilt;
#           cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/next-session.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 450 scripts/gpu-check --prebuilt .prebuilt --tokens 1,64,1024,4096,16384 \
  --presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 --ep-tokens 1,128,4096
S=$(mktemp -d)/skew; mkdir -p $S  # the device returns at most 8 files: one archive for these
for preset in mixtral-8x7b qwen3-30b-a3b deepseek-v3; do
  timeout 60 .prebuilt/moekit bench --preset $preset --tokens 4096,16384 --skew --no-baselines \
    --json $S/bench-skew-$preset.json > $S/bench-skew-$preset.log 2>&1
  echo "=== skew $preset rc=$?"; grep -E "^skew:|experts +moekit" $S/bench-skew-$preset.log
done
tar czf $OUT/skew.tgz -C $(dirname $S) skew
