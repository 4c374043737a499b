"""Targets: the hardware a kernel is generated, tuned and dispatched for, as a value.

A :class:`Target` names a target (``cpu``, ``cuda``), its code dialect (``c``, ``cuda``) and its
hardware spec as plain data. Kernel families, search spaces, the tuner, the wave model and the
manifest read the spec from the Target they are handed; nothing else asks the host directly
(DESIGN.md, "The seams"). The host CPU's spec is *detected* (SIMD level from the compiler's
predefined macros, cache sizes from sysfs, cores from the affinity mask); CUDA specs come from a
table of the architectures the CUDA target knows (TSCompiler §5.1's GPU hierarchy, §6's wave model).

Blocks per wave (TSCompiler §6)::

    N_blocks_per_wave = min(smem_per_SM / smem_per_block, regs_per_SM / regs_per_block,
                            threads_per_SM / threads_per_block, max_blocks_per_SM) × N_SM

On the CPU a "block" is one parallel tile task of a macro-kernel and a wave is one task per
worker thread, so blocks per wave is the thread count.
"""
from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping

from tscomp.codegen.register_operands import VECTOR_REGISTERS
from tscomp.errors import TscompError

#: floats per SIMD vector per ISA the CPU backend generates (its vector registers:
#: tscomp.codegen.register_operands.VECTOR_REGISTERS)
VECTOR_WIDTH = {"avx512": 16, "avx2": 8, "scalar": 1}


class TargetError(TscompError):
    """An unknown target or architecture, or a target this machine cannot run."""


#: GEMM precisions a CPU target compiles for (issue 13). ``fp32``: everything in float32 (the
#: default). ``bf16``: the constant weights of the ``gemm`` family are packed as bfloat16 and its
#: inner products run on the AMX tiles where the CPU has them (:attr:`Target.gemm_isa`), else on
#: VDPBF16PS (AVX512_BF16), A rounded to bf16 while it is packed; accumulation and every other op
#: stay float32 (TSCompiler §5.4 reaches its GPU results with reduced-precision TensorCore GEMMs;
#: this is the CPU's counterpart).
PRECISIONS = ("fp32", "bf16")
#: the precisions one GEMM kernel is generated at: :data:`PRECISIONS`, and ``int8``, which is never a
#: model-wide choice: :func:`tscomp.codegen.families.gemm_target` picks it for a constant-weight GEMM
#: whose operands are integers that fit unsigned x signed bytes (a quantized model's MatMulInteger
#: or QDQ MatMul), on a CPU with AVX512_VNNI (VPDPBUSD: four u8 x s8 products summed into an int32
#: lane). Its sums are exact int32, converted to float32 once.
GEMM_PRECISIONS = PRECISIONS + ("int8",)


def check_precision(precision: str, spec=None) -> str:
    """``precision`` if it is one of :data:`PRECISIONS` and ``spec`` (a :class:`CpuSpec`, or None to
    skip the hardware check) can run it; else :class:`TargetError` naming what is missing."""
    if precision not in GEMM_PRECISIONS:
        raise TargetError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if precision == "int8" and spec is not None:
        if not isinstance(spec, CpuSpec):
            raise TargetError("int8 GEMM kernels are implemented for the cpu target only")
        if spec.isa != "avx512" or not spec.vnni:
            raise TargetError("int8 GEMM kernels need a CPU with AVX-512 and the avx512_vnni instructions "
                              f"(VPDPBUSD); this one has {spec.isa}{' without avx512_vnni' if not spec.vnni else ''}")
    if precision == "bf16" and spec is not None:
        if not isinstance(spec, CpuSpec):
            raise TargetError("precision bf16 is implemented for the cpu target only")
        if spec.isa != "avx512" or not spec.bf16:
            raise TargetError(f"precision bf16 needs a CPU with AVX-512 and the avx512_bf16 instructions "
                              f"(VDPBF16PS); this one has {spec.isa}"
                              f"{' without avx512_bf16' if not spec.bf16 else ''}; compile with --precision fp32")
    return precision


#: the most last-level cache one worker thread's data can count on keeping from one request to the
#: next. An L3 is shared with the socket's other cores and tenants: a 2-vCPU slice of a Xeon that
#: reports 480 MiB of L3 read 2 x 8 MiB at L3 rate (56 GB/s together) and 2 x 64 MiB at memory rate
#: (20 GB/s), so ResNet-50's 100 MB of weights were not cached between requests although they "fit"
LLC_SHARE_PER_CORE = 8 << 20


