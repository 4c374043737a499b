"""Compiling a Plan for the CUDA target (TSCompiler §5, §6 without a GPU): every group gets its
SIMT family's kernel (GEMM groups: the analytic ranking's variants, :mod:`tscomp.schedule.gpu_space`),
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
from tscomp.codegen.nvcc import CudaBuild, compile_cubin, compile_ptx
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
    notes: list = field(default_factory=list)
    compile_seconds: float = 0.0
    dims: list = field(default_factory=list)


@functools.lru_cache(maxsize=64)
def _ranked(K: int, N: int, arch: str, lo: int, hi: int, k: int, tf32: bool = False):
    from tscomp.schedule.gpu_space import GpuGemmSpace
    space = GpuGemmSpace(K, N, cuda(arch), (lo, hi), tf32=tf32)
    ranked = space.rank()
    return space.variants(k), tuple(r.to_json() for r in ranked[:5]), tuple(r.tile for r in ranked[:40])


def _m_range(analysis) -> tuple[int, int]:
    lo, hi = analysis.symtab.bounds(analysis.M)
    lo = max(1, int(lo)) if math.isfinite(lo) else 1
    hi = int(hi) if math.isfinite(hi) else 65536
    return lo, max(lo, hi)


def _gemm_variants(plan, group, arch, k, ranking, tf32=False):
    from tscomp.codegen.cpu_gemm_group import GemmGroupAnalysis
    from tscomp.codegen.simt.gemm_group import SimtGemmGroup
    an = GemmGroupAnalysis(plan, group)
    variants, top, reserve = _ranked(an.K, an.N, arch, *_m_range(an), k, tf32)
    ranking[group.name] = list(top)
    kernels = [SimtGemmGroup(an, t) for t in variants]
    for k_ in kernels:
        k_.reserve = [t for t in reserve if t not in variants]
    return kernels


def _one(build):
    return lambda plan, group, arch, k, ranking, tf32=False: [build(plan, group)]


def _batched(plan, group):
    from tscomp.codegen.cpu_batched_gemm import BatchedGemmAnalysis
    from tscomp.codegen.simt.batched import SimtBatchedGemm
    return SimtBatchedGemm(BatchedGemmAnalysis(plan, group))


def _conv(plan, group):
    from tscomp.codegen.cpu_conv import ConvAnalysis
    from tscomp.codegen.simt.conv import SimtConv
    return SimtConv(ConvAnalysis(plan, group))


def _rows(plan, group):
    from tscomp.codegen.simt.groups import SimtGroup, simt_group_source
    return SimtGroup(simt_group_source(plan, group))


#: (family, group kinds, variants builder), tried in order
FAMILIES = (("simt-gemm", ("gemm",), _gemm_variants), ("simt-batched-gemm", ("gemm",), _one(_batched)),
            ("simt-conv", ("gemm",), _one(_conv)),
            ("simt-row-or-elementwise", ("elementwise", "reduce"), _one(_rows)))


def choose_kernels(plan: Plan, arch: str, max_variants: int, ranking: dict, tf32: bool = False) -> dict:
    out = {}
    for g in plan.groups:
        reasons = []
        for name, kinds, build in FAMILIES:
            if g.kind not in kinds:
                continue
            try:
                out[g.name] = build(plan, g, arch, max_variants, ranking, tf32)
                break
            except UnsupportedOperatorError as exc:
                reasons.append(f"{name}: {exc}")
        else:
            out[g.name] = [InterpretedGroup(plan, g, reasons or [f"no SIMT macro-kernel family for {g.kind} groups"])]
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


def _spilling(build: CudaBuild) -> set:
    return {name for name, r in build.resources.items() if r.spill_stores or r.spill_loads}


def build_all(model: CudaCompiled) -> None:
    """nvcc the translation unit per architecture; replace spilling GEMM variants (reject, re-rank)."""
    from tscomp.codegen.simt.gemm_group import SimtGemmGroup
    for _attempt in range(4):
        model.source = translation_unit(model.kernels)
        model.builds = {arch: compile_cubin(model.source, arch) for arch in model.archs}
        spills = set().union(*(_spilling(b) for b in model.builds.values()))
        if not spills:
            break
        for g, variants in model.kernels.items():
            for i, k in enumerate(variants):
                if k.func not in spills:
                    continue
                if not isinstance(k, SimtGemmGroup) or not k.reserve:
                    raise TscompError(f"group {g}: kernel {k.func} spills registers on "
                                      f"{[a for a, b in model.builds.items() if k.func in _spilling(b)]}")
                model.notes.append(f"group {g}: rejected {k.cfg.slug()} (spills); next in the ranking")
                repl = SimtGemmGroup(k.analysis, k.reserve[0])
                repl.reserve = k.reserve[1:]
                variants[i] = repl
    else:
        raise TscompError("kernels still spill after re-ranking")
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


def compile_cuda_plan(plan: Plan, archs=DEFAULT_ARCHS, *, max_variants: int = 2, tf32: bool = False) -> CudaCompiled:
    """``tf32``: let the ranking pick tensor-core (wmma TF32) tiles for GEMMs (~1e-3 relative error on
    a GPU; OpenCL always runs their exact SIMT path)."""
    t0 = time.perf_counter()
    archs = tuple(archs)
    for a in archs:
        cuda(a)     # unknown architectures are refused by name
    ranking: dict = {}
    kernels = choose_kernels(plan, archs[0], max_variants, ranking, tf32)
    model = CudaCompiled(plan, kernels, archs, ranking=ranking)
    build_all(model)
    model.compile_seconds = time.perf_counter() - t0
    return model


def compile_cuda(model_path: str, dims=(), archs=DEFAULT_ARCHS, *, max_variants: int = 2,
                 tf32: bool = False) -> CudaCompiled:
    from tscomp.graph import load_model
    from tscomp.graph.fusion import fuse
    graph = load_model(model_path, list(dims))
    model = compile_cuda_plan(fuse(graph), archs, max_variants=max_variants, tf32=tf32)
    model.dims = [str(d) for d in dims]
    return model


__all__ = ["CudaCompiled", "DEFAULT_ARCHS", "build_all", "choose_kernels", "compile_cuda", "compile_cuda_command", "compile_cuda_plan",
           "translation_unit"]


def compile_cuda_command(model_path: str, dims, output: str, archs=None) -> list[str]:
    """``tscomp compile --target cuda``: compile, write the artifact, and say what was built."""
    from collections import Counter
    from pathlib import Path

    from tscomp.runtime.simt_artifact import write_cuda_artifact
    if not Path(model_path).is_file():
        raise TscompError(f"{model_path}: no such model file")
    model = compile_cuda(model_path, dims, tuple(archs or DEFAULT_ARCHS))
    path = write_cuda_artifact(model, output)
    fams = Counter(vs[0].family for vs in model.kernels.values())
    n_var = sum(len(vs) for vs in model.kernels.values())
    regs = {a: max((r.registers for r in b.resources.values()), default=0) for a, b in model.builds.items()}
    lines = [f"wrote {path}: {len(model.plan.groups)} groups, {n_var} kernel variants, {model.compile_seconds:.1f}s; "
             f"kernels by family: " + ", ".join(f"{k} {v}" for k, v in sorted(fams.items())),
             f"cuda {', '.join(model.archs)}: cubin per architecture + PTX ({model.ptx_arch}); no spills; max registers "
             + ", ".join(f"{a} {r}" for a, r in regs.items()) + "; configurations ranked analytically (unmeasured)"]
    for g, vs in model.kernels.items():
        if vs[0].family == "numpy":
            lines.append(f"  {g} runs on the numpy fallback: " + " | ".join(vs[0].reasons))
    lines += [f"  {n}" for n in model.notes]
    return lines
