#!/usr/bin/env bash
# Session 5's benchmark of record: every GPU test, the sanitizers and the bench of every preset
# from decode to prefill, at the session's final kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 540 scripts/gpu-check --prebuilt .prebuilt --tokens 1,2,4,8,16,32,64,128,256,512,1024,4096,16384 \
  --presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3 --ep-tokens none
