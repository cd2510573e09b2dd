#!/usr/bin/env bash
# Session 4, final call: everything at the session's final kernels (commit a5db5f3's binaries):
# all GPU tests, memcheck + racecheck, and the prefill table with the in-run baselines for every
# preset, T = 128..16384 (issue 4: T = 1024, 4096, 16384; the crossover at 128, 256, 512).
#   here:   cmake --build build -j2; cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/s4-final.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 560 scripts/gpu-check --prebuilt .prebuilt --tokens 128,256,512,1024,4096,16384 \
  --presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 --ep-tokens none
