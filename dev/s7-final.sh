#!/usr/bin/env bash
# Session 7's last device call: the whole check (GPU tests, sanitizers, CPU tests) and the decode
# rows T = 1-64 plus T = 4096 of every preset, with the mma.sync GEMM's cross-item K-stream
# (calls 2-4: A/B in docs/perf/2026-11-29-s7/) and its next-item decode kept from the routing
# fetch (one item_at per item for the loader). No EP rows, no T = 1024 / 16384 (the prefill
# kernels did not change).
#   here:   cmake --build build -j2; cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/s7-final.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 560 scripts/gpu-check --prebuilt .prebuilt --tokens 1,2,4,8,16,32,64,4096 \
  --presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 --ep-tokens none
