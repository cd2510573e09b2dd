#!/usr/bin/env bash
# Session 8, device call 1 (was dev/next-session.sh). Session 7 changed the mma.sync
# (decode) GEMM (a155ccb: one K-stream across a CTA's work items) and measured it by A/B and in a
# full gpu-check (docs/perf/2026-11-29-s7/), but every decode table entry was tuned with the old
# kernel, and the new one changed one tile's occupancy (32x64 3-stage: 3 CTAs an SM, was 2). So:
# `moekit tune` of every decode bucket and the crossover (T = 1-256) of the three presets with the
# new kernel, then the decode rows of every preset with the re-tuned table.
#   here:   cmake --build build -j2; mkdir -p .prebuilt;
#           cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/s8-call1.sh" (~6 minutes, run 2026-11-29 18:4x UTC); then copy
#           $OUT/nvidia-h200.json over configs/nvidia-h200.json if the GEMM tests passed.
# Then dev/next-ncu.sh (~3 minutes): ncu of Mixtral's and DeepSeek-V3's decode GEMMs beside the read.
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/logs
mkdir -p "$L"
cp configs/nvidia-h200.json "$OUT/nvidia-h200.json"
timeout 90 .prebuilt/moekit_gpu_tests --gtest_filter='GemmTest*' > "$L/gemm-tests.log" 2>&1
tail -3 "$L/gemm-tests.log"
for p in mixtral-8x7b deepseek-v3 qwen3-30b-a3b; do
  timeout 150 .prebuilt/moekit tune --preset $p --tokens 1,2,4,8,16,32,64,128,256 --out "$OUT/nvidia-h200.json" \
    --merge > "$L/tune-$p.log" 2>&1
  grep -E "^T=.* best" "$L/tune-$p.log"
done
cp "$OUT/nvidia-h200.json" configs/nvidia-h200.json
for p in mixtral-8x7b deepseek-v3 qwen3-30b-a3b; do
  timeout 80 .prebuilt/moekit bench --preset $p --tokens 1,2,4,8,16,32,64 --json "$OUT/bench-$p.json" \
    > "$L/bench-$p.log" 2>&1
  echo "bench $p: rc=$?"
done
tar czf "$OUT/logs.tgz" -C "$(dirname "$L")" logs
