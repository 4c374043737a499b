"""SIMT devices: the OpenCL executor (pyopencl, any OpenCL device — here a CPU runtime such as
Debian's PoCL) and the CUDA executor (NVIDIA's cuda-bindings; needs a GPU and a driver). Both run the
:class:`~tscomp.codegen.simt.launch.Launch` lists a SIMT kernel computes, so grid geometry and
argument marshalling are shared and tested here without a GPU (DESIGN.md, targets: "cuda").

``device("opencl")`` / ``device("cuda")`` return a process-wide device; ``run_launches`` uploads
the Buffers (one device allocation per Buffer object), launches in order, and reads back the
Buffers marked ``download``. ``session()`` does the same across several launch lists: allocations
live until the session closes and nothing is read back until ``fetch`` (a plan run keeps its
intermediates on the device). Programs are built once per source text.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import weakref

import numpy as np

from tscomp.codegen.simt.launch import Buffer, Launch
from tscomp.errors import TscompError


class DeviceError(TscompError):
    """A SIMT device that is not available here (no GPU, no CUDA bindings, no OpenCL platform) or a
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
        self.resident = ResidentCache(lambda mem: mem.release())

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

    def session(self) -> "_OpenCLSession":
        return _OpenCLSession(self)

    def run_launches(self, source: str, launches: list[Launch]) -> None:
        run_and_download(self.session(), source, launches)


class ResidentCache:
    """A device's copies of resident arrays (packed weights, graph constants), keyed by the array's
    identity and held only while the array lives: the device is a process-wide singleton, so holding
    the arrays kept every Runtime ever loaded on the device (its weights, host and device copies)
    until the process exited. An array's death is noted by a weak-reference callback; its memory is
    freed at the next :meth:`sweep` (a session's start), not inside the garbage collector."""

    def __init__(self, free):
        self._free = free                       # free(memory): release one device allocation
        self._held: dict[int, tuple] = {}       # id(array) -> (device memory, weak reference to it)
        self._dead: list[tuple] = []            # (id, reference) of arrays gone since the last sweep

    def __len__(self) -> int:
        return len(self._held)

    def get(self, array: np.ndarray):
        """The device copy of ``array``, or None."""
        held = self._held.get(id(array))
        return held[0] if held is not None and held[1]() is array else None

    def put(self, array: np.ndarray, memory) -> None:
        key = id(array)
        ref = weakref.ref(array, lambda r, key=key: self._dead.append((key, r)))
        old = self._held.get(key)
        self._held[key] = (memory, ref)
        if old is not None:          # the id's former array died before a sweep: its copy goes now
            self._free(old[0])

    def sweep(self) -> None:
        """Free the copies of arrays that died (entries since taken over by a new array stay)."""
        while self._dead:
            key, ref = self._dead.pop()
            held = self._held.get(key)
            if held is not None and held[1] is ref:
                del self._held[key]
                self._free(held[0])


class _Session:
    """Device allocations that live across several launch lists (a plan run: one group's output
    Buffer is the next group's input, and stays on the device in between). Keyed by the Buffer
    object, which the session keeps alive so its id cannot be reused while it is open. Nothing is
    read back until :meth:`fetch`; :meth:`close` frees every allocation (resident buffers stay with
    the device while their arrays live: :class:`ResidentCache`). ``stats``: uploads / downloads in
    count and bytes, for tests and benchmarks."""

    def __init__(self, device):
        self.device = device
        device.resident.sweep()                 # weights of dropped Runtimes leave the device
        self.bufs: dict[int, tuple] = {}        # id(Buffer) -> (device memory, the Buffer, its bytes)
        self.free: list[tuple] = []             # (bytes, device memory) released for reuse
        self.fetched: set[int] = set()          # ids of the Buffers read back so far
        self.held_bytes = 0
        self.stats = {"uploads": 0, "upload_bytes": 0, "downloads": 0, "download_bytes": 0, "host_steps": 0,
                      "peak_bytes": 0, "reused": 0}

    def _count(self, kind: str, nbytes: int) -> None:
        self.stats[kind + "s"] += 1
        self.stats[kind + "_bytes"] += int(nbytes)

    def memory(self, b: Buffer):
        if b.resident:
            return self._resident_memory(b)
        held = self.bufs.get(id(b))
        if held is None:
            need = max(b.array.nbytes, 1)
            fits = [i for i, (n, _) in enumerate(self.free) if need <= n <= 2 * need]
            if fits:    # reuse a released block: launches run in order, so its last readers are done
                n, mem = self.free.pop(min(fits, key=lambda i: self.free[i][0]))
                self.stats["reused"] += 1
                if b.upload and b.array.nbytes:
                    self._upload_into(mem, b)
            else:
                n, mem = need, self._allocate(b)
                self.held_bytes += n
                self.stats["peak_bytes"] = max(self.stats["peak_bytes"], self.held_bytes)
            held = self.bufs[id(b)] = (mem, b, n)
        return held[0]

    def _resident_memory(self, b: Buffer):
        """The device's copy of a resident buffer's array, uploaded at its first use and kept by the
        device's :class:`ResidentCache` while the array lives (never freed with the session)."""
        mem = self.device.resident.get(b.array)
        if mem is None:
            mem = self._allocate(b)
            self.device.resident.put(b.array, mem)
        return mem

    def release(self, b: Buffer) -> None:
        """``b`` is dead for the rest of the session: its memory goes to the free list, where a
        later allocation of up to its size (and at least half of it) takes it over."""
        held = self.bufs.pop(id(b), None)
        if held is not None:
            self.free.append((held[2], held[0]))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except Exception:
            if exc_type is None:     # a failure while closing is reported unless it follows another
                raise


