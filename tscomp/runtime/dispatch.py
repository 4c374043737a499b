"""Variant dispatch decided before the first request (issue 10; DietCode §4.2 exports its
dispatcher as a decision tree): the wave model's choice (:mod:`tscomp.runtime.wave`) evaluated
once, at load, for every value a group's shape can take, into a table the request path indexes.
A never-seen shape then costs the same lookup as a seen one.

A group's choice depends on its shape only through a few extents -- a GEMM's M, a batched GEMM's
batch count, M, N and K: the expressions its family's task classes
(:data:`~tscomp.runtime.wave.CLASSES`) evaluate. Those expressions are the group's *dispatch key*
(:func:`dispatch_key`, found by running the classes on a recording evaluator), and the table is
indexed by the key's values over their ranges (interval bounds from the symbol ranges), not by the
model's symbols: ViT's QKV GEMM has one axis of at most 6,280 token counts, where its symbols
(batch, height, width) span 1.5 million bindings. The key is a pure function of the kernels, so
the host program (:mod:`tscomp.runtime.host_program`) computes it in C at compile time; the table
is made at load because blocks per wave depend on the thread count the runtime is given. The
cost of every variant is the makespan of its task classes (:func:`~tscomp.runtime.wave.cost_of`),
vectorized over the key grid. A group without classes (a kernel compiled before its family had
them, :data:`~tscomp.runtime.wave.CLASSES_SINCE`), or whose key grid exceeds :data:`MAX_GRID`, is
picked per binding by the wave model (the runtime memoizes those picks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import sympy

from tscomp.graph.symbols import compile_int_expr
from tscomp.runtime.wave import classes_fn, cost_of
from tscomp.schedule.target import Target

#: largest number of key values a table covers (one byte each)
MAX_GRID = 1 << 20


@dataclass(frozen=True)
class DispatchKey:
    """The extents a group's choice depends on, each with its value range [min, min + extent)."""
    exprs: tuple[sympy.Expr, ...]
    mins: tuple[int, ...]
    extents: tuple[int, ...]

    @property
    def cells(self) -> int:
        return math.prod(self.extents)

    def strides(self) -> tuple[int, ...]:
        """Row-major strides of the table over the key axes."""
        out, acc = [], 1
        for e in reversed(self.extents):
            out.append(acc)
            acc *= e
        return tuple(reversed(out))


@dataclass
class DispatchTable:
    key: DispatchKey
    choice: np.ndarray            # uint8, C order over the key axes: the variant to run
    _fns: tuple | None = None

    def pick(self, binding) -> int:
        if self._fns is None:
            self._fns = tuple(compile_int_expr(e) for e in self.key.exprs)
        index = 0
        for f, lo, n, stride in zip(self._fns, self.key.mins, self.key.extents, self.key.strides()):
            index += min(max(int(f(binding)) - lo, 0), n - 1) * stride
        return int(self.choice.reshape(-1)[index])


def dispatch_key(variants: list, symtab) -> DispatchKey | None:
    """The expressions the wave model reads to cost ``variants`` (None: no table can be made --
    one variant, a family without task classes, an unbounded extent or too many cells)."""
    if len(variants) < 2 or len(variants) > 255 or any(classes_fn(k) is None for k in variants):
        return None
    seen: dict[sympy.Expr, None] = {}

    def record(expr):
        seen.setdefault(symtab.canon(sympy.sympify(expr)), None)
        return np.ones(1, np.int64)

    try:
        for k in variants:
            classes_fn(k)(k, record, 2)       # any thread count: only which sizes are read matters
    except (TypeError, ValueError, AttributeError):
        return None
    exprs = sorted((e for e in seen if not e.is_Integer), key=sympy.default_sort_key)
    mins, extents = [], []
    for e in exprs:
        lo, hi = symtab.bounds(e)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        lo, hi = max(0, math.floor(lo)), math.ceil(hi)
        mins.append(lo)
        extents.append(hi - lo + 1)
    key = DispatchKey(tuple(exprs), tuple(mins), tuple(extents))
    return key if key.cells <= MAX_GRID else None


def _costs(kernel, key: DispatchKey, target: Target, symtab) -> np.ndarray:
    axes = np.meshgrid(*[np.arange(lo, lo + n, dtype=np.int64) for lo, n in zip(key.mins, key.extents)],
                       indexing="ij") if key.exprs else []
    grid = dict(zip(key.exprs, axes))
    shape = tuple(key.extents)

    def ev(expr):
        e = symtab.canon(sympy.sympify(expr))
        if e.is_Integer:
            return np.full(shape, int(e), np.int64)
        return grid[e]

    per_wave = max(1, target.blocks_per_wave(kernel.resources()))
    return np.broadcast_to(cost_of(kernel, classes_fn(kernel)(kernel, ev, target.threads), per_wave), shape)


def build_tables(kernels: dict[str, list], symtab, target: Target) -> dict[str, DispatchTable]:
    """Group name -> its table, for every group with more than one variant that can have one."""
    tables = {}
    for name, variants in kernels.items():
        key = dispatch_key(variants, symtab)
        if key is None:
            continue
        try:
            costs = np.stack([_costs(k, key, target, symtab) for k in variants])
        except (KeyError, TypeError, ValueError, AttributeError):
            continue                      # the per-shape wave model decides for this group
        tables[name] = DispatchTable(key, np.ascontiguousarray(np.argmin(costs, axis=0).astype(np.uint8)))
    return tables


__all__ = ["DispatchKey", "DispatchTable", "MAX_GRID", "build_tables", "dispatch_key"]
