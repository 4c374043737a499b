"""Variant dispatch decided before the first request (issue 10; DietCode §4.2 exports its
dispatcher as a decision tree): the wave model's choice (:mod:`tscomp.runtime.wave`) evaluated
once, at load, for *every* binding of the symbol ranges, into a table the request path indexes.
A never-seen shape then costs the same lookup as a seen one.

The wave model's cost of a variant is ``T_wave(x) x ceil(tasks(binding) / blocks_per_wave)``.
Both factors are vectorized over the grid of all bindings: the per-wave time is the same linear
interpolation between the compile-time samples (``numpy.interp`` over the wave model's coordinate
``x``, :data:`~tscomp.runtime.wave.WORK` evaluated on the grid, or the shape size), and ``tasks`` comes from the
family's tile-task expression (:data:`TASKS`: which sizes the family's ``tasks()`` divides by its
tile extents) evaluated with numpy. The table is built at load rather than at compile time because
blocks per wave depend on the thread count the runtime is given. A group whose family has no
entry in :data:`TASKS`, or a model whose grid is larger than :data:`MAX_GRID` bindings, keeps the
per-shape wave model (:func:`~tscomp.runtime.wave.pick_variant`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import sympy

from tscomp.runtime.wave import WORK, uses_work_axis, wave_points
from tscomp.schedule.target import Target

#: largest number of bindings a table covers (one byte per binding and group)
MAX_GRID = 1 << 20


def _ceil_div(a, b: int):
    return -(-a // int(b))


def _gemm_tasks(k, ev):
    return _ceil_div(ev(k.M), k.cfg.mc) * k.geometry.n_nblocks


def _batched_tasks(k, ev):
    return ev(k.NB) * _ceil_div(ev(k.M), k.cfg.mc) * _ceil_div(ev(k.N), k.cfg.nc)


def _one(k, ev):
    return 1


#: family -> tasks(kernel, ev) with ev evaluating a symbolic size over the whole grid (the same
#: arithmetic as the family's Kernel.tasks(binding))
TASKS = {"gemm": _gemm_tasks, "batched-gemm": _batched_tasks, "row-or-elementwise": _one, "numpy": _one}


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
    waves = _ceil_div(np.asarray(TASKS[kernel.family](kernel, ev), dtype=np.int64), per_wave)
    if kernel.samples:
        xs, ys = wave_points(kernel, per_wave)
        x = np.asarray(WORK[kernel.family](kernel, ev)) if uses_work_axis(kernel) else size
        return np.interp(x, xs, ys) * waves
    if kernel.t_wave is None:
        return np.full(size.shape, np.inf)
    return kernel.t_wave * waves


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
        if len(variants) < 2 or len(variants) > 255 or any(k.family not in TASKS for k in variants):
            continue
        try:
            costs = np.stack([_costs(k, ev, size, target) for k in variants])
        except (KeyError, TypeError, ValueError, AttributeError):
            continue                      # the per-shape wave model decides for this group
        tables[name] = DispatchTable(tuple(i.name for i in infos), tuple(i.min for i in infos),
                                     np.argmin(costs, axis=0).astype(np.uint8))   # ties: the first variant
    return tables


__all__ = ["DispatchTable", "MAX_GRID", "TASKS", "build_tables"]
