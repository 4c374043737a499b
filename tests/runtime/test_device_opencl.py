"""SIMT devices: device="cuda" without pycuda/GPU is a one-line error saying which; the launch
geometry and argument marshalling shared by both devices run here on OpenCL."""
from __future__ import annotations

import numpy as np
import pytest

from tscomp.codegen.simt.launch import Buffer, Launch, grid_stride_launch, input_buffer, output_buffer, scalar
from tscomp.codegen.simt.program import SimtProgram
from tscomp.runtime.device_opencl import DeviceError, device


@pytest.fixture(scope="module")
def opencl():
    pytest.importorskip("pyopencl", reason="pyopencl missing: install the 'opencl' extra")
    try:
        return device("opencl")
    except DeviceError as exc:
        pytest.skip(f"no OpenCL runtime: {exc}")


def test_cuda_device_without_gpu_or_pycuda_is_a_clear_one_line_error():
    try:
        import pycuda.driver  # noqa: F401
        pytest.skip("pycuda is installed here")
    except ImportError:
        pass
    with pytest.raises(DeviceError) as exc:
        device("cuda")
    msg = str(exc.value)
    assert "\n" not in msg and "pycuda" in msg and "device='cuda'" in msg


def test_unknown_device_is_refused():
    with pytest.raises(DeviceError, match="unknown SIMT device 'vulkan'"):
        device("vulkan")


def test_launch_geometry_and_marshalling():
    launch = Launch("k", (3, 2, 1), (128, 1, 1), [scalar(5)])
    assert launch.global_size == (384, 2, 1) and not launch.empty
    assert Launch("k", (0, 2, 1), (128, 1, 1)).empty
    g = grid_stride_launch("k", 1000, [], block=256)
    assert g.grid == (4, 1, 1) and g.block == (256, 1, 1)
    assert grid_stride_launch("k", 0, []).grid == (1, 1, 1)
    b = input_buffer(np.arange(6, dtype=np.int32).reshape(2, 3).T, np.float32)   # non-contiguous, other dtype
    assert b.array.dtype == np.float32 and b.array.flags.c_contiguous and b.upload and not b.download
    assert input_buffer(np.zeros((0, 4), np.float32), np.float32).array.size == 1   # never a 0-byte buffer
    o = output_buffer((2, 2), np.float32)
    assert o.download and not o.upload


def test_one_buffer_object_is_one_device_allocation_across_launches(opencl):
    body = """TS_KERNEL void fill(TS_GLOBAL float* TS_RESTRICT y, const int64_t n)
{ for (int64_t i = TS_BLOCK(0) * TS_NTHREADS(0) + TS_THREAD(0); i < n; i += TS_NBLOCKS(0) * TS_NTHREADS(0)) y[i] = (float)i; }
TS_KERNEL void twice(TS_GLOBAL float* TS_RESTRICT y, TS_GLOBAL float* TS_RESTRICT z, const int64_t n)
{ for (int64_t i = TS_BLOCK(0) * TS_NTHREADS(0) + TS_THREAD(0); i < n; i += TS_NBLOCKS(0) * TS_NTHREADS(0)) z[i] = 2 * y[i]; }
"""
    n = 1000
    scratch = Buffer(np.empty(n, np.float32), upload=False)
    out = output_buffer((n,), np.float32)
    SimtProgram("/* t */\n", body).run([grid_stride_launch("fill", n, [scratch, scalar(n)], block=64),
                                        grid_stride_launch("twice", n, [scratch, out, scalar(n)], block=64)])
    np.testing.assert_array_equal(out.array, 2 * np.arange(n, dtype=np.float32))


class _Mem(np.ndarray):
    """Fake device memory (an ndarray subclass takes attributes)."""


class _FakeDriver:
    """A stand-in for pycuda.driver: device memory as numpy arrays, launches recorded."""

    class Error(Exception):
        pass

    def __init__(self):
        self.calls, self.allocs, self.loaded = [], [], []
        drv = self

        class Device:
            def __init__(self, i):
                pass

            @staticmethod
            def count():
                return 1

            def make_context(self):
                return object()

        class Module:
            def get_function(self, name):
                def launch(*args, grid, block):
                    drv.calls.append((name, args, grid, block))
                    for a in args:   # the "kernel": fills every written buffer with its launch index
                        if isinstance(a, np.ndarray) and a.dtype == np.uint8 and getattr(a, "is_out", False):
                            a[:] = len(drv.calls)
                return launch

        self.Device, self._Module = Device, Module

    def init(self):
        pass

    def module_from_buffer(self, cubin):
        self.loaded.append(cubin)
        return self._Module()

    def mem_alloc(self, n):
        mem = np.zeros(n, np.uint8).view(_Mem)
        self.allocs.append(mem)
        return mem

    def memcpy_htod(self, dst, src):
        dst[:] = np.ascontiguousarray(src).view(np.uint8).reshape(-1)

    def memcpy_dtoh(self, dst, src):
        dst.view(np.uint8).reshape(-1)[:] = src


def test_cuda_device_marshals_the_shared_launches(monkeypatch):
    """The pycuda path maps the same Launch lists the OpenCL path runs: one allocation per Buffer
    object, inputs uploaded, scalars as int64, grid/block as given, outputs read back."""
    import sys
    import types

    from tscomp.runtime import device_opencl as dev_mod
    fake = _FakeDriver()
    pkg = types.ModuleType("pycuda")
    pkg.driver = fake
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake)
    saved = dev_mod._DEVICES.pop("cuda", None)
    try:
        cuda = dev_mod.device("cuda")
    finally:      # the stand-in must not outlive this test (later tests expect the real one's error)
        dev_mod._DEVICES.pop("cuda", None)
        if saved is not None:
            dev_mod._DEVICES["cuda"] = saved
    x = input_buffer(np.arange(6, dtype=np.float32), np.float32)
    scratch = Buffer(np.empty(6, np.float32), upload=False)
    out = output_buffer((6,), np.float32)
    orig_alloc = fake.mem_alloc

    def alloc(n):                  # mark allocations of non-uploaded buffers as kernel-written
        mem = orig_alloc(n)
        mem.is_out = len(fake.allocs) > 1
        return mem
    fake.mem_alloc = alloc
    cuda.run_launches(b"cubin", [Launch("k1", (2, 1, 1), (64, 1, 1), [x, scratch, scalar(6)]),
                                 Launch("k2", (0, 1, 1), (64, 1, 1), [x]),             # empty grid: skipped
                                 Launch("k3", (1, 3, 1), (128, 1, 1), [scratch, out, scalar(-2)])])
    assert fake.loaded == [b"cubin"] and [c[0] for c in fake.calls] == ["k1", "k3"]
    assert len(fake.allocs) == 3                              # x, scratch (shared by k1 and k3), out
    assert np.array_equal(fake.allocs[0].view(np.float32), x.array)
    name, args, grid, block = fake.calls[1]
    assert grid == (1, 3, 1) and block == (128, 1, 1)
    assert args[0] is fake.allocs[1] and isinstance(args[2], np.int64) and args[2] == -2
    assert out.array.view(np.uint8).tolist() == [2] * 24      # written by the second launch, read back
