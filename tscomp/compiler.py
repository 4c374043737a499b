"""``tscomp compile``: ONNX model → compiled model (TSCompiler Fig. 2, offline half).

The stages run in order and talk through their output objects only: the graph stage gives a
:class:`~tscomp.graph.fusion.plan.Plan`; each fused group gets its macro-kernel variants from the
family table (:mod:`tscomp.codegen.families`); each variant with a choice to make gets its
single-wave time measured (TSCompiler §6: T_single_wave, the quantity the runtime's wave model
scales); the result is a :class:`CompiledModel`, which :mod:`tscomp.runtime.artifact` writes to
disk and the :class:`~tscomp.runtime.Runtime` executes.

Until the tuner lands (``schedule/``), variants come from the hardware-aligned heuristic of
:mod:`tscomp.codegen.tile_config`; the manifest says so.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from tscomp.codegen.build import host_isa, set_num_threads
from tscomp.codegen.families import kernels_for_group
from tscomp.graph import DimSpec, load_model
from tscomp.graph.fusion import fuse
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.reference import materialize

Progress = Callable[[int, int, str], None]


@dataclass
class CompiledModel:
    """Everything the runtime needs: the Plan and, per group (same order), its kernel variants."""
    plan: Plan
    kernels: dict[str, list]                  # group name -> kernel variants (>= 1)
    isa: str
    threads: int                              # thread count the single-wave times were measured with
    source_model: str = ""
    dims: list[str] = field(default_factory=list)   # the --dim specs it was compiled with
    config_source: str = "heuristic (tile_config.candidate_configs; no tuner yet)"
    compile_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def fallback_groups(self) -> list[str]:
        return [g for g, ks in self.kernels.items() if getattr(ks[0], "target", "cpu") == "numpy"]


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def compile_model(model_path: str, dims: Sequence[DimSpec | str] = (), *, max_variants: int = 3,
                  threads: int | None = None, progress: Progress | None = None) -> CompiledModel:
    t0 = time.perf_counter()
    graph = load_model(model_path, dims)
    plan = fuse(graph)
    model = compile_plan(plan, max_variants=max_variants, threads=threads, progress=progress,
                         source_model=str(model_path), t0=t0)
    model.dims = [d.text if isinstance(d, DimSpec) else str(d) for d in dims]
    return model


def compile_plan(plan: Plan, *, max_variants: int = 3, threads: int | None = None,
                 progress: Progress | None = None, source_model: str = "", t0: float | None = None) -> CompiledModel:
    t0 = time.perf_counter() if t0 is None else t0
    isa = host_isa()
    threads = threads or default_threads()
    set_num_threads(threads)
    kernels: dict[str, list] = {}
    total = len(plan.groups)
    for k, group in enumerate(plan.groups):
        if progress:
            progress(k, total, group.name)
        variants = kernels_for_group(plan, group, isa=isa, max_variants=max_variants)
        if len(variants) > 1:
            for v in variants:
                measure_single_wave(plan, group, v, threads)
        kernels[group.name] = variants
    if progress:
        progress(total, total, "done")
    return CompiledModel(plan, kernels, isa, threads, source_model=source_model,
                         compile_seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------- single-wave times
def probe_binding(plan: Plan, kernel, threads: int) -> dict[str, int]:
    """The smallest binding (symbols from their minimum, the group's largest symbol grown by
    doubling) at which ``kernel`` runs at least one full wave of ``threads`` tasks."""
    symtab = plan.graph.symbols
    live = {i.name: i for i in symtab.live_symbols()}
    binding = {name: max(1, info.min) for name, info in live.items()}
    grow = sorted(live, key=lambda n: -min(live[n].max, 1 << 20))
    for name in grow:
        hi = live[name].max
        while kernel.tasks(binding) < threads and binding[name] < hi:
            binding[name] = min(hi, binding[name] * 2)
        if kernel.tasks(binding) >= threads:
            break
    return binding


def group_inputs_at(plan: Plan, group: Group, binding: dict[str, int], rng: np.random.Generator) -> dict:
    """Inputs for running ``group`` alone: constants as they are, other tensors random of their
    shape at ``binding`` (index tensors zero, so every gather stays in bounds)."""
    graph = plan.graph
    env = {}
    for name in group.inputs:
        v = graph.values[name]
        if v.const is not None or v.symdata is not None:
            env[name] = materialize(graph, v, binding)
            continue
        shape = tuple(int(graph.symbols.evaluate(d, binding)) for d in v.shape)
        dt = np.dtype(v.dtype)
        env[name] = (rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt))
    return env


def measure_single_wave(plan: Plan, group: Group, kernel, threads: int, *, repeats: int = 5) -> None:
    """Set ``kernel.t_wave`` (seconds per wave of ``threads`` tasks) and ``kernel.probe``."""
    binding = probe_binding(plan, kernel, threads)
    env = group_inputs_at(plan, group, binding, np.random.default_rng(0))
    kernel.run(env, binding)                       # warm caches, page in the weights
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        kernel.run(env, binding)
        best = min(best, time.perf_counter() - t)
    waves = max(1, math.ceil(kernel.tasks(binding) / threads))
    kernel.t_wave = best / waves
    kernel.probe = dict(binding)


__all__ = ["CompiledModel", "compile_model", "compile_plan", "default_threads", "measure_single_wave"]
