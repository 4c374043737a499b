"""Compiling a Plan for the CUDA target (TSCompiler §5, §6 without a GPU): every group gets its
SIMT family's kernel; configurable families (GEMM) get their variants from the schedule stage
(:func:`tscomp.schedule.schedules.schedule_analytic` on the CUDA :class:`~tscomp.schedule.target.Target`:
the analytic ranking of :mod:`tscomp.schedule.gpu_space`, method "analytic", unmeasured),
all kernels go into one CUDA translation unit (one prelude; each group's body in its own C++
namespace, entry points ``extern "C"``) built by nvcc into a cubin per architecture plus PTX, with
ptxas resources recorded per kernel and architecture. A GEMM variant that spills is rejected (the
next-ranked one replaces it); any other spilling kernel is an error. The same kernels run with
``device="opencl"`` from their OpenCL rendering.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

from tscomp.codegen.interpreted import InterpretedGroup
from tscomp.codegen.nvcc import compile_cubin, compile_ptx
from tscomp.codegen.simt.dialect import CUDA
from tscomp.errors import TscompError, UnsupportedOperatorError
from tscomp.graph.fusion.plan import Plan
from tscomp.schedule.target import cuda

DEFAULT_ARCHS = ("sm_80", "sm_90")


@dataclass
class CudaCompiled:
    plan: Plan
    kernels: dict                      # group -> [variants]
    archs: tuple
    builds: dict = field(default_factory=dict)    # arch -> CudaBuild (not stored in the plan)
    ptx: str = ""
    ptx_arch: str = ""
    source: str = ""                   # the translation unit
    ranking: dict = field(default_factory=dict)  # group -> top analytic rankings (unmeasured)
    schedules: object = None           # the schedule stage's Schedules (method "analytic", unmeasured)
    notes: list = field(default_factory=list)
    compile_seconds: float = 0.0
    dims: list = field(default_factory=list)


def _m_range(analysis) -> tuple[int, int]:
    lo, hi = analysis.symtab.bounds(analysis.M)
    lo = max(1, int(lo)) if math.isfinite(lo) else 1
    hi = int(hi) if math.isfinite(hi) else 65536
    return lo, max(lo, hi)


@functools.lru_cache(maxsize=64)
def _gemm_space_cached(K: int, N: int, target, lo: int, hi: int, tf32: bool):
    from tscomp.schedule.gpu_space import GpuGemmSpace
    return GpuGemmSpace(K, N, target, (lo, hi), tf32=tf32)


@dataclass(frozen=True)
class SimtCompileFamily:
    """A SIMT family as the CUDA compile sees it (DESIGN.md "Kernel family"): ``analyze`` (plan,
    group) -> analysis or UnsupportedOperatorError; ``space`` (analysis, target, tf32) -> the
    analytic search space the schedule stage ranks (None: nothing to configure); ``build``
    (analysis, configuration or None) -> the executor."""
    name: str
    kinds: tuple
    analyze: object
    build: object
    space: object = None


def _gemm_analyze(plan, group):
    from tscomp.codegen.cpu_gemm_group import GemmGroupAnalysis
    return GemmGroupAnalysis(plan, group)


def _gemm_build(an, tile):
    from tscomp.codegen.simt.gemm_group import SimtGemmGroup
    return SimtGemmGroup(an, tile)


def _gemm_space(an, target, tf32=False):
    return _gemm_space_cached(an.K, an.N, target, *_m_range(an), tf32)


def _batched_analyze(plan, group):
    from tscomp.codegen.cpu_batched_gemm import BatchedGemmAnalysis
    return BatchedGemmAnalysis(plan, group)


def _batched_build(an, tile):
    from tscomp.codegen.simt.batched import SimtBatchedGemm
    return SimtBatchedGemm(an) if tile is None else SimtBatchedGemm(an, tile)


def _conv_analyze(plan, group):
    from tscomp.codegen.cpu_conv import ConvAnalysis
    return ConvAnalysis(plan, group)


def _conv_build(an, tile):
    from tscomp.codegen.simt.conv import SimtConv
    return SimtConv(an) if tile is None else SimtConv(an, tile)


def _rows_analyze(plan, group):
    from tscomp.codegen.simt.groups import simt_group_source
    return simt_group_source(plan, group)


def _rows_build(src, _tile):
    from tscomp.codegen.simt.groups import SimtGroup
    return SimtGroup(src)


def _index_analyze(plan, group):
    from tscomp.codegen.simt.index import simt_index_source
    return simt_index_source(plan, group)


def _index_build(src, _tile):
    from tscomp.codegen.simt.index import SimtIndexGroup
    return SimtIndexGroup(src)


#: tried in order; the first whose analysis accepts a group compiles it
FAMILIES = (SimtCompileFamily("simt-gemm", ("gemm",), _gemm_analyze, _gemm_build, _gemm_space),
            SimtCompileFamily("simt-batched-gemm", ("gemm",), _batched_analyze, _batched_build),
            SimtCompileFamily("simt-conv", ("gemm",), _conv_analyze, _conv_build),
            SimtCompileFamily("simt-row-or-elementwise", ("elementwise", "reduce"), _rows_analyze, _rows_build),
            SimtCompileFamily("simt-index", ("opaque", "reduce"), _index_analyze, _index_build))


_FAMILY = {f.name: f for f in FAMILIES}


@dataclass
class _ScheduleFamily:
    """What the schedule stage reads of a family: its name and its analytic space for a target."""
    name: str
    space: object


@dataclass
class SimtChoice:
    """Which SIMT family took a group, with its analysis, or why none did (the schedule stage's input)."""
    group: object
    compile_family: SimtCompileFamily | None
    analysis: object = None
    reasons: list = field(default_factory=list)
    tf32: bool = False

    @property
    def family(self):
        f = self.compile_family
        if f is None:
            return None
        space = None if f.space is None else (lambda an, target, _s=f.space: _s(an, target, self.tf32))
        return _ScheduleFamily(f.name, space)


def choose_families(plan: Plan, tf32: bool = False) -> dict[str, SimtChoice]:
    out = {}
    for g in plan.groups:
        reasons = []
        for fam in FAMILIES:
            if g.kind not in fam.kinds:
                continue
            try:
                out[g.name] = SimtChoice(g, fam, fam.analyze(plan, g), tf32=tf32)
                break
            except UnsupportedOperatorError as exc:
                reasons.append(f"{fam.name}: {exc}")
        else:
            out[g.name] = SimtChoice(g, None, reasons=reasons or [f"no SIMT macro-kernel family for {g.kind} groups"])
    return out


def kernels_for(plan: Plan, choices: dict, schedules) -> dict:
    """Each group's executors for its scheduled variants (the numpy fallback where no family took it);
    analytic variants carry the schedule's reserve for the build's spill rejection."""
    out = {}
    for name, choice in choices.items():
        if choice.compile_family is None:
            out[name] = [InterpretedGroup(plan, choice.group, choice.reasons)]
            continue
        sched = schedules.groups[name]
        ks = [choice.compile_family.build(choice.analysis, v.config) for v in sched.variants]
        for k, v in zip(ks, sched.variants):
            if v.timings:     # timed on a GPU at compile time: the dispatch reads these
                k.measured_ms = [[int(m), ms] for m, ms in v.timings.items()]
        if sched.reserve:
            for k in ks:
                k.reserve = [v for v in sched.reserve if v.config not in {x.config for x in sched.variants}]
        out[name] = ks
    return out


def translation_unit(kernels: dict) -> str:
    """One CUDA source for every SIMT kernel: the prelude once, each kernel in its own namespace."""
    parts = ["/* tscomp CUDA translation unit: every SIMT kernel of the model (one namespace per kernel) */\n"]
    seen = set()
    n = 0
    for variants in kernels.values():
        for k in variants:
            if k.target != "cuda" or k.func in seen:
                continue
            seen.add(k.func)
            parts.append(f"{k.program.header}namespace ts_k{n} {{\n{k.program.body}\n}}  /* namespace ts_k{n} */\n")
            n += 1
    return CUDA.render("", "\n".join(parts), {"TS_WANT_ASYNC": 1, "TS_WANT_MMA": 1})


def _rejections(model: CudaCompiled) -> dict[str, str]:
    """Kernels the build cannot keep, by entry point, with why: register spills, or ptxas resources
    with which one block of the kernel's launch does not fit an SM of the architecture (the launch
    would fail: "too many resources requested"; the ranking only knew estimated registers)."""
    out: dict[str, str] = {}
    for arch, b in model.builds.items():
        for name, r in b.resources.items():
            if r.spills:
                out.setdefault(name, f"spills registers on {arch}")
        spec = cuda(arch).spec
        for variants in model.kernels.values():
            for k in variants:
                r = b.resources.get(k.func) if k.target == "cuda" else None
                if r is None:
                    continue
                threads = k.resources()["threads"]
                if not spec.fits(threads, r.registers, r.shared_bytes):
                    out.setdefault(k.func, f"{threads} threads x {r.registers} registers (ptxas) do not fit an "
                                           f"SM of {arch}")
    return out


def _replace_from_reserve(model: CudaCompiled, g: str, i: int, why: str) -> None:
    """Variant ``i`` of group ``g`` is rejected: the next configuration of its ranking takes its place."""
    variants = model.kernels[g]
    k = variants[i]
    reserve = k.__dict__.get("reserve") or []
    taken = {v.cfg for v in variants}
    reserve = [v for v in reserve if v.config not in taken]
    if not reserve:
        raise TscompError(f"group {g}: kernel {k.func} {why}, and no ranked configuration is left to replace it")
    model.notes.append(f"group {g}: rejected {k.cfg.slug()} ({why}); next in the ranking")
    repl = _FAMILY[k.family].build(k.analysis, reserve[0].config)
    repl.reserve = reserve[1:]
    variants[i] = repl
    sched = model.schedules.groups.get(g) if model.schedules is not None else None
    if sched is not None:     # the schedule records what was built
        sched.variants = list(sched.variants)
        sched.variants[i] = reserve[0]


def build_all(model: CudaCompiled) -> None:
    """nvcc the translation unit per architecture; replace variants that spill or cannot launch
    with ptxas's register count (reject, take the next in the ranking)."""
    for _attempt in range(4):
        model.source = translation_unit(model.kernels)
        model.builds = {arch: compile_cubin(model.source, arch) for arch in model.archs}
        rejected = _rejections(model)
        if not rejected:
            break
        for g, variants in model.kernels.items():
            for i, k in enumerate(variants):
                if k.func in rejected:
                    _replace_from_reserve(model, g, i, rejected[k.func])
    else:
        raise TscompError("kernels still spill or exceed the SM's resources after re-ranking")
    for variants in model.kernels.values():
        for k in variants:
            if k.target == "cuda":
                k.ptxas = {arch: {k.func: b.resources[k.func]} for arch, b in model.builds.items()
                           if k.func in b.resources}
                k.__dict__.pop("reserve", None)
                if k.family == "simt-gemm":
                    k.wave_arch = model.archs[0]
    model.ptx_arch = model.archs[0]
    model.ptx = compile_ptx(model.source, model.archs[0])


def _measuring_device(archs: tuple):
    """The GPU to time configurations on (``measure=True``); its architecture must be built."""
    from tscomp.runtime.device_opencl import device
    dev = device("cuda")      # no GPU, driver or bindings: a one-line DeviceError saying which
    if dev.arch not in archs:
        raise TscompError(f"the GPU here ({dev.device_name}) is {dev.arch}, which this compile does not build "
                          f"({', '.join(archs)}): add --arch {dev.arch} to measure on it")
    return dev


def compile_cuda_plan(plan: Plan, archs=DEFAULT_ARCHS, *, max_variants: int = 2, tf32: bool = False,
                      measure: bool = False, measure_top: int | None = None, log=None) -> CudaCompiled:
    """``tf32``: let the ranking pick tensor-core (wmma TF32) tiles for GEMMs (~1e-3 relative error on
    a GPU; OpenCL always runs their exact SIMT path). ``measure``: time the ranking's first
    ``measure_top`` configurations of each GEMM group on this machine's GPU and keep the measured
    choice (:mod:`tscomp.schedule.gpu_measure`); the ranking is for the GPU's architecture then."""
    t0 = time.perf_counter()
    archs = tuple(archs)
    for a in archs:
        cuda(a)     # unknown architectures are refused by name
    from tscomp.schedule.schedules import schedule_analytic
    dev = _measuring_device(archs) if measure else None
    # no SIMT family fuses attention yet: merged QK^T -> softmax -> P.V groups run as their parts
    plan = plan.split([g.name for g in plan.groups if g.parts])
    choices = choose_families(plan, tf32)
    # the schedule stage ranks for the first architecture (the wave model's and the PTX's), or the
    # architecture of the GPU it measures on
    schedules = schedule_analytic(plan, choices, cuda(dev.arch if dev else archs[0]), max_variants)
    if dev is not None:
        from tscomp.schedule.gpu_measure import DEFAULT_TOP, measure_on_gpu
        measure_on_gpu(plan, choices, schedules, lambda an, t: _FAMILY["simt-gemm"].build(an, t), dev,
                       top=measure_top or DEFAULT_TOP, max_variants=max_variants, log=log)
    ranking = {name: list(s.ranking) for name, s in schedules.groups.items() if s.ranking}
    model = CudaCompiled(plan, kernels_for(plan, choices, schedules), archs, ranking=ranking, schedules=schedules)
    build_all(model)
    model.compile_seconds = time.perf_counter() - t0
    return model


def compile_cuda(model_path: str, dims=(), archs=DEFAULT_ARCHS, *, max_variants: int = 2,
                 tf32: bool = False, measure: bool = False, measure_top: int | None = None, log=None) -> CudaCompiled:
    from tscomp.graph import load_model
    from tscomp.graph.fusion import fuse
    graph = load_model(model_path, list(dims))
    model = compile_cuda_plan(fuse(graph), archs, max_variants=max_variants, tf32=tf32, measure=measure,
                              measure_top=measure_top, log=log)
    model.dims = [str(d) for d in dims]
    return model


__all__ = ["CudaCompiled", "DEFAULT_ARCHS", "FAMILIES", "SimtChoice", "SimtCompileFamily", "build_all",
           "choose_families", "compile_cuda", "kernels_for", "compile_cuda_command", "compile_cuda_plan",
           "translation_unit"]


def compile_cuda_command(model_path: str, dims, output: str, archs=None, *, measure: bool = False,
                         measure_top: int | None = None) -> list[str]:
    """``tscomp compile --target cuda [--measure-gpu]``: compile, write the artifact, and say what was built."""
    from collections import Counter
    from pathlib import Path

    from tscomp.runtime.simt_artifact import write_cuda_artifact
    if not Path(model_path).is_file():
        raise TscompError(f"{model_path}: no such model file")
    model = compile_cuda(model_path, dims, tuple(archs or DEFAULT_ARCHS), measure=measure, measure_top=measure_top,
                         log=lambda msg: print(msg, flush=True))
    path = write_cuda_artifact(model, output)
    methods = model.schedules.summary() if model.schedules is not None else {}
    how = ("configurations timed on this GPU (measured-gpu)" if methods.get("measured-gpu")
           else "configurations ranked analytically (unmeasured)")
    fams = Counter(vs[0].family for vs in model.kernels.values())
    n_var = sum(len(vs) for vs in model.kernels.values())
    regs = {a: max((r.registers for r in b.resources.values()), default=0) for a, b in model.builds.items()}
    lines = [f"wrote {path}: {len(model.plan.groups)} groups, {n_var} kernel variants, {model.compile_seconds:.1f}s; "
             f"kernels by family: " + ", ".join(f"{k} {v}" for k, v in sorted(fams.items())),
             f"cuda {', '.join(model.archs)}: cubin per architecture + PTX ({model.ptx_arch}); no spills; max registers "
             + ", ".join(f"{a} {r}" for a, r in regs.items()) + f"; {how}"]
    for g, vs in model.kernels.items():
        if vs[0].family == "numpy":
            lines.append(f"  {g} runs on the numpy fallback: " + " | ".join(vs[0].reasons))
    lines += [f"  {n}" for n in model.notes]
    return lines
