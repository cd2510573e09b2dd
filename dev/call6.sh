#!/usr/bin/env bash
# Device call 6: after the review fixes (per-device launch setup, a shift guard, a prefill graph
# test): the GPU tests and the Python tests.
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/c6; mkdir -p $L
( PIP_BREAK_SYSTEM_PACKAGES=1 CMAKE_BUILD_PARALLEL_LEVEL=6 PATH=/usr/local/cuda/bin:$PATH CUDACXX=/usr/local/cuda/bin/nvcc \
  nice -n 15 python3 -m pip install --no-build-isolation --no-deps --no-index -v . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
BPID=$!
OUT=$L/gc timeout 200 scripts/gpu-check --prebuilt .prebuilt --skip-sanitize --skip-bench 2>&1 | tail -6
mkdir -p $L/x && tar xzf $L/gc/logs.tgz -C $L/x 2>/dev/null && grep -h -B2 -A12 "Failure" $L/x/gpu-check/gpu-tests*.log | head -40
echo "=== python $(date -u +%T)"
wait $BPID; tail -1 $L/pybuild.log
timeout 80 python3 -m pytest -q -rs tests/python > $L/pytest.log 2>&1
tail -3 $L/pytest.log; grep -E "^FAILED|^ERROR" $L/pytest.log | head -10
tar czf $OUT/c6.tgz -C $(dirname $L) c6
echo "=== done $(date -u +%T)"
