#!/usr/bin/env bash
# Session 3, call 5 (nvidia-h200-x2): the EP tests again after fixing the test's own placement
# (case 7 asked for more replicas than spare slots), then a read of call 1's ncu reports (carried
# in .ncu/): align at E = 8 vs E = 256 (DeepSeek-V3's extra ~2.5 us) and the looped gate kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
timeout 200 .prebuilt/moekit_gpu_tests --gtest_filter='Ep*' > $OUT/ep-tests.log 2>&1; echo "EP tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED|     OK) |Failure|exception|Expected|Which is" $OUT/ep-tests.log | head -40
for r in .ncu/ncu-align-mixtral-8x7b .ncu/ncu-align-deepseek-v3 .ncu/ncu-gate-looped; do
  echo "=== $r"
  timeout 60 ncu --import $r.ncu-rep --page details --print-units base 2>&1 | grep -E \
    "Duration|Elapsed Cycles|Registers Per|Block Size|Grid Size|Dynamic Shared|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Executed Ipc|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|One or More|No Eligible|Avg. Active Threads" | head -30
  timeout 60 ncu --import $r.ncu-rep --page raw --csv 2>/dev/null | python3 -c '
import sys,csv
rows=list(csv.reader(sys.stdin))
if len(rows)>=3:
  h,u,v=rows[0],rows[1],rows[2]
  stalls=[(float(v[i]) if v[i].replace(".","",1).isdigit() else 0,h[i]) for i in range(len(h)) if "smsp__average_warp_latency_issue_stalled" in h[i] or ("warp_issue_stalled" in h[i] and h[i].endswith("_per_warp_active.pct"))]
  for s,n in sorted(stalls,reverse=True)[:8]: print("  stall %-80s %.2f"%(n,s))
' 2>&1 | head -10
done
