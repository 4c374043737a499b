"""``tscomp compile``: ONNX model → compiled model (TSCompiler Fig. 2, offline half).

The stages run in order and talk through their output objects only: the graph stage gives a
:class:`~tscomp.graph.fusion.plan.Plan`; each fused group gets its macro-kernel variants from the
family table (:mod:`tscomp.codegen.families`); a group with several variants gets each timed at
a few sample shapes (TSCompiler §6: T_single_wave, the quantity the runtime's wave model scales,
measured at several occupancies, since a CPU task's time depends on how full its tiles are); the result is a :class:`CompiledModel`, which :mod:`tscomp.runtime.artifact` writes to
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
from tscomp.codegen.families import DEFAULT_VARIANTS, kernels_for_group
from tscomp.graph import DimSpec, load_model, require_resolved_shapes
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


def compile_model(model_path: str, dims: Sequence[DimSpec | str] = (), *, max_variants: int = DEFAULT_VARIANTS,
                  threads: int | None = None, progress: Progress | None = None) -> CompiledModel:
    t0 = time.perf_counter()
    graph = load_model(model_path, dims)
    require_resolved_shapes(graph)
    plan = fuse(graph)
    model = compile_plan(plan, max_variants=max_variants, threads=threads, progress=progress,
                         source_model=str(model_path), t0=t0)
    model.dims = [d.text if isinstance(d, DimSpec) else str(d) for d in dims]
    return model


def compile_plan(plan: Plan, *, max_variants: int = DEFAULT_VARIANTS, threads: int | None = None,
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
            measure_variants(plan, group, variants, threads)
        kernels[group.name] = variants
    if progress:
        progress(total, total, "done")
    return CompiledModel(plan, kernels, isa, threads, source_model=source_model,
                         compile_seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------- single-wave times
#: values the largest dynamic dimension takes when variants are measured (clipped to its range)
SAMPLE_POINTS = (1, 16, 64, 128, 256)


def sample_bindings(plan: Plan) -> list[dict[str, int]]:
    """Shapes at which kernel variants are timed: the widest-ranged symbol at :data:`SAMPLE_POINTS`
    and its maximum, every other symbol at its minimum (DietCode §4.2 likewise samples the dynamic
    axis and fits the cost model's free term)."""
    live = plan.graph.symbols.live_symbols()
    if not live:
        return [{}]
    grow = max(live, key=lambda i: (i.max - i.min, i.name))
    base = {i.name: max(1, i.min) for i in live}
    values = sorted({v for v in (*SAMPLE_POINTS, grow.max) if grow.min <= v <= grow.max} | {max(1, grow.min)})
    return [{**base, grow.name: v} for v in values]


def shape_size(binding: dict[str, int]) -> int:
    """One number that grows with the work of a shape: the product of its symbol values."""
    return math.prod(int(v) for v in binding.values()) if binding else 1


def group_inputs_at(plan: Plan, group: Group, binding: dict[str, int], rng: np.random.Generator) -> dict:
    """Inputs for running ``group`` alone: constants as they are, other tensors random of their
    shape at ``binding`` (index tensors zero, so every gather stays in bounds)."""
    graph = plan.graph
    produced = set(plan.crossing_values()) | set(graph.inputs)
    env = {}
    for name in group.inputs:
        v = graph.values[name]
        if v.const is None and v.symdata is None and name not in produced:
            continue  # a weight stripped from a loaded plan: its kernels hold it prepacked
        if v.const is not None or v.symdata is not None:
            env[name] = materialize(graph, v, binding)
            continue
        shape = tuple(int(graph.symbols.evaluate(d, binding)) for d in v.shape)
        dt = np.dtype(v.dtype)
        env[name] = (rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt))
    return env


def measure_variants(plan: Plan, group: Group, kernels: list, threads: int, *, repeats: int = 3) -> None:
    """Time every variant at the :func:`sample_bindings` shapes: ``kernel.samples`` holds
    ``(size, tasks, seconds)`` per shape, size being the product of the symbol values (what the
    runtime's wave model interpolates in), ``kernel.t_wave`` the single-wave time at the largest
    sample (for the manifest)."""
    rng = np.random.default_rng(0)
    for k in kernels:
        k.samples = []
    for binding in sample_bindings(plan):
        env = group_inputs_at(plan, group, binding, rng)
        for k in kernels:
            k.run(env, binding)                    # warm: page in the weights, fill the caches
            best = math.inf
            for _ in range(repeats):
                t = time.perf_counter()
                k.run(env, binding)
                best = min(best, time.perf_counter() - t)
            k.samples.append((shape_size(binding), int(k.tasks(binding)), best))
    for k in kernels:
        _, tasks, seconds = k.samples[-1]
        k.t_wave = seconds / max(1, math.ceil(tasks / threads))
        k.probe = sample_bindings(plan)[-1]


__all__ = ["CompiledModel", "compile_model", "compile_plan", "default_threads", "measure_variants", "sample_bindings", "shape_size"]
