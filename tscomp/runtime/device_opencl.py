"""SIMT devices: the OpenCL executor (pyopencl, any OpenCL device — here a CPU runtime such as
Debian's PoCL) and the CUDA executor (pycuda; needs a GPU and a driver). Both run the
:class:`~tscomp.codegen.simt.launch.Launch` lists a SIMT kernel computes, so grid geometry and
argument marshalling are shared and tested here without a GPU (DESIGN.md, targets: "cuda").

``device("opencl")`` / ``device("cuda")`` return a process-wide device; ``run_launches`` uploads
the Buffers (one device allocation per Buffer object), launches in order, and reads back the
Buffers marked ``download``. Programs are built once per source text.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from tscomp.codegen.simt.launch import Buffer, Launch
from tscomp.errors import TscompError


class DeviceError(TscompError):
    """A SIMT device that is not available here (no GPU, no pycuda, no OpenCL platform) or a
    kernel it failed to build."""


class OpenCLDevice:
    name = "opencl"

    def __init__(self):
        try:
            import pyopencl as cl
        except ImportError as exc:
            raise DeviceError("device='opencl' needs pyopencl (pip install 'tscomp[opencl]') and an OpenCL "
                              "runtime (Debian: apt-get install pocl-opencl-icd)") from exc
        self.cl = cl
        try:
            platforms = cl.get_platforms()
        except cl.Error as exc:
            raise DeviceError(f"no OpenCL platform ({exc}); install an OpenCL runtime "
                              f"(Debian: apt-get install pocl-opencl-icd)") from None
        devices = [(p.name, d) for p in platforms for d in p.get_devices()]
        if not devices:
            raise DeviceError("OpenCL platforms have no devices")
        # TSCOMP_OPENCL_DEVICE picks a platform or device by name (e.g. "oclgrind", the race detector);
        # by default the first device of a platform that is not a simulator
        want = os.environ.get("TSCOMP_OPENCL_DEVICE", "").lower()
        if want:
            dev = next((d for p, d in devices if want in p.lower() or want in d.name.lower()), None)
            if dev is None:
                raise DeviceError(f"TSCOMP_OPENCL_DEVICE={want!r} matches none of "
                                  f"{', '.join(f'{p}: {d.name}' for p, d in devices)}")
        else:
            dev = next((d for p, d in devices if "oclgrind" not in p.lower()), None)
            if dev is None:
                raise DeviceError("only the Oclgrind simulator is installed (hundreds of times slower): install an "
                                  "OpenCL runtime (Debian: apt-get install pocl-opencl-icd) or set "
                                  "TSCOMP_OPENCL_DEVICE=oclgrind to use it anyway")
        self.device_name = dev.name
        self.ctx = cl.Context([dev])
        self.queue = cl.CommandQueue(self.ctx)
        self.max_work_group = dev.max_work_group_size
        self._programs: dict[str, object] = {}
        self._kernels: dict[tuple, object] = {}

    def program(self, source: str):
        key = hashlib.sha256(source.encode()).hexdigest()
        prg = self._programs.get(key)
        if prg is None:
            try:
                prg = self.cl.Program(self.ctx, source).build(options=["-cl-std=CL1.2"])
            except self.cl.Error as exc:
                raise DeviceError(f"OpenCL build failed: {exc}") from None
            self._programs[key] = prg
        return prg

    def _kernel(self, prg, name: str):
        key = (id(prg), name)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = self.cl.Kernel(prg, name)
        return k

    def run_launches(self, source: str, launches: list[Launch]) -> None:
        cl = self.cl
        prg = self.program(source)
        mf = cl.mem_flags
        bufs: dict[int, object] = {}

        def dev(b: Buffer):
            d = bufs.get(id(b))
            if d is None:
                nbytes = max(b.array.nbytes, 1)
                if b.upload:
                    d = cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=b.array)
                else:
                    d = cl.Buffer(self.ctx, mf.READ_WRITE, size=nbytes)
                bufs[id(b)] = d
            return d

        for launch in launches:
            if launch.empty:
                continue
            args = [dev(a) if isinstance(a, Buffer) else np.int64(a) for a in launch.args]
            kern = self._kernel(prg, launch.kernel)
            kern(self.queue, launch.global_size, launch.block, *args)
        for launch in launches:
            for a in launch.args:
                if isinstance(a, Buffer) and a.download and id(a) in bufs and a.array.size:
                    cl.enqueue_copy(self.queue, a.array, bufs[id(a)])
        self.queue.finish()


class CudaDevice:
    """Launches cubins through pycuda (the ``tscomp[cuda]`` extra). Constructing it without pycuda
    or without a GPU raises a one-line :class:`DeviceError` saying which."""
    name = "cuda"

    def __init__(self):
        try:
            import pycuda.driver as drv
        except ImportError:
            raise DeviceError("device='cuda' needs pycuda (pip install 'tscomp[cuda]' on a machine with an NVIDIA "
                              "GPU and driver); pycuda is not installed here") from None
        try:
            drv.init()
            if drv.Device.count() == 0:
                raise DeviceError("device='cuda': pycuda found no NVIDIA GPU on this machine")
        except drv.Error as exc:
            raise DeviceError(f"device='cuda': the CUDA driver reports no usable GPU ({exc})") from None
        self.drv = drv
        self.ctx = drv.Device(0).make_context()
        self._modules: dict[str, object] = {}

    def run_launches(self, cubin: bytes, launches: list[Launch]) -> None:
        drv = self.drv
        key = hashlib.sha256(cubin).hexdigest()
        mod = self._modules.get(key) or self._modules.setdefault(key, drv.module_from_buffer(cubin))
        bufs: dict[int, object] = {}
        for launch in launches:
            if launch.empty:
                continue
            args = []
            for a in launch.args:
                if isinstance(a, Buffer):
                    if id(a) not in bufs:
                        bufs[id(a)] = drv.mem_alloc(max(a.array.nbytes, 1))
                        if a.upload:
                            drv.memcpy_htod(bufs[id(a)], a.array)
                    args.append(bufs[id(a)])
                else:
                    args.append(np.int64(a))
            mod.get_function(launch.kernel)(*args, grid=launch.grid, block=launch.block)
        for launch in launches:
            for a in launch.args:
                if isinstance(a, Buffer) and a.download and a.array.size:
                    drv.memcpy_dtoh(a.array, bufs[id(a)])


_DEVICES: dict[str, object] = {}


def device(name: str):
    """The process-wide SIMT device ``name`` ("opencl" | "cuda")."""
    if name not in ("opencl", "cuda"):
        raise DeviceError(f"unknown SIMT device {name!r}; expected 'opencl' or 'cuda'")
    d = _DEVICES.get(name)
    if d is None:
        d = _DEVICES[name] = OpenCLDevice() if name == "opencl" else CudaDevice()
    return d


def opencl_available() -> bool:
    try:
        device("opencl")
        return True
    except DeviceError:
        return False


__all__ = ["CudaDevice", "DeviceError", "OpenCLDevice", "device", "opencl_available"]
