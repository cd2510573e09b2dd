"""tests/python — pytest for the moekit Python package (installed: `pip install .`).

CPU tests (CI) run everywhere: the import, planning, validation errors (NumPy / buffer-protocol
arrays where no torch is installed), the package's import graph (parsed, not imported), HF weight
packing (needs torch, skipped without it). GPU tests (marked `gpu`) need a Hopper GPU and PyTorch
with CUDA, and are skipped elsewhere with the reason shown (pytest -rs).
"""
import importlib.util

import pytest

import moekit

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _gpu_reason():
    if not HAS_TORCH:
        return "needs PyTorch"
    import torch

    if not torch.cuda.is_available() or moekit.device_count() == 0:
        return "needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return f"needs a Hopper GPU (sm_90a), found compute capability {major}.{minor}"
    return None


GPU_SKIP_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    if GPU_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The Hopper H200 of the device runs: (capability 9.0, 132 SMs, 227 KiB of opt-in shared memory).
H200 = dict(name="NVIDIA H200", sm_count=132, cc_major=9, cc_minor=0, smem_per_block_optin=232448,
            l2_bytes=60 * 1024 * 1024)


@pytest.fixture
def h200():
    return moekit.DeviceInfo(**H200)
