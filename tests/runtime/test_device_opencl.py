"""SIMT devices: device="cuda" without the CUDA bindings, a driver or a GPU is a one-line error
saying which; the launch geometry and argument marshalling shared by both devices run on the default
SIMT device (OpenCL here), and the CUDA device's driver calls against a stand-in driver."""
from __future__ import annotations

import ctypes

import gc

import numpy as np
import pytest

from tscomp.codegen.simt.launch import (Buffer, Launch, grid_stride_launch, input_buffer, output_buffer,
                                        resident_buffer, scalar)
from tscomp.codegen.simt.program import SimtProgram
from tscomp.runtime.device_opencl import DEFAULT_DEVICE_ENV, DeviceError, default_device_name, device


@pytest.fixture(scope="module")
def simt_device():
    name = default_device_name()
    if name == "opencl":
        pytest.importorskip("pyopencl", reason="pyopencl missing: install the 'opencl' extra")
    try:
        return device(name)
    except DeviceError as exc:
        pytest.skip(f"no {name} device: {exc}")


def _cuda_usable() -> bool:
    try:
        device("cuda")
        return True
    except DeviceError:
        return False


def test_cuda_device_without_gpu_or_bindings_is_a_clear_one_line_error(monkeypatch):
    if _cuda_usable():
        pytest.skip("a GPU is usable here")
    from tscomp.runtime import device_opencl as dev_mod
    with pytest.raises(DeviceError) as exc:
        device("cuda")
    msg = str(exc.value)
    assert "\n" not in msg and "device='cuda'" in msg
    assert "cuda-bindings" in msg or "driver" in msg or "GPU" in msg
    monkeypatch.setitem(__import__("sys").modules, "cuda.bindings", None)     # bindings absent: named
    monkeypatch.delitem(dev_mod._DEVICES, "cuda", raising=False)
    with pytest.raises(DeviceError, match="cuda-bindings is not installed"):
        device("cuda")


def test_default_device_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(DEFAULT_DEVICE_ENV, raising=False)
    assert default_device_name() == "opencl"
    monkeypatch.setenv(DEFAULT_DEVICE_ENV, "cuda")
    assert default_device_name() == "cuda"
    monkeypatch.setenv(DEFAULT_DEVICE_ENV, "metal")
    with pytest.raises(DeviceError, match="TSCOMP_SIMT_DEVICE='metal'"):
        default_device_name()


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


def test_one_buffer_object_is_one_device_allocation_across_launches(simt_device):
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


