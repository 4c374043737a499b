"""Building CUDA sources with nvcc: a cubin per architecture plus PTX for forward compatibility,
and each kernel's resources from ``ptxas -v`` (registers per thread, static shared memory, spill
stores/loads, stack) — what the GPU wave model (TSCompiler §6: blocks per wave from registers,
shared memory and threads per block) and the search space's hard constraints need.

Builds are cached by content (source, architecture, flags) under the kernel cache directory
(:func:`tscomp.codegen.build.cache_dir`). nvcc is found on ``PATH`` or at ``$TSCOMP_NVCC``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tscomp.errors import TscompError

#: warnings about unused prelude helpers are expected (one prelude for every kernel)
NVCC_FLAGS = ("-O3", "-std=c++17", "-diag-suppress", "177,550")


class NvccError(TscompError):
    """nvcc is missing or rejected a generated source."""


@dataclass(frozen=True)
class KernelResources:
    registers: int
    shared_bytes: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)

    def to_json(self) -> dict:
        return {"registers": self.registers, "shared_bytes": self.shared_bytes, "spill_stores": self.spill_stores,
                "spill_loads": self.spill_loads, "stack_bytes": self.stack_bytes}


@dataclass(frozen=True)
class CudaBuild:
    arch: str
    cubin: bytes
    resources: dict            # kernel name -> KernelResources

    @property
    def spills(self) -> bool:
        return any(r.spills for r in self.resources.values())


def nvcc_path() -> str:
    path = os.environ.get("TSCOMP_NVCC") or shutil.which("nvcc")
    if not path:
        raise NvccError("nvcc not found (install the CUDA toolkit or set TSCOMP_NVCC)")
    return path


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse_ptxas(text: str) -> dict[str, KernelResources]:
    """``ptxas -v`` output -> per entry function its resources (0 where ptxas says nothing)."""
    out: dict[str, KernelResources] = {}
    current, stack = None, (0, 0, 0)
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current, stack = m.group(1), (0, 0, 0)
            continue
        m = _STACK.search(line)
        if m and current:
            stack = tuple(int(x) for x in m.groups())
            continue
        m = _USED.search(line)
        if m and current:
            out[current] = KernelResources(int(m.group(1)), int(m.group(2) or 0), stack[1], stack[2], stack[0])
            current = None
    return out


def _cache_dir() -> Path:
    from tscomp.codegen.build import cache_dir
    d = cache_dir() / "cuda"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def compile_cubin(source: str, arch: str, flags: tuple[str, ...] = NVCC_FLAGS) -> CudaBuild:
    """``source`` -> cubin for ``arch`` (e.g. ``sm_80``) with its ptxas resources (cached)."""
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise NvccError(f"architecture {arch!r} is not of the form sm_XY")
    key = _key(source, arch, *flags)
    d = _cache_dir()
    cubin, meta = d / f"{key}_{arch}.cubin", d / f"{key}_{arch}.json"
    if cubin.exists() and meta.exists():
        res = {k: KernelResources(**v) for k, v in json.loads(meta.read_text()).items()}
        return CudaBuild(arch, cubin.read_bytes(), res)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        out = Path(tmp) / "kernel.cubin"
        proc = subprocess.run([nvcc_path(), "-cubin", f"-arch={arch}", "-Xptxas", "-v", *flags, "-o", str(out),
                               str(src)], capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise NvccError(f"nvcc failed for {arch}:\n{proc.stderr[-4000:]}")
        res = parse_ptxas(proc.stderr + proc.stdout)
        data = out.read_bytes()
    tmp_meta = meta.with_suffix(".tmp")
    tmp_meta.write_text(json.dumps({k: v.to_json() for k, v in res.items()}))
    cubin.write_bytes(data)
    os.replace(tmp_meta, meta)
    return CudaBuild(arch, data, res)


def compile_ptx(source: str, arch: str = "sm_80", flags: tuple[str, ...] = NVCC_FLAGS) -> str:
    """PTX for ``compute_XY`` (forward compatibility: a newer driver JIT-compiles it)."""
    virtual = "compute_" + arch.split("_", 1)[1].rstrip("a")
    key = _key(source, virtual, *flags)
    path = _cache_dir() / f"{key}_{virtual}.ptx"
    if path.exists():
        return path.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        out = Path(tmp) / "kernel.ptx"
        proc = subprocess.run([nvcc_path(), "-ptx", f"-arch={virtual}", *flags, "-o", str(out), str(src)],
                              capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise NvccError(f"nvcc -ptx failed for {virtual}:\n{proc.stderr[-4000:]}")
        text = out.read_text()
    path.write_text(text)
    return text


def default_arch_of_device() -> str:   # pragma: no cover - needs a GPU
    """The architecture (``sm_XY``) of the GPU that ``device("cuda")`` runs on."""
    from tscomp.runtime.device_opencl import device
    return device("cuda").arch


__all__ = ["CudaBuild", "KernelResources", "NVCC_FLAGS", "NvccError", "compile_cubin", "compile_ptx",
           "default_arch_of_device", "nvcc_path", "parse_ptxas"]
