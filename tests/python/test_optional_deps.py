"""Without an optional dependency (PyTorch; matplotlib for moekit.plot) a moekit entry says in one
line what is missing and how to install it, and shows no traceback. A CPU test: each case runs in
a fresh interpreter where the dependency is hidden (sys.modules[name] = None makes its import fail
and find_spec report it missing), so it runs the same where torch is installed."""
import subprocess
import sys

import pytest

HIDE = "import sys; sys.modules[{dep!r}] = None; "


def run(dep: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE.format(dep=dep) + code], capture_output=True, text=True,
                          timeout=120)


def run_main(dep: str, module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m module args...` with `dep` hidden."""
    code = f"import runpy; sys.argv = [{module!r}, *{list(args)!r}]; runpy.run_module({module!r}, run_name='__main__')"
    return run(dep, code)


@pytest.mark.parametrize("args", [["--help"], ["--presets", "mixtral-8x7b"]])
def test_bench_without_torch_prints_one_line(args):
    r = run_main("torch", "moekit.bench", *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "moekit.bench needs PyTorch" in lines[0] and "pip install" in lines[0]


@pytest.mark.parametrize("module", ["moekit.torch", "moekit.stages", "moekit.fp8", "moekit.hf", "moekit.reference",
                                    "moekit.bench"])
def test_torch_modules_without_torch_raise_one_clear_error(module):
    r = run("torch", f"import {module}")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (f"ModuleNotFoundError: {module} needs PyTorch, which is not installed: "
                                                 "pip install 'moekit[torch]' (or pip install torch)")


@pytest.mark.parametrize("name", ["fused_moe", "fused_experts", "quantize_fp8_weights", "torch"])
def test_torch_names_of_the_package_without_torch(name):
    r = run("torch", f"import moekit\ntry:\n    moekit.{name}\nexcept ImportError as e:\n    print(e)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"moekit.{name} needs PyTorch, which is not installed: pip install 'moekit[torch]' " \
                               "(or pip install torch)"


def test_import_moekit_needs_no_torch():
    r = run("torch", "import moekit, moekit.presets; print(moekit.__version__)")
    assert r.returncode == 0 and r.stdout.count(".") == 2, r.stderr


def test_plot_without_matplotlib_prints_one_line():
    r = run_main("matplotlib", "moekit.plot", "--help")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip() == ("moekit.plot needs matplotlib, which is not installed: pip install 'moekit[plot]' "
                                "(or pip install matplotlib)")