class _FakeCudaDriver:
    """A stand-in for ``cuda.bindings.driver``: every call returns ``(CUresult, *values)``; device
    memory is host bytearrays keyed by fake addresses; a launch decodes its ``void**`` parameter
    array (``nargs`` per kernel) and its "kernel" fills every written (not uploaded) allocation it
    is passed with the launch's index."""

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"

    def __init__(self, nargs):
        self.nargs, self.mem, self.uploaded, self.htod = nargs, {}, set(), []
        self.calls, self.loaded, self.freed = [], [], []

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGetCount(self):
        return (0, 1)

    def cuDeviceGet(self, i):
        return (0, i)

    def cuDevicePrimaryCtxRetain(self, dev):
        return (0, "ctx")

    def cuCtxSetCurrent(self, ctx):
        return (0,)

    def cuDeviceGetAttribute(self, attr, dev):
        return (0, {"major": 9, "minor": 0}[attr])

    def cuDeviceGetName(self, n, dev):
        return (0, b"Fake GPU\0\0")

    def cuGetErrorString(self, err):
        return (0, b"fake error")

    def cuModuleLoadData(self, image):
        self.loaded.append(image)
        return (0, "module")

    def cuModuleGetFunction(self, mod, name):
        return (0, name.decode())

    def cuMemAlloc(self, n):
        addr = 0x1000 * (len(self.mem) + 1)
        self.mem[addr] = bytearray(n)
        return (0, addr)

    def cuMemcpyHtoD(self, dst, src, n):
        self.mem[dst][:n] = ctypes.string_at(src, n)
        self.uploaded.add(dst)
        self.htod.append(dst)
        return (0,)

    def cuMemcpyDtoH(self, dst, src, n):
        ctypes.memmove(dst, bytes(self.mem[src][:n]), n)
        return (0,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        ptrs = (ctypes.c_void_p * self.nargs[f]).from_address(params)
        args = [ctypes.c_int64.from_address(p).value for p in ptrs]
        self.calls.append((f, args, (gx, gy, gz), (bx, by, bz)))
        for a in args:
            if a in self.mem and a not in self.uploaded:
                self.mem[a][:] = bytes([len(self.calls)]) * len(self.mem[a])
        return (0,)

    def cuCtxSynchronize(self):
        return (0,)

    def cuMemFree(self, p):
        self.freed.append(p)
        return (0,)


def _fake_cuda(monkeypatch, nargs):
    import sys
    import types

    from tscomp.runtime import device_opencl as dev_mod
    fake = _FakeCudaDriver(nargs)
    pkg, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    pkg.bindings, bindings.driver = bindings, fake
    for name, mod in (("cuda", pkg), ("cuda.bindings", bindings), ("cuda.bindings.driver", fake)):
        monkeypatch.setitem(sys.modules, name, mod)
    saved = dev_mod._DEVICES.pop("cuda", None)
    try:
        cuda = dev_mod.device("cuda")
    finally:      # the stand-in must not outlive this test (later tests expect the real one's error)
        dev_mod._DEVICES.pop("cuda", None)
        if saved is not None:
            dev_mod._DEVICES["cuda"] = saved
    return fake, cuda


def test_cuda_device_marshals_the_shared_launches(monkeypatch):
    """The CUDA device maps the same Launch lists the OpenCL path runs: one allocation per Buffer
    object, inputs uploaded, scalars as int64, grid/block as given, outputs read back, every
    allocation freed."""
    fake, cuda = _fake_cuda(monkeypatch, {"k1": 3, "k3": 3})
    assert cuda.arch == "sm_90" and cuda.device_name == "Fake GPU"
    x = input_buffer(np.arange(6, dtype=np.float32), np.float32)
    scratch = Buffer(np.empty(6, np.float32), upload=False)
    out = output_buffer((6,), np.float32)
    cuda.run_launches(b"cubin", [Launch("k1", (2, 1, 1), (64, 1, 1), [x, scratch, scalar(6)]),
                                 Launch("k2", (0, 1, 1), (64, 1, 1), [x]),             # empty grid: skipped
                                 Launch("k3", (1, 3, 1), (128, 1, 1), [scratch, out, scalar(-2)])])
    assert fake.loaded == [b"cubin"] and [c[0] for c in fake.calls] == ["k1", "k3"]
    assert len(fake.mem) == 3                                 # x, scratch (shared by k1 and k3), out
    addr_x, addr_scratch, addr_out = sorted(fake.mem)
    assert np.frombuffer(bytes(fake.mem[addr_x]), np.float32).tolist() == x.array.tolist()
    name, args, grid, block = fake.calls[1]
    assert grid == (1, 3, 1) and block == (128, 1, 1)
    assert args == [addr_scratch, addr_out, -2]               # device pointers and the int64 scalar
    assert fake.calls[0][1] == [addr_x, addr_scratch, 6]
    assert out.array.view(np.uint8).tolist() == [2] * 24      # written by the second launch, read back
    assert sorted(fake.freed) == sorted(fake.mem)             # nothing leaks on the device
    # a resident buffer (packed weights): allocated and uploaded at its first call only, kept while
    # its array lives, freed at the first session after the array is gone
    w = np.arange(6, dtype=np.float32) * 10 + 7
    for _ in range(2):
        cuda.run_launches(b"cubin", [Launch("k1", (1, 1, 1), (64, 1, 1), [resident_buffer(w, np.float32), out, scalar(6)])])
    uploads = [a for a in fake.uploaded if np.frombuffer(bytes(fake.mem[a]), np.float32).tolist() == w.tolist()]
    assert len(uploads) == 1 and uploads[0] not in fake.freed and cuda.resident.get(w) == uploads[0]
    assert fake.htod.count(uploads[0]) == 1                   # one upload for both calls
    assert fake.calls[-1][1][0] == fake.calls[-2][1][0] == uploads[0]
    del w
    gc.collect()
    assert uploads[0] not in fake.freed                       # not inside the garbage collector
    cuda.run_launches(b"cubin", [Launch("k1", (1, 1, 1), (64, 1, 1), [x, out, scalar(6)])])
    assert fake.freed.count(uploads[0]) == 1 and len(cuda.resident) == 0


def test_a_resident_buffer_is_uploaded_once_and_kept_across_calls(simt_device):
    """Packed weights: the same array in every call is one device allocation for the device's life;
    a different array (even equal) is another; results stay right in every call."""
    body = """TS_KERNEL void axpy(TS_GLOBAL const float* TS_RESTRICT w, TS_GLOBAL const float* TS_RESTRICT x,
    TS_GLOBAL float* TS_RESTRICT y, const int64_t n)
{ for (int64_t i = TS_BLOCK(0) * TS_NTHREADS(0) + TS_THREAD(0); i < n; i += TS_NBLOCKS(0) * TS_NTHREADS(0)) y[i] = w[i] * x[i]; }
"""
    n = 1000
    w = np.arange(n, dtype=np.float32)
    gc.collect()                      # arrays earlier tests dropped leave the device first, so that
    simt_device.session().close()     # the counts below are this test's alone
    held = len(simt_device.resident)
    for call in range(3):
        x = np.full(n, call + 1, np.float32)
        out = output_buffer((n,), np.float32)
        SimtProgram("/* t */\n", body).run([grid_stride_launch("axpy", n, [resident_buffer(w, np.float32),
                                                                            input_buffer(x, np.float32), out, scalar(n)])])
        np.testing.assert_array_equal(out.array, w * (call + 1))
    assert len(simt_device.resident) == held + 1 and simt_device.resident.get(w) is not None
    with pytest.raises(ValueError, match="C-contiguous float32"):
        resident_buffer(w.reshape(10, 100).T, np.float32)     # a copy would be uploaded on every call
    # a dropped array's device copy (a Runtime unloaded) leaves the device at the next session
    del w
    gc.collect()
    simt_device.session().close()
    assert len(simt_device.resident) == held


def test_a_cuda_session_reuses_released_memory_and_frees_everything_at_close(monkeypatch):
    """A released buffer's allocation is taken over by a later one of up to its size (at least
    half), not by a larger one; nothing is read back before fetch; close frees each pointer once."""
    fake, cuda = _fake_cuda(monkeypatch, {"k": 1})
    big, small, bigger = (Buffer(np.zeros(n, np.float32), upload=False) for n in (64, 40, 200))
    with cuda.session() as s:
        s.run(b"cubin", [Launch("k", (1, 1, 1), (32, 1, 1), [big])])
        p_big = s.bufs[id(big)][0]
        s.release(big)
        s.run(b"cubin", [Launch("k", (1, 1, 1), (32, 1, 1), [small]), Launch("k", (1, 1, 1), (32, 1, 1), [bigger])])
        assert s.bufs[id(small)][0] == p_big and s.bufs[id(bigger)][0] != p_big
        assert s.stats["reused"] == 1 and s.stats["downloads"] == 0 and s.stats["peak_bytes"] == 4 * (64 + 200)
        s.fetch(bigger)
        assert s.stats["downloads"] == 1
    assert sorted(fake.freed) == sorted(fake.mem) and len(fake.freed) == len(set(fake.freed)) == 2


def test_a_failed_launch_is_the_error_reported_not_the_close_after_it(monkeypatch):
    """When a launch fails, the session still frees its memory on the way out, and the error raised
    names the launch, not the synchronize that fails after it."""
    fake, cuda = _fake_cuda(monkeypatch, {"k": 1})
    fake.cuLaunchKernel = lambda *a: (700,)            # CUDA_ERROR_ILLEGAL_ADDRESS
    fake.cuCtxSynchronize = lambda: (700,)
    with pytest.raises(DeviceError, match="cuLaunchKernel failed"):
        cuda.run_launches(b"cubin", [Launch("k", (1, 1, 1), (32, 1, 1), [input_buffer(np.ones(8, np.float32), np.float32)])])
    assert sorted(fake.freed) == sorted(fake.mem) and fake.mem
