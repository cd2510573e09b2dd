#!/usr/bin/env bash
# One device call: python build in the background; ncu of the small stages; decode tune sweep;
# then python tests + python bench.
set -uo pipefail
cd "$(dirname "$0")/.."
L=$(mktemp -d)/c1; mkdir -p $L
PB=.prebuilt
( PIP_BREAK_SYSTEM_PACKAGES=1 CMAKE_BUILD_PARALLEL_LEVEL=12 PATH=/usr/local/cuda/bin:$PATH CUDACXX=/usr/local/cuda/bin/nvcc \
  python3 -m pip install --no-build-isolation --no-deps --no-index -v . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
BPID=$!
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/device.txt
which nsys ncu > $L/which.txt 2>&1; ls /usr/local/cuda/bin >> $L/which.txt
echo "=== ncu $(date -u +%T)"
for spec in "mixtral-8x7b 1" "mixtral-8x7b 8" "deepseek-v3 1" "deepseek-v3 64" ; do
  set -- $spec
  timeout 45 ncu --cache-control none --clock-control none -k regex:'logits|router|align|combine' -c 6 \
    --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__registers_per_thread,smsp__warps_active.avg.pct_of_peak_sustained_active \
    --csv $PB/moekit check --preset $1 --tokens $2 > $L/ncu-$1-$2.csv 2> $L/ncu-$1-$2.err
  grep -E "duration" $L/ncu-$1-$2.csv | awk -F'","' '{print $5, $(NF-2), $NF}' | head -8
done
if which nsys >/dev/null 2>&1; then
  echo "=== nsys $(date -u +%T)"
  timeout 60 nsys profile -o $L/ds64 --cuda-graph-trace=node -t cuda $PB/moekit bench --preset deepseek-v3 --tokens 64 --no-baselines --steps 20 --warmup 5 > $L/nsys.log 2>&1
  nsys stats --report cuda_gpu_trace --format csv $L/ds64.nsys-rep > $L/ds64-trace.csv 2>/dev/null
  tail -40 $L/ds64-trace.csv | cut -c1-200
fi
echo "=== tune $(date -u +%T)"
for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3; do
  timeout 80 $PB/moekit tune --preset $p --out $L/nvidia-h200.json --merge > $L/tune-$p.log 2>&1; echo "tune $p rc=$?"
  grep -E "^T=|chosen|best|->|FAIL" $L/tune-$p.log | tail -20
done
cp $L/nvidia-h200.json $OUT/ 2>/dev/null
echo "=== python $(date -u +%T)"
wait $BPID; tail -3 $L/pybuild.log
PYTEST_TIMEOUT=130 timeout 230 scripts/python-check $L/py 2>&1 | tail -40
cp $L/py/python-bench.json $OUT/ 2>/dev/null
tar czf $OUT/c1.tgz -C $(dirname $L) c1
echo "=== done $(date -u +%T)"
