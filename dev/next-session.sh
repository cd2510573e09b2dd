#!/usr/bin/env bash
# Prepared for the next session's first device call (not yet run). Session 5's last device call
# (dev/s5-final.sh) ran its kernels at 2600403; after it only 63eebb7 changed device code (one
# grouped-top-k scan shared by both selection kernels: same operations, different register
# allocation), and 2ff81fb added router test cases (ties, group shapes, NaNs, T = 1025), none run
# yet, so the GPU tests come first. Then the decode bench (small stages) and the prefill
# rows once more. The Python package's GPU tests have not run since session 3: run
# `scripts/python-check` (PYTHON_BENCH=0) as the second call.
#   here:   scripts/stage-deps; cmake --build build -j2; mkdir -p .prebuilt;
#           cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/next-session.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 560 scripts/gpu-check --prebuilt .prebuilt --tokens 1,4,16,64,4096 \
  --presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 --ep-tokens 1,128,4096
