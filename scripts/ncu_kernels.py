#!/usr/bin/env python3
"""scripts/ncu_kernels.py CSV — moekit's kernels in the output of `ncu --csv --print-units base
--kernel-name-base demangled --metrics ...` (a `moekit bench` step): per kernel, the median over its
launches of time, tensor pipe, DRAM bytes read, L2 hit rate and L2 throughput, slowest first.
scripts/gpu-check (--ncu) prints this table; scripts/ab (--ncu) imports `kernels` and `median` to
put two builds' kernels side by side. Exit 1 when the CSV holds no ncu rows."""
import csv
import math
import statistics
import sys

TIME = "gpu__time_duration.sum"
PIPE = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
L2 = "lts__t_sectors.avg.pct_of_peak_sustained_elapsed"


def short(name, width=70):
    """Without "void ", moekit's namespaces and the parameter list (the first "(" outside <>)."""
    depth = 0
    for i, c in enumerate(name):
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0:
            name = name[:i]
            break
    return name.removeprefix("void ").replace("moekit::kernels::", "")[-width:]


def kernels(text, width=70):
    """{short kernel name: {metric: [value per launch]}}; empty when the text holds no ncu rows. A
    metric ncu writes as n/a for a kernel (it could not collect it) is left out, not read as 0."""
    rows = [r for r in csv.reader(text.splitlines()) if len(r) > 10]
    if not rows:
        return {}
    head, out = rows[0], {}
    k, m, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    for r in rows[1:]:
        try:
            x = float(r[v].replace(",", ""))
        except ValueError:
            continue
        out.setdefault(short(r[k], width), {}).setdefault(r[m], []).append(x)
    return out


def median(table, kernel, metric):
    """The median of one kernel's metric; nan where the kernel or the metric is missing."""
    values = table.get(kernel, {}).get(metric)
    return statistics.median(values) if values else math.nan


def main():
    table = kernels(open(sys.argv[1]).read())
    if not table:
        sys.exit("no ncu rows")
    print(f"{'kernel':70} {'n':>3} {'ms':>8} {'tensor%':>7} {'DRAM GB':>8} {'L2 hit%':>7} {'L2 %':>5}")
    for name in sorted(table, key=lambda kern: -median(table, kern, TIME)):
        med = lambda metric: median(table, name, metric)  # noqa: E731
        print(f"{name:70} {len(table[name][TIME]):3} {med(TIME) / 1e6:8.3f} {med(PIPE):7.1f} "
              f"{med('dram__bytes_read.sum') / 1e9:8.3f} {med('lts__t_sector_hit_rate.pct'):7.1f} "
              f"{med(L2):5.1f}")


if __name__ == "__main__":
    main()
