"""scripts/gpu-check on the CPU, with stand-in binaries: cut off by `timeout` (the device's limit)
it stops the running step, prints its summary, packs logs.tgz and exits 124, leaving nothing
running; a normal run keeps its steps' exit status; --skew runs `moekit bench --skew` per preset."""
import os
import pathlib
import stat
import subprocess
import tarfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU_CHECK = ROOT / "scripts" / "gpu-check"


def stand_ins(tmp, gpu_tests, moekit="echo \"$@\"; exit 0", cpu_tests="exit 0"):
    d = tmp / "bin"
    d.mkdir()
    for name, body in (("moekit_gpu_tests", gpu_tests), ("moekit_cpu_tests", cpu_tests), ("moekit", moekit)):
        f = d / name
        f.write_text("#!/bin/sh\n" + body + "\n")
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return d


def running(text):
    """Whether a process's command line holds `text` (Linux /proc)."""
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                return True
        except OSError:
            pass
    return False


def run(tmp, *args, timeout=None):
    out = tmp / "out"
    cmd = [str(GPU_CHECK), *map(str, args)]
    if timeout:
        cmd = ["timeout", str(timeout), *cmd]
    env = dict(os.environ, OUT=str(out))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT), out


def test_a_cut_off_run_stops_its_step_and_packs_the_logs(tmp_path):
    # The 'GPU tests' are a sleep of about a minute with a duration no other process has: its
    # command line is how the test finds it if it outlives the script.
    sleep = f"sleep 59.{os.getpid()}{int(time.time()) % 1000}"
    bin_dir = stand_ins(tmp_path, f"exec {sleep}")
    t0 = time.time()
    r, out = run(tmp_path, "--prebuilt", bin_dir, "--skip-sanitize", "--tokens", "none", timeout=3)
    assert r.returncode == 124
    assert time.time() - t0 < 30
    assert "=== summary" in r.stdout and "stopped by a signal during the step above" in r.stdout
    with tarfile.open(out / "logs.tgz") as t:
        assert "gpu-check/gpu-tests.log" in t.getnames()
    time.sleep(0.5)
    assert not running(sleep), "a step left running"


def test_a_normal_run_keeps_the_steps_status_and_benches_skew(tmp_path):
    bin_dir = stand_ins(tmp_path, "echo '[  PASSED  ] 3 tests.'", cpu_tests="exit 1")
    r, out = run(tmp_path, "--prebuilt", bin_dir, "--skip-sanitize", "--tokens", "none", "--skew", "1,16",
                 "--presets", "mixtral-8x7b")
    assert r.returncode == 1, r.stdout  # the CPU tests' failure
    assert "cpu tests: FAILED" in r.stdout
    assert "bench --skew mixtral-8x7b: rc=0" in r.stdout
    with tarfile.open(out / "logs.tgz") as t:
        log = t.extractfile("gpu-check/bench-mixtral-8x7b-bf16-skew.log").read().decode()
    assert "bench --skew --preset mixtral-8x7b --tokens 1,16 --json" in log
