"""SIMT kernel tests run on the default SIMT device: the OpenCL build on a CPU OpenCL runtime
(Debian's PoCL, installed by ``make venv`` as root), or the cubins on a GPU with
``TSCOMP_SIMT_DEVICE=cuda``; without the device they skip, saying why."""
from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def simt_device() -> str:
    """The name of the device the SIMT tests run on ("opencl" unless $TSCOMP_SIMT_DEVICE says "cuda")."""
    from tscomp.runtime.device_opencl import DeviceError, default_device_name, device
    name = default_device_name()
    if name == "opencl":
        pytest.importorskip("pyopencl", reason="pyopencl missing: install the 'opencl' extra")
    try:
        device(name)
    except DeviceError as exc:
        pytest.skip(f"no {name} device: {exc}")
    return name


@pytest.fixture(scope="session")
def nvcc():
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not installed (CUDA toolkit)")
    return shutil.which("nvcc")
