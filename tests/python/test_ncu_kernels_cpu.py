"""scripts/ncu_kernels.py on the CPU (gpu-check's per-kernel table of an `ncu --csv` run, and the
parse scripts/ab --ncu imports): kernels by their median time, short names, a metric ncu could not
collect (n/a) shown as nan rather than as a measured 0, and no table from a CSV without ncu rows."""
import csv
import io
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ncu_kernels.py"
HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
        "Grid Size", "Device", "CC", "Metric Name", "Metric Unit", "Metric Value"]


def ncu_csv(launches):
    out = io.StringIO()
    out.write("==PROF== Connected to process 7 (/x/moekit)\n")
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(HEAD)
    for kernel, metrics in launches:
        for metric, value in metrics.items():
            w.writerow([0, 7, "moekit", "h", kernel, 1, 13, "(384, 1, 1)", "(132, 1, 1)", 0, "9.0", metric, "u", value])
    return out.getvalue()


def run(tmp_path, text):
    path = tmp_path / "ncu.csv"
    path.write_text(text)
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True)


def test_kernels_by_median_time(tmp_path):
    gemm = "void moekit::kernels::gemm::sm90::sm90_weight_grad_kernel<(bool)0>(moekit::kernels::gemm::KGroupedParams)"
    small = "void moekit::kernels::backward::dw_reduce_kernel(moekit::kernels::backward::DwReduceParams)"
    launches = [(gemm, {"gpu__time_duration.sum": f"{t:,}", "dram__bytes_read.sum": "n/a"}) for t in (1_900_000, 2_000_000, 9_000_000)]
    launches += [(small, {"gpu__time_duration.sum": "6,000"})]
    r = run(tmp_path, ncu_csv(launches))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[:3] == ["gemm::sm90::sm90_weight_grad_kernel<(bool)0>", "3", "2.000"]  # the median
    assert lines[1].split()[4] == "nan", "n/a is not a 0 measured"
    assert lines[2].split()[:3] == ["backward::dw_reduce_kernel", "1", "0.006"]


def test_no_rows_is_a_failure(tmp_path):
    r = run(tmp_path, "==PROF== No kernels were profiled.\n")
    assert r.returncode == 1 and "no ncu rows" in r.stderr
