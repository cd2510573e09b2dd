#!/usr/bin/env bash
# Session 5, call 5: the router and align tests after the last changes (CTA selection above 128
# experts, canonical NaN weights, warp align back to 256 ids), before the final gpu-check.
set -uo pipefail
cd "$(dirname "$0")/.."
timeout 120 .prebuilt/moekit_gpu_tests --gtest_filter='RouterTest.*:AlignTest.*:ForwardTest.*' > $OUT/gpu-tests.log 2>&1
echo "=== gpu tests rc=$?"; grep -E "FAILED|PASSED|Failure|Which is|differ" $OUT/gpu-tests.log | tail -12
