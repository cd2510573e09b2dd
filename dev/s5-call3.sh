#!/usr/bin/env bash
# Session 5, call 3: why the decode small stages cost what they do. ncu says (call 2, serialised):
# DeepSeek-V3 T=1 router_kernel<8> 7.3 us (Mixtral's router_kernel<1> 2.9) for ONE token, and Qwen3
# T=16 align_warp_kernel 6.8 us for 128 ids: one warp each, so a chain of dependent instructions is
# the suspect. Source-level warp-stall samples and instruction counts of both (CSV for reading
# here), and Mixtral T=64's 32-row up/down GEMMs' DRAM and L2 throughput (86% of the read time).
set -uo pipefail
cd "$(dirname "$0")/.."
prof() {  # name preset T kernel-regex
  timeout 90 ncu --clock-control none -k regex:"$4" -c 1 \
    --section SourceCounters --section WarpStateStats --section LaunchStats \
    --metrics smsp__inst_executed.sum,smsp__cycles_active.max,gpu__time_duration.sum \
    -o $OUT/$1 .prebuilt/moekit check --preset $2 --tokens $3 > $OUT/$1.log 2>&1
  echo "=== $1 rc=$?"; grep -E "ERROR|error|WARN" $OUT/$1.log | head -5
  timeout 60 ncu --import $OUT/$1.ncu-rep --page details 2>&1 | grep -E "Duration|inst_executed|cycles_active|Warp Cycles Per Issued|Stall" | head -12
  timeout 60 ncu --import $OUT/$1.ncu-rep --page source --csv --print-source sass > $OUT/$1-source.csv 2>&1
  rm -f $OUT/$1.ncu-rep
}
prof router8 deepseek-v3 1 "router_kernel"
prof alignwarp qwen3-30b-a3b 16 "align_warp_kernel"
