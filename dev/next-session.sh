#!/usr/bin/env bash
# Prepared for the next session's first device call (not yet run): everything once more at the
# final commit of session 3, on the nvidia-h200-x2 kind if it is lent (EP with R = 2), else on one
# H200 (the EP multi-rank test then skips, visibly). What session 3 did not re-run after its last
# kernel change (the one-warp align): the GEMM tests (their inputs come from align, which its own
# tests showed bitwise equal to the oracle) and the two-process EP test.
#   here:   scripts/stage-deps; cmake --build build -j2; mkdir -p .prebuilt;
#           cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/next-session.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 560 scripts/gpu-check --prebuilt .prebuilt --tokens 1,4,16,64,1024,4096 --presets mixtral-8x7b,deepseek-v3 \
  --ep-tokens 1,16,128,1024
