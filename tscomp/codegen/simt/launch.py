"""Launch geometry and argument marshalling shared by every SIMT device (DESIGN.md "runtime":
execute on cuda (cuda-bindings) | opencl (pyopencl); TSCompiler §6: the grid of a macro-kernel is a
function of the concrete shape and the tile configuration).

A SIMT executor turns (group inputs, symbol binding) into a list of :class:`Launch` es: the kernel
entry point, the grid and block extents, and the arguments in order — device buffers named by
role (an input array uploaded, an output or scratch array allocated and read back) and scalars
(``int64_t`` symbol values, M). A device (:mod:`tscomp.runtime.device_opencl`, the CUDA driver one)
only maps these to its API; nothing here imports a GPU library.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tscomp.errors import ExecutionError


@dataclass
class Buffer:
    """One array argument: ``array`` uploaded before the launch when ``upload``; read back into
    ``array`` after it when ``download``. The same Buffer object in two launches is one device
    allocation (a scratch the second kernel reads)."""
    array: np.ndarray
    upload: bool = True
    download: bool = False
    #: the same array in every call (packed weights): a device uploads it once and keeps it, keyed
    #: by the array's identity, for as long as the array lives (device_opencl.ResidentCache)
    resident: bool = False


@dataclass
class Launch:
    kernel: str                              # entry point in the program
    grid: tuple[int, int, int]               # blocks per axis
    block: tuple[int, int, int]              # threads per block per axis
    args: list = field(default_factory=list)  # Buffer | np.int64 (scalars are 64-bit)

    @property
    def global_size(self) -> tuple[int, int, int]:
        """OpenCL's NDRange: grid × block per axis."""
        return tuple(g * b for g, b in zip(self.grid, self.block))

    @property
    def empty(self) -> bool:
        return any(g == 0 for g in self.grid)


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def scalar(v) -> np.int64:
    return np.int64(int(v))


class DeviceArray(np.ndarray):
    """A value that stays on the SIMT device during a plan run (one group's output, the next one's
    input): a host array of the value's shape and dtype whose contents are NOT valid until the run's
    session fetches ``buffer`` (the device allocation it views). Views that keep the memory
    layout (reshapes) stay device values; :func:`input_buffer` refuses any other."""

    buffer: Buffer

    def __array_finalize__(self, obj):
        self.buffer = getattr(obj, "buffer", None)


class DeviceValueError(ExecutionError):
    """A device value used where its host contents would be needed (a bug in the caller: fetch it)."""


def device_array(b: Buffer) -> DeviceArray:
    a = b.array.view(DeviceArray)
    a.buffer = b
    return a


def _same_memory(a: DeviceArray, dtype) -> bool:
    """``a`` reads exactly its buffer's memory, in its order and element type."""
    base = a.buffer.array
    return (a.dtype == dtype and a.flags.c_contiguous and a.nbytes == base.nbytes
            and a.__array_interface__["data"][0] == base.__array_interface__["data"][0])


def input_buffer(arr, dtype) -> Buffer:
    """A read-only argument from a host array (made contiguous in the kernel's element type), or the
    device allocation of a :class:`DeviceArray` (nothing uploaded)."""
    if isinstance(arr, DeviceArray) and arr.buffer is not None:
        if not _same_memory(arr, dtype):
            raise DeviceValueError(f"a device value of {arr.dtype} {arr.shape} cannot be passed as a {np.dtype(dtype)} "
                                   f"argument without its host contents (a view that moves data, or a conversion)")
        return arr.buffer
    a = np.asarray(arr)
    if a.dtype != dtype or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=dtype)
    if a.size == 0:
        a = np.zeros(1, dtype)   # devices refuse zero-byte buffers; nothing reads it
    return Buffer(a, upload=True)


def resident_buffer(arr: np.ndarray, dtype) -> Buffer:
    """A constant argument (a kernel's packed weights), kept on the device across calls. ``arr``
    must already be a non-empty C-contiguous ``dtype`` array: it is kept by identity, so a copy
    made here would be uploaded again on every call."""
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype or not arr.flags.c_contiguous or arr.size == 0:
        raise ValueError(f"a resident buffer needs a non-empty C-contiguous {np.dtype(dtype)} array "
                         f"(got {getattr(arr, 'dtype', type(arr))}, shape {getattr(arr, 'shape', '?')})")
    return Buffer(arr, upload=True, resident=True)


def output_buffer(shape, dtype) -> Buffer:
    return Buffer(np.empty(shape, dtype), upload=False, download=True)


def grid_stride_launch(kernel: str, total: int, args: list, block: int = 256, max_blocks: int = 4096) -> Launch:
    """A 1-D launch for ``total`` independent items walked by a grid-stride loop."""
    blocks = max(1, min(max_blocks, ceil_div(max(total, 1), block)))
    return Launch(kernel, (blocks, 1, 1), (block, 1, 1), args)


__all__ = ["Buffer", "DeviceArray", "DeviceValueError", "Launch", "ceil_div", "device_array", "grid_stride_launch",
           "input_buffer", "output_buffer", "resident_buffer", "scalar"]
