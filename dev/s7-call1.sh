#!/usr/bin/env bash
# Session 7, call 1: the 5-stage 16x64 decode tile (exp/decode-5-stages, cherry-picked on s7)
# checked against the oracle (GemmTest: every compiled config), then weighed by `moekit tune` at
# every decode T of the three presets. The Python check waits for a later call (time).
#   here: cmake --build build -j2; cp build/moekit build/tests/moekit_{gpu,cpu}_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/s7-call1.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/logs
mkdir -p "$L"
cp configs/nvidia-h200.json "$OUT/nvidia-h200.json"
timeout 90 .prebuilt/moekit_gpu_tests --gtest_filter='GemmTest*' > "$L/gemm-tests.log" 2>&1
tail -3 "$L/gemm-tests.log"
for p in mixtral-8x7b deepseek-v3 qwen3-30b-a3b; do
  timeout 110 .prebuilt/moekit tune --preset $p --tokens 1,2,4,8,16,32,64 --out "$OUT/nvidia-h200.json" --merge \
    > "$L/tune-$p.log" 2>&1
  grep -E "^T=.* best" "$L/tune-$p.log"
done
tar czf "$OUT/logs.tgz" -C "$(dirname "$L")" logs
