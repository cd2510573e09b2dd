#!/usr/bin/env bash
# Session 8's last device call: the whole check (GPU tests incl. GpuSilu, sanitizers, CPU tests)
# and the decode rows T = 1-64 plus T = 4096 of every preset, at 1a82d98 (the wgmma epilogue's
# branch-free SiLU and ids prefetch; the decode table re-tuned in call 1). No EP rows; T = 1024 /
# 16384 come from call 4's base binary (the same code), docs/perf/2026-11-29-s8/.
#   here:   cmake --build build -j2; cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/s8-final.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 460 scripts/gpu-check --prebuilt .prebuilt --tokens 1,2,4,8,16,32,64,4096 \
  --presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 --ep-tokens none
