#!/usr/bin/env bash
# Prepared for the next session's first device call (not yet run): the two measurements that
# docs/perf/NOTES.md "Known gaps" asks for before more kernel changes. (1) Why a Qwen3 T=4096 up
# tile takes 36 us against 27 us at T=16384 for the same bytes and FLOPs per tile: ncu of the
# wgmma up GEMM with the source counters and memory tables (L2 misses and DRAM bytes per load
# instruction: A's cp.async gather vs B's TMA) beside the same kernel at T=16384. (2) The decode
# ncu of dev/next-ncu.sh (Mixtral / DeepSeek-V3 T=16 GEMMs beside the read kernel).
# First, though: branch fix/silu-padding-rows (padding rows took the SiLU fallback in the wgmma Up
# epilogue) with its own script, dev/next-silu-padding.sh there; merge it if its tests pass and it
# is not slower, then run this on the merged tree.
#   here:   cmake --build build -j2; mkdir -p .prebuilt;
#           cp build/moekit build/tests/moekit_gpu_tests build/tests/moekit_cpu_tests .prebuilt/
#   device: carry [".deps", ".prebuilt"], command "dev/next-session.sh" (~5 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
for T in 4096 16384; do
  timeout 150 ncu --clock-control none -k regex:sm90_expert_gemm -c 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters \
    --section WarpStateStats .prebuilt/moekit bench --preset qwen3-30b-a3b --tokens $T --no-baselines \
    --warmup 0 --steps 1 > "$OUT/ncu-qwen3-up-$T.txt" 2>&1
  echo "ncu qwen3 up T=$T: rc=$?"
  grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L2 Hit Rate|SM Frequency" "$OUT/ncu-qwen3-up-$T.txt"
done
OUT=$OUT bash dev/next-ncu.sh
