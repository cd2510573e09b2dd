#!/usr/bin/env bash
# Session 4, call 2: where the prefill expert GEMMs lose time. ncu (clocks untouched) of the up and
# down wgmma kernels at T = 4096 for every preset and DeepSeek-V3 at T = 16384: duration, DRAM and
# L2 bytes, tensor-pipe activity, warp stalls. One forward each (`moekit check`).
set -uo pipefail
cd "$(dirname "$0")/.."
ncu --query-metrics 2>/dev/null | grep -iE "hgmma|gmma" | head -20
for spec in "deepseek-v3 4096" "qwen3-30b-a3b 4096" "mixtral-8x7b 4096" "deepseek-v3 16384"; do
  set -- $spec
  r=$OUT/ncu-$1-$2
  timeout 150 ncu --cache-control none --clock-control none -k regex:sm90_expert_gemm -c 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__ops_path_tensor_src_bf16_dst_fp32.sum,sm__pipe_tensor_op_hgmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hgmma.sum \
    -o $r .prebuilt/moekit check --preset $1 --tokens $2 > $r.log 2>&1
  echo "=== $1 T=$2 rc=$?"; grep -E "^check|plan:" $r.log | head -3
  timeout 60 ncu --import $r.ncu-rep --page details --print-units base 2>&1 | grep -E \
    "sm90_expert_gemm|Duration|Registers Per|Grid Size|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|L2 Hit|No Eligible|Issued Warp|dram__bytes|lts__t_bytes|hgmma|sm__ops_path" | head -60
  timeout 60 ncu --import $r.ncu-rep --page raw --csv 2>/dev/null | python3 -c '
import sys,csv
rows=list(csv.reader(sys.stdin))
h=rows[0]
for v in rows[2:]:
  print("--", v[h.index("Kernel Name")][:60] if "Kernel Name" in h else "")
  for i,n in enumerate(h):
    if any(s in n for s in ("dram__bytes_read.sum","dram__bytes_write.sum","lts__t_bytes.sum","hgmma","sm__ops_path_tensor_src_bf16_dst_fp32.sum","gpu__time_duration.sum")) and "." in n:
      print("  %-90s %s"%(n,v[i]))
  st=[]
  for i,n in enumerate(h):
    if n.startswith("smsp__average_warp_latency_issue_stalled") and n.endswith(".ratio") or ("warps_issue_stalled" in n and n.endswith("_per_warp_active.pct")):
      try: st.append((float(v[i]),n))
      except: pass
  for s,n in sorted(st,reverse=True)[:7]: print("  stall %-80s %.2f"%(n,s))
'
done