class _OpenCLSession(_Session):
    def _allocate(self, b: Buffer):
        dev, mf = self.device, self.device.cl.mem_flags
        if b.upload:
            self._count("upload", b.array.nbytes)
            return dev.cl.Buffer(dev.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(b.array))
        return dev.cl.Buffer(dev.ctx, mf.READ_WRITE, size=max(b.array.nbytes, 1))

    def run(self, source: str, launches: list[Launch]) -> None:
        dev = self.device
        prg = dev.program(source)
        for launch in launches:
            if launch.empty:
                continue
            args = [self.memory(a) if isinstance(a, Buffer) else np.int64(a) for a in launch.args]
            dev._kernel(prg, launch.kernel)(dev.queue, launch.global_size, launch.block, *args)

    def _upload_into(self, mem, b: Buffer) -> None:
        self.device.cl.enqueue_copy(self.device.queue, mem, np.ascontiguousarray(b.array))
        self._count("upload", b.array.nbytes)

    def fetch(self, b: Buffer) -> None:
        """Read ``b`` back into ``b.array`` now (after every launch queued so far)."""
        held = self.bufs.get(id(b))
        if held is not None and b.array.size:
            self.device.cl.enqueue_copy(self.device.queue, b.array, held[0])
            self._count("download", b.array.nbytes)
        self.device.queue.finish()
        self.fetched.add(id(b))

    def close(self) -> None:
        self.device.queue.finish()
        self.bufs.clear()
        self.free.clear()


def run_and_download(session, code, launches: list[Launch]) -> None:
    """One launch list in its own session: launch, read back every Buffer marked ``download``, free."""
    with session:
        session.run(code, launches)
        seen = set()
        for launch in launches:
            for a in launch.args:
                if isinstance(a, Buffer) and a.download and a.array.size and id(a) not in seen and id(a) in session.bufs:
                    seen.add(id(a))
                    session.fetch(a)


class CudaDevice:
    """Launches cubins through NVIDIA's CUDA driver bindings (``cuda-bindings``, the ``tscomp[cuda]``
    extra: binary wheels, no compiler needed at install). Constructing it without the bindings, a
    driver or a GPU raises a one-line :class:`DeviceError` saying which.

    ``profile``: set to a list to have every launch append ``(kernel, milliseconds)`` measured with
    CUDA events around it (the GPU time of that launch alone)."""
    name = "cuda"

    def __init__(self):
        try:
            from cuda.bindings import driver as cu
        except ImportError:
            raise DeviceError("device='cuda' needs NVIDIA's CUDA driver bindings (pip install 'tscomp[cuda]' on a "
                              "machine with an NVIDIA GPU and driver); cuda-bindings is not installed here") from None
        self.cu = cu
        try:
            self._call("cuInit", 0)
        except DeviceError:
            raise
        except Exception as exc:   # the bindings raise their own error when libcuda.so is missing
            raise DeviceError(f"device='cuda': no NVIDIA driver on this machine ({str(exc).splitlines()[0]})") from None
        if self._call("cuDeviceGetCount") == 0:
            raise DeviceError("device='cuda': the CUDA driver found no NVIDIA GPU on this machine")
        self.dev = self._call("cuDeviceGet", 0)
        # the primary context: shared with any other CUDA user in this process (PyTorch, CuPy)
        self.ctx = self._call("cuDevicePrimaryCtxRetain", self.dev)
        self._call("cuCtxSetCurrent", self.ctx)
        attr = cu.CUdevice_attribute
        major = self._call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev)
        minor = self._call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev)
        self.arch = f"sm_{major}{minor}"
        self.device_name = self._call("cuDeviceGetName", 256, self.dev).split(b"\0", 1)[0].decode()
        self._modules: dict[str, object] = {}
        self._functions: dict[tuple, object] = {}
        self.resident = ResidentCache(lambda ptr: self.cu.cuMemFree(ptr))
        self.profile: list | None = None

    def _call(self, fn: str, *args):
        """Call a driver function; a failure raises DeviceError naming it and the driver's message.
        Returns the function's result (None, one value or a tuple)."""
        res = getattr(self.cu, fn)(*args)
        err, values = res[0], res[1:]
        if int(err) != 0:
            _, msg = self.cu.cuGetErrorString(err)
            text = msg.decode() if isinstance(msg, bytes) else str(err)
            raise DeviceError(f"device='cuda': {fn} failed: {text}")
        return values[0] if len(values) == 1 else (values or None)

    def _function(self, cubin: bytes, kernel: str):
        key = hashlib.sha256(cubin).hexdigest()
        mod = self._modules.get(key)
        if mod is None:
            mod = self._modules[key] = self._call("cuModuleLoadData", cubin)
        f = self._functions.get((key, kernel))
        if f is None:
            f = self._functions[(key, kernel)] = self._call("cuModuleGetFunction", mod, kernel.encode())
        return f

    def _launch(self, f, launch: Launch, ptrs: dict) -> None:
        # kernelParams is a void** whose entries point at each argument's value
        values = [ctypes.c_uint64(ptrs[id(a)]) if isinstance(a, Buffer) else ctypes.c_int64(int(a))
                  for a in launch.args]
        params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        self._call("cuLaunchKernel", f, *launch.grid, *launch.block, 0, 0, ctypes.addressof(params), 0)

    def _timed_launch(self, f, launch: Launch, ptrs: dict) -> None:
        start, end = self._call("cuEventCreate", 0), self._call("cuEventCreate", 0)
        self._call("cuEventRecord", start, 0)
        self._launch(f, launch, ptrs)
        self._call("cuEventRecord", end, 0)
        self._call("cuEventSynchronize", end)
        self.profile.append((launch.kernel, float(self._call("cuEventElapsedTime", start, end))))
        self._call("cuEventDestroy", start)
        self._call("cuEventDestroy", end)

    def session(self) -> "_CudaSession":
        return _CudaSession(self)

    def run_launches(self, cubin: bytes, launches: list[Launch]) -> None:
        run_and_download(self.session(), cubin, launches)


