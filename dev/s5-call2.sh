#!/usr/bin/env bash
# Session 5, call 2: the 32-row decode tiles (m32n64k128, 3 and 4 stages) — the GEMM tests over
# every compiled config, then `moekit tune` at the rows-per-expert where 16-row tiles split an
# expert into two blocks (Mixtral T=16..256, Qwen3 T=64..256, DeepSeek-V3 T=128..512), merged into
# a copy of configs/nvidia-h200.json. Then ncu durations of the small-stage kernels at decode
# (DeepSeek-V3 T=1, Qwen3 T=16 and 64): where the 10 us of issue 3 goes, kernel by kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 200 .prebuilt/moekit_gpu_tests --gtest_filter='GemmTest.*' > $OUT/gemm-tests.log 2>&1
echo "=== gemm tests rc=$?"; tail -3 $OUT/gemm-tests.log
cp configs/nvidia-h200.json $OUT/nvidia-h200.json
for spec in "mixtral-8x7b 16,32,64,128,256" "qwen3-30b-a3b 64,128,256" "deepseek-v3 128,256,512"; do
  set -- $spec
  timeout 150 .prebuilt/moekit tune --preset $1 --tokens $2 --out $OUT/nvidia-h200.json --merge > $OUT/tune-$1.log 2>&1
  echo "=== tune $1 rc=$?"; grep -E " best: |FAILED" $OUT/tune-$1.log
done
for spec in "deepseek-v3 1" "qwen3-30b-a3b 16" "qwen3-30b-a3b 64" "mixtral-8x7b 1"; do
  set -- $spec
  timeout 60 ncu --clock-control none -k regex:"gate|router|align|combine" --metrics gpu__time_duration.sum \
    .prebuilt/moekit check --preset $1 --tokens $2 > $OUT/ncu-small-$1-$2.log 2>&1
  echo "=== ncu $1 T=$2 rc=$?"
  grep -E "^  [a-z_]+.*\(|gpu__time_duration" $OUT/ncu-small-$1-$2.log | sed -E 's/\(moekit::[^)]*\)//' | cut -c1-110 | head -24
done
