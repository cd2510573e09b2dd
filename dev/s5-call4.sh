#!/usr/bin/env bash
# Session 5, call 4: the CTA-per-token selection, the division-free warp align (now up to 512
# ids) and the 32 x 128 decode tile. Their GPU tests (router, align, GEMM, forward, EP), the decode
# bench of every preset (small stages in-graph), and a tune of Mixtral T=64/128 with the new tile.
set -uo pipefail
cd "$(dirname "$0")/.."
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nccl_dir" ] && export LD_LIBRARY_PATH=$nccl_dir:${LD_LIBRARY_PATH:-}
timeout 240 .prebuilt/moekit_gpu_tests --gtest_filter='RouterTest.*:AlignTest.*:GemmTest.*:Forward*:Ep*' > $OUT/gpu-tests.log 2>&1
echo "=== gpu tests rc=$?"; grep -E "FAILED|PASSED|SKIPPED" $OUT/gpu-tests.log | tail -12
for p in mixtral-8x7b qwen3-30b-a3b deepseek-v3; do
  timeout 90 .prebuilt/moekit bench --preset $p --tokens 1,2,4,8,16,32,64 --no-baselines --json $OUT/bench-$p.json > $OUT/bench-$p.log 2>&1
  echo "=== bench $p rc=$?"
  grep -E " (router|align|combine|experts|layer-graph) +moekit" $OUT/bench-$p.log | awk '{printf "%s T=%s %s %s %s\n",$1,$2,$3,$5,$9}' | paste -sd' ' | fold -w 2000
done
cp configs/nvidia-h200.json $OUT/nvidia-h200.json
timeout 100 .prebuilt/moekit tune --preset mixtral-8x7b --tokens 64,128 --out $OUT/nvidia-h200.json --merge > $OUT/tune-mixtral.log 2>&1
echo "=== tune rc=$?"; grep -E " best: |FAILED|m32n128" $OUT/tune-mixtral.log | head -20