class _CudaSession(_Session):
    def _allocate(self, b: Buffer) -> int:
        dev = self.device
        ptr = int(dev._call("cuMemAlloc", max(b.array.nbytes, 1)))
        if b.upload and b.array.nbytes:
            arr = np.ascontiguousarray(b.array)
            try:
                dev._call("cuMemcpyHtoD", ptr, arr.ctypes.data, arr.nbytes)
            except DeviceError:
                dev.cu.cuMemFree(ptr)
                raise
            self._count("upload", arr.nbytes)
        return ptr

    def run(self, cubin: bytes, launches: list[Launch]) -> None:
        dev = self.device
        for launch in launches:
            if launch.empty:
                continue
            at = {id(a): self.memory(a) for a in launch.args if isinstance(a, Buffer)}
            f = dev._function(cubin, launch.kernel)
            (dev._timed_launch if dev.profile is not None else dev._launch)(f, launch, at)

    def _upload_into(self, ptr: int, b: Buffer) -> None:
        arr = np.ascontiguousarray(b.array)
        self.device._call("cuMemcpyHtoD", ptr, arr.ctypes.data, arr.nbytes)   # ordered after earlier launches
        self._count("upload", arr.nbytes)

    def fetch(self, b: Buffer) -> None:
        """Read ``b`` back into ``b.array`` now; a kernel's fault surfaces here, named."""
        dev = self.device
        dev._call("cuCtxSynchronize")
        held = self.bufs.get(id(b))
        if held is not None and b.array.size:
            if not b.array.flags.c_contiguous:
                raise DeviceError("an output buffer must be C-contiguous")
            dev._call("cuMemcpyDtoH", b.array.ctypes.data, held[0], b.array.nbytes)
            self._count("download", b.array.nbytes)
        self.fetched.add(id(b))

    def close(self) -> None:
        try:
            self.device._call("cuCtxSynchronize")
        finally:
            for ptr in [h[0] for h in self.bufs.values()] + [m for _, m in self.free]:
                self.device.cu.cuMemFree(ptr)
            self.bufs.clear()
            self.free.clear()


_DEVICES: dict[str, object] = {}


DEFAULT_DEVICE_ENV = "TSCOMP_SIMT_DEVICE"


def default_device_name() -> str:
    """The SIMT device that runs kernels when none is named: ``$TSCOMP_SIMT_DEVICE`` ("opencl" or
    "cuda"), else "opencl" (so the SIMT test suite runs unchanged on a GPU machine with
    ``TSCOMP_SIMT_DEVICE=cuda``)."""
    name = os.environ.get(DEFAULT_DEVICE_ENV, "opencl") or "opencl"
    if name not in ("opencl", "cuda"):
        raise DeviceError(f"{DEFAULT_DEVICE_ENV}={name!r}: expected 'opencl' or 'cuda'")
    return name


def device(name: str | None = None):
    """The process-wide SIMT device ``name`` ("opencl" | "cuda"; None: :func:`default_device_name`)."""
    name = default_device_name() if name is None else name
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


__all__ = ["CudaDevice", "DEFAULT_DEVICE_ENV", "DeviceError", "OpenCLDevice", "default_device_name", "device",
           "opencl_available"]
