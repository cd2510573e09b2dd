#!/usr/bin/env bash
# Session 3, call 1: the GPU tests of everything changed since the last run (align count_segments,
# AlignedGemmInputs, per-device setup), then dev/next-session.sh (3-stage tile tune, ncu).
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/s3c1; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
t0=$(date +%s)
.prebuilt/moekit_gpu_tests > $L/gpu-tests.log 2>&1; echo "all GPU tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "PASSED|FAILED|SKIPPED" $L/gpu-tests.log | tail -15
tar czf $OUT/s3c1.tgz -C $(dirname $L) s3c1
OUT=$OUT bash dev/next-session.sh
