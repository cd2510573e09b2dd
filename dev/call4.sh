#!/usr/bin/env bash
# Device call 4: moekit tune over the decode/prefill crossover (T = 128..4096), merged into the
# committed table.
set -uo pipefail
cd "$(dirname "$0")/.."
cp configs/nvidia-h200.json $OUT/nvidia-h200.json
for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3; do
  timeout 140 .prebuilt/moekit tune --preset $p --tokens 128,256,512,1024,4096 --out $OUT/nvidia-h200.json --merge > $OUT/tune-$p.log 2>&1
  echo "tune $p rc=$? $(date -u +%T)"; grep -E "best:" $OUT/tune-$p.log
done
