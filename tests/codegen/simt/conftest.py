"""SIMT kernel tests run the OpenCL build on a CPU OpenCL runtime (Debian's PoCL, installed by
``make venv`` as root); without one they skip, saying why."""
from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def opencl():
    pytest.importorskip("pyopencl", reason="pyopencl missing: install the 'opencl' extra")
    from tscomp.runtime.device_opencl import DeviceError, device
    try:
        return device("opencl")
    except DeviceError as exc:
        pytest.skip(f"no OpenCL runtime: {exc}")


@pytest.fixture(scope="session")
def nvcc():
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not installed (CUDA toolkit)")
    return shutil.which("nvcc")
