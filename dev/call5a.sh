#!/usr/bin/env bash
# Device call 5a: GPU tests + sanitizers on the final kernels, and the Python tests (build in the
# background meanwhile). The benchmark of record follows in call 5b.
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/c5a; mkdir -p $L
( PIP_BREAK_SYSTEM_PACKAGES=1 CMAKE_BUILD_PARALLEL_LEVEL=6 PATH=/usr/local/cuda/bin:$PATH CUDACXX=/usr/local/cuda/bin/nvcc \
  nice -n 15 python3 -m pip install --no-build-isolation --no-deps --no-index -v . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
BPID=$!
OUT=$L/gc timeout 330 scripts/gpu-check --prebuilt .prebuilt --skip-bench 2>&1 | tail -12
grep -E "^\[  FAILED  \]|Failure|error:" -A6 $L/gc/../gc/logs.tgz >/dev/null 2>&1
mkdir -p $L/x && tar xzf $L/gc/logs.tgz -C $L/x 2>/dev/null && grep -h -B2 -A12 "Failure" $L/x/gpu-check/gpu-tests*.log | head -60
echo "=== python $(date -u +%T)"
wait $BPID; tail -1 $L/pybuild.log
timeout 90 python3 -m pytest -q -rs tests/python > $L/pytest.log 2>&1
tail -6 $L/pytest.log; grep -E "^FAILED|^ERROR" $L/pytest.log | head -20
grep -B5 -A30 "^____" $L/pytest.log | head -80
tar czf $OUT/c5a.tgz -C $(dirname $L) c5a
echo "=== done $(date -u +%T)"
