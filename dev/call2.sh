#!/usr/bin/env bash
# Device call 2: python build in the background; gpu-check (tests, sanitizers, decode bench);
# ncu of the small stages; a prefill router check; python tests.
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/c2; mkdir -p $L
( PIP_BREAK_SYSTEM_PACKAGES=1 CMAKE_BUILD_PARALLEL_LEVEL=8 PATH=/usr/local/cuda/bin:$PATH CUDACXX=/usr/local/cuda/bin/nvcc \
  nice -n 10 python3 -m pip install --no-build-isolation --no-deps --no-index -v . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
BPID=$!
OUT=$L/gc timeout 330 scripts/gpu-check --prebuilt .prebuilt --tokens 1,2,4,8,16,32,64 2>&1 | tail -45
echo "=== ncu $(date -u +%T)"
for spec in "mixtral-8x7b 1" "mixtral-8x7b 8" "deepseek-v3 1" "deepseek-v3 64" "qwen3-30b-a3b 16"; do
  set -- $spec
  timeout 40 ncu --cache-control none --clock-control none -k regex:'gate|logits|router|align|combine' -c 6 \
    --metrics gpu__time_duration.sum --csv .prebuilt/moekit check --preset $1 --tokens $2 > $L/ncu-$1-$2.csv 2> $L/ncu-$1-$2.err
  echo "$1 T=$2: $(grep -E 'duration' $L/ncu-$1-$2.csv | awk -F'","' '{split($5,a,"(");print a[1]"="$NF}' | tr -d '"' | tr '\n' ' ')"
done
echo "=== prefill router $(date -u +%T)"
timeout 60 .prebuilt/moekit bench --preset deepseek-v3 --tokens 4096,16384 --no-baselines --json $L/bench-ds-prefill.json 2>&1 | tail -12
echo "=== python $(date -u +%T)"
wait $BPID; tail -2 $L/pybuild.log
PYTHON_BENCH=0 PYTEST_TIMEOUT=100 timeout 150 scripts/python-check $L/py 2>&1 | tail -12
cp $L/gc/bench-*.json $OUT/ 2>/dev/null
tar czf $OUT/c2.tgz -C $(dirname $L) c2
echo "=== done $(date -u +%T)"
