"""The sample shapes at which kernels are measured, and the inputs for measuring a group alone.

DietCode §4.2 makes the tuning objective *shape-generic*: a configuration is judged over a few
samples of the dynamic axis, not at one static shape, and the runtime's cost model interpolates
between those same samples (TSCompiler §6: T_single_wave measured offline). The samples are the
widest-ranged symbol at :data:`SAMPLE_POINTS` (the tuner's objective) or :data:`DISPATCH_POINTS` (the
wave model's samples) and its maximum, every other symbol moved along in proportion (the same
fraction of its own range, rounded), so the last sample is the top of every range. Holding the
others at their minimum instead measured a ViT (height and width both 32:384) at 5-49 tokens only,
where it serves up to 577: the tuner ranked configurations, and the wave model extrapolated,
far from the shapes that dominate its time.

The samples are capped by a memory budget, never by the declared maximum alone: a range such as
``batch=1:1000000`` would otherwise make the compiler allocate inputs for a million-row batch. A
sample whose tensors would exceed the budget is dropped with a warning naming the symbol and the
largest value that was sampled.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.reference import materialize
from tscomp.schedule.target import host_memory

#: values the widest dynamic symbol takes when kernels are measured for the tuner's objective
#: (clipped to its range). 8 and 12 sit between the register-tile steps of a short M: without them
#: no kept variant fitted M = 9..21 (a 6-row tile computed 12 rows at M = 9), and BERT-base lost
#: 1.14x to OpenVINO there; with them, 1.03x
SAMPLE_POINTS = (1, 4, 8, 12, 16, 64, 128, 256)

#: the fewest distinct values the widest symbol is measured at for the tuner's objective. A range
#: that few of :data:`SAMPLE_POINTS` fall into (an image side of 64:256 has 64, 128 and 256 only) is
#: sampled at this many geometrically spaced values instead: with three samples, two of them small
#: images, ResNet-50's 14x14 layers (16-256 positions over the range) were tuned for 16 and 64
#: positions and kept one tile, 1.14x onnxruntime's time at 224 px where a tile tuned nearer it took
#: 1.04x
MIN_SAMPLES = 5

#: the denser values the runtime's wave model is measured at (:func:`tscomp.compiler.measure_variants`):
#: every size up to 16 -- a GEMM runs its last row panel with a micro-kernel of that panel's own
#: height, whose cost is not proportional to its rows (a 1-row tail re-streams the whole weight
#: panel for one row: at M = 9 an 8-row tile measured 1.33x its M = 8 time where interpolating
#: between 8 and 12 predicted 1.12x), so each small task size gets a sample of its own -- then
#: sizes between the powers of two, where tiles are partly filled
DISPATCH_POINTS = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 256, 320, 384, 448, 512)


def memory_budget() -> int:
    """Bytes the live tensors of one sample shape may take: 1 GiB, or 1/8 of physical memory if
    that is less."""
    return int(min(1 << 30, host_memory() // 8))


def shape_size(binding: dict[str, int]) -> int:
    """One number that grows with the work of a shape: the product of its symbol values."""
    return math.prod(int(v) for v in binding.values()) if binding else 1


def footprint(plan: Plan, binding: dict[str, int]) -> int:
    """Bytes of the largest group's non-constant inputs and outputs at ``binding``."""
    graph = plan.graph
    best = 0
    for g in plan.groups:
        total = 0
        for name in (*g.inputs, *g.outputs):
            v = graph.values[name]
            if v.const is not None:
                continue
            n = math.prod(int(graph.symbols.evaluate(d, binding)) for d in v.shape)
            total += n * np.dtype(v.dtype).itemsize
        best = max(best, total)
    return best


