#!/usr/bin/env bash
# Session 3, call 4 (nvidia-h200-x2), after the EP review fixes: scripts/gpu-check with every GPU
# test (EP R = 1 and R = 2 included), memcheck (plus EP's own), racecheck, CPU tests and
# `moekit bench --ep 2` for every preset; then the single-GPU decode bench of Qwen3 (its decode
# buckets were retuned with the 3-stage tile this session).
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 500 scripts/gpu-check --prebuilt .prebuilt --tokens none --ep-tokens 1,16,128,1024,4096
LOGS=$(mktemp -d)
timeout 80 .prebuilt/moekit bench --preset qwen3-30b-a3b --tokens 1,2,4,8,16,32,64 \
  --json $OUT/bench-qwen3-30b-a3b.json > $LOGS/bench-qwen3.log 2>&1
echo "bench qwen3 rc=$?"; grep -E "experts|small|layer-graph" $LOGS/bench-qwen3.log | grep moekit | head -30
cp $LOGS/bench-qwen3.log $OUT/
