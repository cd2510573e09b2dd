#!/usr/bin/env bash
# Device call 3: the benchmark of record (every preset, decode to prefill, crossover Ts), skew,
# and the Python benchmark. Tests and sanitizers ran on the same kernels in call 2.
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/c3; mkdir -p $L
( PIP_BREAK_SYSTEM_PACKAGES=1 CMAKE_BUILD_PARALLEL_LEVEL=8 PATH=/usr/local/cuda/bin:$PATH CUDACXX=/usr/local/cuda/bin/nvcc \
  nice -n 10 python3 -m pip install --no-build-isolation --no-deps --no-index -v . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
BPID=$!
OUT=$L/gc timeout 380 scripts/gpu-check --prebuilt .prebuilt --skip-tests --skip-sanitize \
  --tokens 1,2,4,8,16,32,64,128,256,512,1024,4096,16384 2>&1 | tail -8
for p in mixtral-8x7b deepseek-v3; do
  echo "=== skew $p $(date -u +%T)"
  timeout 50 .prebuilt/moekit bench --preset $p --tokens 4096 --skew --no-baselines --json $L/bench-skew-$p.json 2>&1 | grep -E "experts|layer-graph" | head -3
done
echo "=== python bench $(date -u +%T)"
wait $BPID; tail -1 $L/pybuild.log
timeout 100 python3 -m moekit.bench --tokens 1,16,256,4096 --json $L/python-bench.json 2>&1 | tail -16
cp $L/gc/bench-*.json $OUT/ 2>/dev/null
tar czf $OUT/c3.tgz -C $(dirname $L) c3
echo "=== done $(date -u +%T)"
