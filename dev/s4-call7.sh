#!/usr/bin/env bash
# Session 4, call 7: the pipelined gate kernel as a flat loop over stages of G steps; which G and
# ring depth (MOEKIT_GATE_PIPE 1: 1 x 6, 0: 2 x 6, 2: 4 x 4). Router tests (bitwise batch
# invariance against the cluster kernels) with the default; ncu time of each variant; the stall
# reasons of the default.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
timeout 200 .prebuilt/moekit_gpu_tests --gtest_filter='Router*' > $OUT/gpu-tests.log 2>&1
echo "router tests rc=$? ($(( $(date +%s)-t0 )) s)"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|exception|Expected|Which is" $OUT/gpu-tests.log | head -20
MOEKIT_GATE_PIPE=2 timeout 100 .prebuilt/moekit_gpu_tests --gtest_filter='RouterTest.TensorCoreLogitsBatchInvariantAndDeterministic' 2>&1 | grep -E "^\[  (FAILED|PASSED)"
for v in 1 0 2; do
  for spec in "deepseek-v3 16384" "deepseek-v3 4096" "qwen3-30b-a3b 16384"; do
    set -- $spec
    MOEKIT_GATE_PIPE=$v timeout 60 ncu --cache-control none --clock-control none -k regex:gate_logits -c 1 \
      --metrics gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed \
      --csv .prebuilt/moekit check --preset $1 --tokens $2 --check-tokens 4 > $OUT/ncu-v$v-$1-$2.csv 2>/dev/null
    echo "variant $v $1 T=$2: $(grep -E 'gate' $OUT/ncu-v$v-$1-$2.csv | awk -F'","' '{print $(NF-2)"="$NF}' | tr -d '"' | tr '\n' ' ')"
  done
done
timeout 90 ncu --cache-control none --clock-control none -k regex:gate_logits -c 1 --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --page details .prebuilt/moekit check --preset deepseek-v3 --tokens 16384 --check-tokens 4 > $OUT/ncu-stalls.txt 2>&1
grep -E "Stall|stall|Warp Cycles|Eligible|Issued|Active Warps|Bank|L1|Shared" $OUT/ncu-stalls.txt | head -30
timeout 90 ncu --cache-control none --clock-control none -k regex:gate_logits -c 1 --metrics regex:smsp__average_warp_latency_issue_stalled.*ratio \
  --csv .prebuilt/moekit check --preset deepseek-v3 --tokens 16384 --check-tokens 4 > $OUT/ncu-stall-metrics.csv 2>/dev/null
python3 - $OUT/ncu-stall-metrics.csv <<'PY'
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>5]
h=rows[0]
vals=[(r[h.index("Metric Name")], r[h.index("Metric Value")]) for r in rows[1:]] if "Metric Name" in h else []
vals=[(n,float(v.replace(",",""))) for n,v in vals if v.replace(",","").replace(".","",1).isdigit()]
for n,v in sorted(vals,key=lambda x:-x[1])[:8]: print("  %-80s %.2f"%(n,v))
PY
