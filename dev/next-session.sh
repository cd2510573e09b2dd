#!/usr/bin/env bash
# Prepared for the next session's first device call (not yet run). Everything on main ran on the
# H200 in session 6's last call (dev/s6-final.sh at bbe39e2: GPU tests, sanitizers, decode bench).
# The Python package's GPU tests have not run since session 3, so they come first; then the one
# decode experiment session 6 pointed to (NOTES "Known gaps": DRAM throughput still grew with the
# CTA count at 264 x 60 KB in flight) — a 5-stage 16x64 tile (2 CTAs an SM, 80 KB in flight each)
# waits on branch exp/decode-5-stages (191ffd7, ptxas-clean): cherry-pick it before building, and
# `moekit tune` weighs it at every decode T (GemmTest checks it against the oracle first).
#   here:   scripts/stage-deps; cmake --build build -j2; mkdir -p .prebuilt;
#           cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/next-session.sh" (up to ~9.5 minutes: split
#           the Python check and the tune into two calls if the budget allows)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON_BENCH=0 PYTEST_TIMEOUT=250 timeout 280 scripts/python-check "$OUT/python"
tail -5 "$OUT/python/python-tests.log"
# The device returns at most 8 files: the GEMM test and tune logs go into one archive.
L=$(mktemp -d)/logs
mkdir -p "$L"
cp configs/nvidia-h200.json "$OUT/nvidia-h200.json"
timeout 60 .prebuilt/moekit_gpu_tests --gtest_filter='GemmTest*' > "$L/gemm-tests.log" 2>&1
tail -3 "$L/gemm-tests.log"
for p in mixtral-8x7b deepseek-v3 qwen3-30b-a3b; do
  timeout 80 .prebuilt/moekit tune --preset $p --tokens 1,2,4,8,16,32,64 --out "$OUT/nvidia-h200.json" --merge \
    > "$L/tune-$p.log" 2>&1
  grep -E "^T=.* best" "$L/tune-$p.log"
done
tar czf "$OUT/logs.tgz" -C "$(dirname "$L")" logs
