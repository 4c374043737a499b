"""Variant dispatch decided before the first request (issue 10; DietCode §4.2 exports its
dispatcher as a decision tree): the wave model's choice (:mod:`tscomp.runtime.wave`) evaluated
once, at load, for *every* binding of the symbol ranges, into a table the request path indexes.
A never-seen shape then costs the same lookup as a seen one.

The wave model's cost of a variant (the makespan of its task classes, :func:`~tscomp.runtime.wave.makespan`)
is vectorized over the grid of all bindings: the family's task classes
(:data:`~tscomp.runtime.wave.CLASSES`: counts and padded work per task) evaluated with numpy, the
per-task time the same linear interpolation between the compile-time samples. Families without
classes count :data:`TASKS` tasks alike in the shape size. The table is built at load rather than
at compile time because blocks per wave depend on the thread count the runtime is given. A group
whose family has neither, or a model whose grid is larger than :data:`MAX_GRID` bindings, keeps
the per-shape wave model (:func:`~tscomp.runtime.wave.pick_variant`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import sympy

from tscomp.runtime.wave import CLASSES, cost_of
from tscomp.schedule.target import Target

#: largest number of bindings a table covers (one byte per binding and group)
MAX_GRID = 1 << 20


def _one(k, ev):
    return 1


#: family -> tasks(kernel, ev) for families without task classes (one task whatever the shape);
#: the families of :data:`~tscomp.runtime.wave.CLASSES` count theirs there
TASKS = {"row-or-elementwise": _one, "numpy": _one}


@dataclass
class DispatchTable:
    symbols: tuple[str, ...]
    mins: tuple[int, ...]
    choice: np.ndarray            # uint8, one axis per symbol: index of the variant to run

    def pick(self, binding) -> int:
        return int(self.choice[tuple(binding[s] - m for s, m in zip(self.symbols, self.mins))])


def _grid(infos) -> dict[str, np.ndarray] | None:
    extents = [i.max - i.min + 1 for i in infos]
    if not infos or math.prod(extents) > MAX_GRID:
        return None
    axes = np.meshgrid(*[np.arange(i.min, i.max + 1, dtype=np.int64) for i in infos], indexing="ij")
    return {i.name: a for i, a in zip(infos, axes)}


def _evaluator(symtab, grid: dict[str, np.ndarray]):
    cache: dict = {}

    def ev(expr):
        expr = symtab.canon(sympy.sympify(expr))
        got = cache.get(expr)
        if got is None:
            syms = sorted(expr.free_symbols, key=lambda s: s.name)
            if any(s.name not in grid for s in syms):
                raise KeyError(f"{expr}: a symbol outside the grid")
            fn = sympy.lambdify(syms, expr, modules="numpy")
            val = np.asarray(fn(*[grid[s.name] for s in syms]))
            got = cache[expr] = np.broadcast_to(np.rint(val).astype(np.int64), next(iter(grid.values())).shape)
        return got
    return ev


def _costs(kernel, ev, size: np.ndarray, target: Target) -> np.ndarray:
    per_wave = max(1, target.blocks_per_wave(kernel.resources()))
    fn = CLASSES.get(kernel.family)
    classes = fn(kernel, ev) if fn else [(np.asarray(TASKS[kernel.family](kernel, ev)), size)]
    return np.broadcast_to(cost_of(kernel, classes, per_wave), size.shape)


def build_tables(kernels: dict[str, list], symtab, target: Target) -> dict[str, DispatchTable]:
    """Group name -> its table, for every group with more than one variant that can have one."""
    infos = symtab.live_symbols()
    grid = _grid(infos)
    if grid is None:
        return {}
    size = np.ones(next(iter(grid.values())).shape, dtype=np.float64)
    for a in grid.values():
        size = size * a
    ev = _evaluator(symtab, grid)
    tables = {}
    for name, variants in kernels.items():
        if len(variants) < 2 or len(variants) > 255 \
                or any(k.family not in TASKS and k.family not in CLASSES for k in variants):
            continue
        try:
            costs = np.stack([_costs(k, ev, size, target) for k in variants])
        except (KeyError, TypeError, ValueError, AttributeError):
            continue                      # the per-shape wave model decides for this group
        tables[name] = DispatchTable(tuple(i.name for i in infos), tuple(i.min for i in infos),
                                     np.argmin(costs, axis=0).astype(np.uint8))   # ties: the first variant
    return tables


__all__ = ["DispatchTable", "MAX_GRID", "TASKS", "build_tables"]
