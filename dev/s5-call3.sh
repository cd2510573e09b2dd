#!/usr/bin/env bash
# Session 5, call 3: why the decode small stages cost what they do. ncu says (call 2, serialised):
# DeepSeek-V3 T=1 router_kernel<8> 7.3 us (Mixtral's router_kernel<1> 2.9) for ONE token, and Qwen3
# T=16 align_warp_kernel 6.8 us for 128 ids: one warp each, so a chain of dependent instructions is
# the suspect. Source-level warp-stall samples and instruction counts of both (CSV for reading
# here), and Mixtral T=64's 32-row up/down GEMMs' DRAM and L2 throughput (86% of the read time).
set -uo pipefail
cd "$(dirname "$0")/.."
prof() {  # name preset T kernel-regex
  timeout 90 ncu --clock-control none --sampling-interval 0 -k regex:"$4" -c 1 \
    --section SourceCounters --section WarpStateStats --section LaunchStats \
    --metrics smsp__inst_executed.sum,smsp__cycles_active.max,gpu__time_duration.sum \
    -o $OUT/$1 .prebuilt/moekit check --preset $2 --tokens $3 > $OUT/$1.log 2>&1
  echo "=== $1 rc=$?"
  timeout 60 ncu --import $OUT/$1.ncu-rep --page details 2>&1 | grep -E "Duration|inst_executed|cycles_active|Warp Cycles Per Issued|Stall" | head -12
  timeout 60 ncu --import $OUT/$1.ncu-rep --page source --csv --print-source sass > $OUT/$1-source.csv 2>&1
  rm -f $OUT/$1.ncu-rep $OUT/$1.log
}
prof router8 deepseek-v3 1 "router_kernel"
prof alignwarp qwen3-30b-a3b 16 "align_warp_kernel"
timeout 120 ncu --clock-control none -k regex:expert_gemm_kernel -c 2 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio \
  .prebuilt/moekit check --preset mixtral-8x7b --tokens 64 > $OUT/mixtral64-gemm.log 2>&1
echo "=== mixtral T=64 gemm rc=$?"
grep -E "expert_gemm_kernel|gpu__time|dram__|lts__|l1tex__|sm__thr|stalled" $OUT/mixtral64-gemm.log | sed -E 's/\(moekit::[^)]*\)//' | cut -c1-120
