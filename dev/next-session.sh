#!/usr/bin/env bash
# Prepared for the next session's first device call (not yet run): verify the 3-stage 16x64 decode
# tile, retune the decode buckets with it, and profile the two unexplained costs of this session
# (align's E-dependence at decode; the looped prefill router's load batches).
#   here:   scripts/stage-deps; cmake --build build -j2; mkdir -p .prebuilt;
#           cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/next-session.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/next; mkdir -p $L
.prebuilt/moekit_gpu_tests --gtest_filter='GemmTest.*:ForwardTest.*' > $L/gemm-tests.log 2>&1; echo "gemm/forward tests rc=$?"
cp configs/nvidia-h200.json $L/nvidia-h200.json
for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3; do
  timeout 100 .prebuilt/moekit tune --preset $p --out $L/nvidia-h200.json --merge > $L/tune-$p.log 2>&1
  echo "tune $p rc=$?"; grep -E "best:" $L/tune-$p.log
done
for spec in "mixtral-8x7b 1" "deepseek-v3 1"; do
  set -- $spec
  timeout 60 ncu --cache-control none --clock-control none -k regex:align_kernel -c 1 --set full \
    -o $L/ncu-align-$1 .prebuilt/moekit check --preset $1 --tokens $2 > /dev/null 2>&1
done
timeout 90 ncu --cache-control none --clock-control none -k regex:gate_logits_looped -c 1 --set full \
  -o $L/ncu-gate-looped .prebuilt/moekit check --preset deepseek-v3 --tokens 16384 > /dev/null 2>&1
cp $L/nvidia-h200.json $OUT/
tar czf $OUT/next.tgz -C $(dirname $L) next