@dataclass(frozen=True)
class CpuSpec:
    """A CPU as the CPU kernel families see it: worker threads, SIMD level, register file, caches
    (bytes per core for L1/L2, the whole shared L3)."""
    cores: int
    isa: str
    vector_width: int
    vector_registers: int
    l1: int
    l2: int
    l3: int
    bf16: bool = False
    amx: bool = False       # AMX tiles with bf16 (TDPBF16PS), and the OS lets this process use them
    amx_int8: bool = False  # AMX tiles with int8 too (TDPBUSD: u8 x s8 quads into int32), granted likewise
    vnni: bool = False      # AVX512_VNNI: u8 x s8 dot products into int32 lanes (VPDPBUSD)

    def blocks_per_wave(self, resources: Mapping[str, int] | None = None) -> int:
        return max(1, self.cores)

    @property
    def llc_share(self) -> int:
        """Bytes of the last-level cache a model's data stays in between requests: the L3, at most
        :data:`LLC_SHARE_PER_CORE` per worker thread."""
        return min(self.l3, max(1, self.cores) * LLC_SHARE_PER_CORE)


@dataclass(frozen=True)
class GpuSpec:
    """An NVIDIA GPU architecture: the per-SM and per-block limits the occupancy formula uses."""
    arch: str                      # sm_80
    model: str                     # the card the numbers are from
    sms: int
    regs_per_sm: int
    regs_per_block: int
    max_regs_per_thread: int
    smem_per_sm: int               # bytes
    smem_per_block: int            # bytes (opt-in maximum for one block)
    max_threads_per_sm: int
    max_threads_per_block: int
    max_blocks_per_sm: int
    warp_size: int = 32
    cp_async: bool = False         # sm_80+: asynchronous global->shared copies
    mma_shapes: tuple[tuple[int, int, int], ...] = ((16, 8, 8),)   # tf32 mma.sync m16n8k8

    def blocks_per_sm(self, resources: Mapping[str, int]) -> int:
        """Resident blocks per SM for a kernel using ``resources`` (``threads``, ``registers`` per
        thread, ``shared_bytes`` per block); 0 if one block does not fit."""
        threads = int(resources.get("threads", 128))
        regs = int(resources.get("registers", 32))
        smem = int(resources.get("shared_bytes", 0))
        # registers are allocated per warp in units of 256 (a block must fit with that rounding)
        warp_regs = -(-regs * self.warp_size // 256) * 256
        warps = -(-threads // self.warp_size)
        if threads > self.max_threads_per_block or regs > self.max_regs_per_thread or smem > self.smem_per_block \
                or warp_regs * warps > self.regs_per_block:
            return 0
        limits = [self.max_blocks_per_sm, self.max_threads_per_sm // threads,
                  self.regs_per_sm // max(1, warp_regs * warps)]
        if smem:
            limits.append(self.smem_per_sm // smem)
        return max(0, min(limits))

    def fits(self, threads: int, registers: int, shared_bytes: int) -> bool:
        """Whether one block of ``threads`` at these per-thread registers and shared bytes can be
        resident on an SM (the launch fails otherwise: "too many resources requested")."""
        return self.blocks_per_sm({"threads": threads, "registers": registers, "shared_bytes": shared_bytes}) >= 1

    def blocks_per_wave(self, resources: Mapping[str, int] | None = None) -> int:
        return self.blocks_per_sm(resources or {}) * self.sms

    def occupancy(self, resources: Mapping[str, int]) -> float:
        """Resident warps / the SM's maximum warps (the occupancy the analytic model reports)."""
        threads = int(resources.get("threads", 128))
        warps = self.blocks_per_sm(resources) * -(-threads // self.warp_size)
        return warps / (self.max_threads_per_sm // self.warp_size)


#: the CUDA architectures the CUDA target knows (NVIDIA's published limits for the named card)
CUDA_SPECS: dict[str, GpuSpec] = {
    "sm_80": GpuSpec("sm_80", "A100-SXM4", sms=108, regs_per_sm=65536, regs_per_block=65536,
                     max_regs_per_thread=255, smem_per_sm=164 * 1024, smem_per_block=163 * 1024,
                     max_threads_per_sm=2048, max_threads_per_block=1024, max_blocks_per_sm=32,
                     cp_async=True),
    "sm_86": GpuSpec("sm_86", "RTX 3090", sms=82, regs_per_sm=65536, regs_per_block=65536,
                     max_regs_per_thread=255, smem_per_sm=100 * 1024, smem_per_block=99 * 1024,
                     max_threads_per_sm=1536, max_threads_per_block=1024, max_blocks_per_sm=16,
                     cp_async=True),
    "sm_89": GpuSpec("sm_89", "RTX 4090", sms=128, regs_per_sm=65536, regs_per_block=65536,
                     max_regs_per_thread=255, smem_per_sm=100 * 1024, smem_per_block=99 * 1024,
                     max_threads_per_sm=1536, max_threads_per_block=1024, max_blocks_per_sm=24,
                     cp_async=True),
    "sm_90": GpuSpec("sm_90", "H100-SXM5", sms=132, regs_per_sm=65536, regs_per_block=65536,
                     max_regs_per_thread=255, smem_per_sm=228 * 1024, smem_per_block=227 * 1024,
                     max_threads_per_sm=2048, max_threads_per_block=1024, max_blocks_per_sm=32,
                     cp_async=True),
}


@dataclass(frozen=True)
class Target:
    """What kernels are generated for: ``name`` (``cpu`` | ``cuda``), ``dialect`` (``c`` | ``cuda``),
    the hardware ``spec``, and whether candidates can be measured here (``measurable``: the CPU
    target on its own host) or must be ranked analytically (a GPU that is not present).
    ``precision`` (:data:`PRECISIONS`) is the GEMM precision the kernels are generated for: it is
    data of the target, so the families' source, build and packing steps, the search space, tuning
    records (:meth:`key`) and the manifest all read it from here."""
    name: str
    dialect: str
    spec: CpuSpec | GpuSpec
    measurable: bool = True
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    precision: str = "fp32"

    @property
    def isa(self) -> str:
        return self.spec.isa if isinstance(self.spec, CpuSpec) else self.spec.arch

    @property
    def threads(self) -> int:
        """Worker threads of a CPU target (blocks per wave); the SM count of a GPU."""
        return self.spec.cores if isinstance(self.spec, CpuSpec) else self.spec.sms

    @property
    def gemm_isa(self) -> str:
        """The instruction set of the constant-weight GEMM kernels: ``amx`` (the AMX tile unit, AVX-512
        for everything around it) for bf16 GEMMs, and int8 GEMMs, where the CPU has its tiles for that
        precision, else the SIMD ISA."""
        s = self.spec
        if isinstance(s, CpuSpec) and s.isa == "avx512" and (
                (self.precision == "bf16" and s.amx) or (self.precision == "int8" and s.amx_int8)):
            return "amx"
        return self.isa

    def blocks_per_wave(self, resources: Mapping[str, int] | None = None) -> int:
        return self.spec.blocks_per_wave(resources)

    def with_threads(self, threads: int) -> "Target":
        """The same CPU target run with another worker-thread count (the runtime's choice)."""
        if not isinstance(self.spec, CpuSpec):
            raise TargetError(f"{self.key()}: a GPU target has no thread count to set")
        if threads < 1:
            raise TargetError(f"thread count must be >= 1, got {threads}")
        return replace(self, spec=replace(self.spec, cores=int(threads)))

    def with_precision(self, precision: str) -> "Target":
        """The same target compiling its GEMMs at ``precision``; :class:`TargetError` when the
        hardware lacks the instructions (bf16 needs avx512_bf16)."""
        return replace(self, precision=check_precision(precision, self.spec))

    def key(self) -> str:
        """Stable identity for tuning records: everything that changes which configuration wins
        (fp32 keys carry no precision suffix, so records written before issue 13 still match)."""
        s = self.spec
        suffix = "" if self.precision == "fp32" else f"-{self.precision}"
        if self.gemm_isa == "amx":
            suffix += "-amx"
        if isinstance(s, CpuSpec):
            return f"cpu-{s.isa}-{s.cores}t-l1_{s.l1 // 1024}k-l2_{s.l2 // 1024}k-l3_{s.l3 // 1024}k{suffix}"
        return f"cuda-{s.arch}{suffix}"

    def to_json(self) -> dict:
        return {"name": self.name, "dialect": self.dialect, "measurable": self.measurable,
                "spec_kind": type(self.spec).__name__, "spec": _plain(asdict(self.spec)), "key": self.key(),
                "precision": self.precision}

    @classmethod
    def from_json(cls, data: Mapping) -> "Target":
        kinds = {"CpuSpec": CpuSpec, "GpuSpec": GpuSpec}
        try:
            kind = kinds[data["spec_kind"]]
            spec = dict(data["spec"])
            if kind is GpuSpec:
                spec["mma_shapes"] = tuple(tuple(m) for m in spec.get("mma_shapes", ()))
            precision = str(data.get("precision", "fp32"))
            check_precision(precision)
            return cls(data["name"], data["dialect"], kind(**spec), bool(data.get("measurable", True)),
                       precision=precision)
        except (KeyError, TypeError) as exc:
            raise TargetError(f"malformed target description {dict(data)!r}: {exc}") from None

    def describe(self) -> str:
        s = self.spec
        if isinstance(s, CpuSpec):
            return (f"cpu ({s.isa}, {s.cores} threads, {s.vector_registers} x {s.vector_width * 32}-bit registers, "
                    f"L1 {s.l1 // 1024} KiB, L2 {s.l2 // 1024} KiB, L3 {s.l3 // 1024} KiB"
                    + ("" if self.precision == "fp32" else f", {self.precision} GEMMs")
                    + (" on AMX tiles" if self.gemm_isa == "amx" else "") + ")")
        return f"cuda {s.arch} ({s.model}: {s.sms} SMs, {s.smem_per_sm // 1024} KiB shared/SM)"


def _plain(d):
    if isinstance(d, dict):
        return {k: _plain(v) for k, v in d.items()}
    if isinstance(d, (tuple, list)):
        return [_plain(v) for v in d]
    return d


# ---------------------------------------------------------------------------- host detection
def _cache_sizes() -> dict[int, int]:
    """Per-level data/unified cache sizes in bytes from sysfs (Linux); {} elsewhere."""
    from pathlib import Path

    sizes: dict[int, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(root.glob("index*")):
            if (index / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1024, "M": 1024 ** 2}.get(text[-1:], 1)
            sizes[level] = int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return {}
    return sizes


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


#: Linux x86-64: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) asks for the AMX tile state
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


def _has_amx(flags: set[str]) -> bool:
    """AMX tiles with bf16 on this CPU (``flags``: /proc/cpuinfo's), and the kernel grants this process
    the tile state (Linux hands it out per process on request; the generated kernels also request it
    when loaded)."""
    import ctypes
    import platform

    if not {"amx_tile", "amx_bf16"} <= flags or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def host_memory() -> int:
    """Physical memory of this machine in bytes (8 GiB where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def host_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.lru_cache(maxsize=None)
def _host_spec() -> CpuSpec:
    from tscomp.codegen.build import host_isa

    isa = host_isa()
    caches = _cache_sizes()
    flags = _cpu_flags()
    amx = _has_amx(flags)
    return CpuSpec(cores=host_threads(), isa=isa, vector_width=VECTOR_WIDTH[isa],
                   vector_registers=VECTOR_REGISTERS[isa], l1=caches.get(1, 32 * 1024),
                   l2=caches.get(2, 1024 * 1024), l3=caches.get(3, 16 * 1024 * 1024), bf16="avx512_bf16" in flags,
                   amx=amx, amx_int8=amx and "amx_int8" in flags, vnni="avx512_vnni" in flags)


def host_cpu(threads: int | None = None, *, isa: str | None = None, precision: str = "fp32") -> Target:
    """The CPU this process runs on (detected), optionally with another thread count or a lower ISA,
    compiling its GEMMs at ``precision`` (:class:`TargetError` if this CPU cannot run it)."""
    spec = _host_spec()
    if threads is not None:
        spec = replace(spec, cores=int(threads))
    if isa is not None and isa != spec.isa:
        if isa not in VECTOR_WIDTH:
            raise TargetError(f"unknown CPU ISA {isa!r}; expected one of {sorted(VECTOR_WIDTH)}")
        spec = replace(spec, isa=isa, vector_width=VECTOR_WIDTH[isa], vector_registers=VECTOR_REGISTERS[isa])
    return Target("cpu", "c", spec, measurable=True, precision=check_precision(precision, spec))


def cuda(arch: str = "sm_80") -> Target:
    """A CUDA target for ``arch``; tuned analytically (no GPU is assumed present)."""
    spec = CUDA_SPECS.get(arch)
    if spec is None:
        raise TargetError(f"unknown CUDA architecture {arch!r}; known: {', '.join(sorted(CUDA_SPECS))}")
    return Target("cuda", "cuda", spec, measurable=False)


__all__ = ["CUDA_SPECS", "CpuSpec", "GEMM_PRECISIONS", "GpuSpec", "PRECISIONS", "Target", "TargetError", "VECTOR_REGISTERS",
           "VECTOR_WIDTH", "check_precision", "cuda", "host_cpu", "host_memory", "host_threads"]
