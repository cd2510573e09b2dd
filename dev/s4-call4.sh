#!/usr/bin/env bash
# Session 4, call 4: the wgmma GEMM with claimed work items (global counter) and idle all-padding
# warpgroups. GPU tests of the GEMMs, forward and EP (R = 1); the prefill table for every preset
# (no baselines: the dense ceiling is measured in the run); ncu DRAM bytes of the GEMMs that read
# 4-7x their weights before (DeepSeek-V3 T=16384, Mixtral T=4096).
set -uo pipefail
cd "$(dirname "$0")/.."
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
timeout 240 .prebuilt/moekit_gpu_tests --gtest_filter='Sm90Gemm*:Forward*:Ep*:GemmTest*' > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|exception|Expected|Which is" $OUT/gpu-tests.log | head -30
for preset in deepseek-v3 mixtral-8x7b qwen3-30b-a3b; do
  t0=$(date +%s)
  timeout 150 .prebuilt/moekit bench --preset $preset --tokens 1024,4096,16384 --no-baselines --json $OUT/bench-$preset.json > $OUT/bench-$preset.log 2>&1
  echo "=== bench $preset rc=$? ($(( $(date +%s)-t0 )) s)"
  grep -E "plan:| up | down | experts | layer-graph |ceiling|dense" $OUT/bench-$preset.log | head -30
done
for spec in "deepseek-v3 16384" "mixtral-8x7b 4096" "deepseek-v3 4096"; do
  set -- $spec
  timeout 90 ncu --cache-control none --clock-control none -k regex:sm90_expert_gemm -c 2 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active.avg.pct_of_peak_sustained_elapsed \
    --csv .prebuilt/moekit check --preset $1 --tokens $2 > $OUT/ncu-$1-$2.csv 2> $OUT/ncu-$1-$2.err
  echo "=== ncu $1 T=$2"; grep -E "sm90" $OUT/ncu-$1-$2.csv | awk -F'","' '{print substr($5,1,40), $(NF-2), $(NF-1), $NF}' | tr -d '"'
done
