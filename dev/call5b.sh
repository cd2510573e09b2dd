#!/usr/bin/env bash
# Device call 5b: the benchmark of record on the final kernels, and moekit tune of Qwen3's decode
# buckets with the 16x32 tile.
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/c5b; mkdir -p $L
OUT=$L/gc timeout 330 scripts/gpu-check --prebuilt .prebuilt --skip-tests --skip-sanitize --tokens 1,4,16,64,256,1024,4096,16384 2>&1 | tail -6
cp configs/nvidia-h200.json $L/nvidia-h200.json
timeout 40 .prebuilt/moekit tune --preset qwen3-30b-a3b --tokens 1,2,4,8,16,32 --out $L/nvidia-h200.json --merge > $L/tune-qwen3.log 2>&1
echo "tune rc=$?"; grep -E "best:" $L/tune-qwen3.log
cp $L/nvidia-h200.json $L/gc/bench-*.json $OUT/ 2>/dev/null
tar czf $OUT/c5b.tgz -C $(dirname $L) c5b
echo "=== done $(date -u +%T)"
