#!/usr/bin/env bash
# Prepared for the next session's first device call (not yet run): everything once more at session
# 4's final commit. Not run on a GPU after it: the router launcher's shared token-chunk loop
# (f70b1fe, host arithmetic only). On the nvidia-h200-x2 kind (if lent) the EP tests and bench
# run with R = 2; the EP code did not change in session 4, but its local GEMMs did (claimed items).
#   here:   scripts/stage-deps; cmake --build build -j2; mkdir -p .prebuilt;
#           cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/next-session.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 580 scripts/gpu-check --prebuilt .prebuilt --tokens 1,16,64,1024,4096,16384 \
  --presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 --ep-tokens 1,128,4096
