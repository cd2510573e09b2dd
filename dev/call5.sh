#!/usr/bin/env bash
# Device call 5 (the session's last): GPU tests + sanitizers + the benchmark of record on the
# final kernels; moekit tune of the decode buckets with the 16x32 tile; the Python tests.
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/c5; mkdir -p $L
( PIP_BREAK_SYSTEM_PACKAGES=1 CMAKE_BUILD_PARALLEL_LEVEL=6 PATH=/usr/local/cuda/bin:$PATH CUDACXX=/usr/local/cuda/bin/nvcc \
  nice -n 15 python3 -m pip install --no-build-isolation --no-deps --no-index -v . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
BPID=$!
OUT=$L/gc timeout 440 scripts/gpu-check --prebuilt .prebuilt --tokens 1,4,16,64,256,1024,4096,16384 2>&1 | tail -14
echo "=== tune $(date -u +%T)"
cp configs/nvidia-h200.json $L/nvidia-h200.json
for p in qwen3-30b-a3b; do
  timeout 40 .prebuilt/moekit tune --preset $p --tokens 1,2,4,8,16,32 --out $L/nvidia-h200.json --merge > $L/tune-$p.log 2>&1
  echo "tune $p rc=$?"; grep -E "best:" $L/tune-$p.log
done
cp $L/nvidia-h200.json $OUT/
echo "=== python $(date -u +%T)"
wait $BPID; tail -1 $L/pybuild.log
timeout 80 python3 -m pytest -q -rs tests/python > $L/pytest.log 2>&1
tail -5 $L/pytest.log; grep -E "FAILED|Error" $L/pytest.log | head -10
cp $L/gc/bench-*.json $OUT/ 2>/dev/null
tar czf $OUT/c5.tgz -C $(dirname $L) c5
echo "=== done $(date -u +%T)"
