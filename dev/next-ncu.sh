#!/usr/bin/env bash
# Prepared (not yet run): why Mixtral's decode GEMMs sit at 1.04-1.07x the read time of the same
# bytes while DeepSeek-V3's reach 1.02-1.04x (NOTES "Known gaps", decode item (3)). ncu of the up
# and down GEMMs of Mixtral T=16 and DeepSeek-V3 T=16 beside the streaming read kernel that
# measures the read time, in the same process: DRAM bytes (extra bytes vs the weights' size), DRAM
# and L2 throughput, L2 hit rate, L2 sectors read from L1/TEX per request (16-byte cp.async pieces
# of 256-byte row runs vs the read kernel's 64 KB runs). (The re-tune it waited for ran in session 8: dev/s8-call1.sh.)
#   device: carry [".deps", ".prebuilt"], command "dev/next-ncu.sh" (~3 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum
M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__occupancy_limit_registers
M=$M,launch__occupancy_limit_shared_mem,launch__registers_per_thread  # vs configs/sm90-occupancy.txt
for spec in "mixtral-8x7b 16" "deepseek-v3 16"; do
  set -- $spec
  # bench with 1 warm-up and 1 step: the check's GEMMs, then each timed stage once; -c bounds it.
  timeout 150 ncu --cache-control none --clock-control none -k regex:'expert_gemm_kernel|stream_read_kernel' -c 12 \
    --metrics $M --csv .prebuilt/moekit bench --preset $1 --tokens $2 --no-baselines --warmup 1 --steps 1 \
    > "$OUT/ncu-$1-$2.csv" 2> "$OUT/ncu-$1-$2.err"
  echo "=== ncu $1 T=$2 (rc=$?)"
  python3 - "$OUT/ncu-$1-$2.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no ncu rows")
h = rows[0]
ki, mi, vi, idi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
by = {}
for r in rows[1:]:
    by.setdefault((r[idi], r[ki][:40]), {})[r[mi]] = r[vi]
for (i, k), m in by.items():
    print(i, k, " ".join("%s=%s" % (n.split("__")[1][:34], v) for n, v in sorted(m.items())))
PY
done