def sample_bindings(plan: Plan, *, budget: int | None = None,
                    points: tuple[int, ...] = SAMPLE_POINTS) -> list[dict[str, int]]:
    """Shapes at which kernels are timed: the widest symbol at ``points`` (see the module docstring)."""
    live = plan.graph.symbols.live_symbols()
    if not live:
        return [{}]
    grow = max(live, key=lambda i: (i.max - i.min, i.name))
    values = sorted({v for v in (*points, grow.max) if grow.min <= v <= grow.max} | {max(1, grow.min)})
    if points is SAMPLE_POINTS and len(values) < MIN_SAMPLES:
        values = geometric_values(max(1, grow.min), grow.max, MIN_SAMPLES)
    budget = memory_budget() if budget is None else budget
    kept = []
    for binding in _lawful_bindings(plan.graph.symbols, live, grow, values):
        if kept and footprint(plan, binding) > budget:
            warnings.warn(f"measuring kernels at {grow.name}={binding[grow.name]} needs more than the {budget >> 20} MiB sample "
                          f"budget: timing stops at {grow.name}={kept[-1][grow.name]} (declared up to {grow.max}); "
                          f"larger shapes are dispatched by extrapolation", RuntimeWarning, stacklevel=2)
            break
        kept.append(binding)
    return kept


def _lawful_bindings(symtab, live, grow, values) -> list[dict[str, int]]:
    """The binding at each value, moved to the nearest value (within a quarter of it) where the
    model's recorded relations hold -- a Reshape into 4x4 patches needs image sides that are
    multiples of 4, and a kernel timed at a shape the model refuses measures nothing; values with
    no lawful neighbour are dropped, unless none has one (then the bindings as they are)."""
    checks = symtab.decidable_relations({i.name for i in live})
    if not checks:
        return [_along(live, grow, v) for v in values]
    out: list[dict[str, int]] = []
    for v in values:
        lawful = (b for b in map(lambda u: _along(live, grow, u), _outward(v, grow.min, grow.max, max(4, v // 4)))
                  if all(symtab.relation_at(c, b)[0] for c in checks))
        binding = next(lawful, None)
        if binding is not None and binding not in out:
            out.append(binding)
    return out or [_along(live, grow, v) for v in values]


def _outward(v: int, lo: int, hi: int, reach: int):
    """v, v - 1, v + 1, v - 2, ... within [lo, hi] and ``reach`` of v."""
    for d in range(reach + 1):
        for u in ((v,) if d == 0 else (v - d, v + d)):
            if lo <= u <= hi:
                yield u


def geometric_values(lo: int, hi: int, count: int) -> list[int]:
    """Up to ``count`` distinct integers from ``lo`` to ``hi`` (both included), evenly spaced in log
    scale (the work of most kernels grows with a power of the size, so equal ratios, not equal steps,
    spread the samples over the costs)."""
    if hi <= lo:
        return [lo]
    return sorted({round(lo * (hi / lo) ** (j / (count - 1))) for j in range(count)})


def _along(live, grow, v: int) -> dict[str, int]:
    """The binding with ``grow`` at ``v`` and every other symbol the same fraction into its range."""
    frac = (v - grow.min) / (grow.max - grow.min) if grow.max > grow.min else 0.0
    return {i.name: v if i.name == grow.name else max(1, i.min + round(frac * (i.max - i.min))) for i in live}


def group_inputs_at(plan: Plan, group: Group, binding: dict[str, int], rng: np.random.Generator) -> dict:
    """Inputs for running ``group`` alone: constants as they are, other tensors random of their
    shape at ``binding`` (index tensors zero, so every gather stays in bounds)."""
    graph = plan.graph
    produced = set(plan.crossing_values()) | set(graph.inputs)
    env = {}
    for name in group.inputs:
        v = graph.values[name]
        if not v.known_at_compile_time and name not in produced:
            continue  # a weight stripped from a loaded plan: its kernels hold it prepacked
        if v.known_at_compile_time:
            env[name] = materialize(graph, v, binding)
            continue
        shape = tuple(int(graph.symbols.evaluate(d, binding)) for d in v.shape)
        dt = np.dtype(v.dtype)
        env[name] = (rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt))
    return env


__all__ = ["SAMPLE_POINTS", "footprint", "group_inputs_at", "memory_budget", "sample_bindings", "shape_size"]
