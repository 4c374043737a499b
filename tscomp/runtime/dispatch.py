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
vectorized over the key grid. Where the key's values exceed :data:`MAX_GRID` cells (a 32..1024
image with batches up to 8: 8 x 497 x 497 output positions for a first Conv), the longest axes
cover 2, 4, ... values per cell, each cell decided at its least value: the choice is then the
wave model's at a neighbouring size, and the request still never leaves C. A group without
classes (a kernel compiled before its family had them, :data:`~tscomp.runtime.wave.CLASSES_SINCE`)
is picked per binding by the wave model (the runtime memoizes those picks).

**One packed copy per weight while the model lives in the caches.** Variants of a GEMM (or Conv)
group whose register tiles differ in width read different packed copies of the one weight. The
wave model costs each variant with its weight warm, but a switch between copies is not free: the
copy the last requests did not use has left the cores' private caches, so the call re-reads it
from farther away (tiny BERT, 2 threads: a length served by the other FFN copy after three calls
at L = 64 took ~1.5 us more per GEMM, the first call at L = 1..9 1.3x its steady time instead of
1.1x) and both copies compete for the cache. So where every group's *home* copy fits in the last
level cache together (:func:`_resident`), a variant reading another copy pays a surcharge: its own
time at the smallest shape of the group's range, which is its weight streamed once with all but no
arithmetic. A group's home copy is the one whose variants cost least summed over the key grid.
Models larger than the cache stream every copy from memory anyway and are costed as before. For
the same reason the compiler keeps a second copy of a resident model's weight only for a larger
predicted gain (:data:`COPY_WORTH_RESIDENT` against :data:`COPY_WORTH`,
:func:`drop_unworthy_copies`).

**One variant per group unless another is clearly faster.** Each variant is its own machine code
(a macro-kernel and its micro-kernels, ~10 KB), so a request served by a variant the previous ones
did not run fetches that code cold: tiny BERT's attention output projection, whose two variants
differ only in T_Mb and do the same work below 96 rows, alternated between them along L = 1..5 on
the wave model's noise (a row tail's cost comes from one sample: the variants differed by up to
12% there), and the first call at L = 2 after L = 64 spent ~9 us more in it than the next calls.
So the group's *home variant* (the cheapest summed over the key grid, among those reading the home
copy) serves every cell where no other variant is predicted faster by more than
:data:`SWITCH_MARGIN` of its cost (plus :data:`SWITCH_SECONDS`, 0 for now): within the model's
resolution the same code keeps running. BERT-base's table switched variants 1,236 times along
L = 1..512 before, 96 after, at +0.27% predicted cost (geomean).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import sympy

from tscomp.graph.symbols import compile_int_expr
from tscomp.runtime.packing import copy_key
from tscomp.runtime.wave import classes_fn, cost_of
from tscomp.schedule.target import Target

#: largest number of cells a table has (one byte each)
MAX_GRID = 1 << 20

#: how much faster (fraction of its cost) another variant must be predicted than the home one to
#: be picked: the wave model's resolution at one shape (its robust fit treats residuals past 5% as
#: noise, :data:`~tscomp.runtime.wave.NOISE_SCALE`)
SWITCH_MARGIN = 0.05

#: seconds a switch away from the home variant must win besides (its code fetched cold: ~9 us on
#: tiny BERT's output projection at L = 2 after L = 64, AMD Zen 4). 0: the wave model's absolute
#: times at the smallest shapes are several times the in-call ones, so 5 us there kept variants
#: measurably slower (a tiny ELECTRA 1.18x at L = 1..7); only the relative margin applies
SWITCH_SECONDS = 0.0


@dataclass(frozen=True)
class DispatchKey:
    """The extents a group's choice depends on: per axis an expression, its least value, and the
    table's cells along it (``extents``), each covering ``steps`` consecutive values (1: one cell
    per value; more where the whole range would exceed :data:`MAX_GRID` cells)."""
    exprs: tuple[sympy.Expr, ...]
    mins: tuple[int, ...]
    extents: tuple[int, ...]
    steps: tuple[int, ...]

    @property
    def cells(self) -> int:
        return math.prod(self.extents)

    def cell_values(self) -> list[np.ndarray]:
        """Per axis, the value each cell is decided at: the least of the values it covers."""
        return [lo + step * np.arange(n, dtype=np.int64) for lo, n, step in zip(self.mins, self.extents, self.steps)]

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
    surcharge: tuple[float, ...] = ()   # per variant, seconds added to its wave-model cost
    margin: tuple[float, ...] = ()      # per variant, fraction of its cost added (0 for the home variant)
    _fns: tuple | None = None

    def pick(self, binding) -> int:
        if self._fns is None:
            self._fns = tuple(compile_int_expr(e) for e in self.key.exprs)
        index = 0
        for f, lo, n, step, stride in zip(self._fns, self.key.mins, self.key.extents, self.key.steps, self.key.strides()):
            index += min(max(int(f(binding)) - lo, 0) // step, n - 1) * stride
        return int(self.choice.reshape(-1)[index])


def dispatch_key(variants: list, symtab) -> DispatchKey | None:
    """The expressions the wave model reads to cost ``variants`` (None: no table can be made --
    one variant, a family without task classes, an unbounded extent)."""
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
    exprs = _table_axes([e for e in seen if not e.is_Integer])
    mins, extents = [], []
    for e in exprs:
        lo, hi = symtab.bounds(e)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        lo, hi = max(0, math.floor(lo)), math.ceil(hi)
        mins.append(lo)
        extents.append(hi - lo + 1)
    return DispatchKey(tuple(exprs), tuple(mins), *_cells_within(extents, MAX_GRID))


def _cells_within(values: list[int], limit: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(cells per axis, values per cell) covering ``values`` values per axis in at most ``limit``
    cells: one cell per value where they fit, else the axis with the most cells covers twice as
    many values per cell, again until they fit (the short axes, a batch, keep a cell per value)."""
    steps = [1] * len(values)
    cells = list(values)
    while math.prod(cells) > limit:
        a = max(range(len(cells)), key=lambda i: cells[i])
        steps[a] *= 2
        cells[a] = -(-values[a] // steps[a])
    return tuple(cells), tuple(steps)


def _table_axes(exprs: list) -> tuple:
    """The expressions a table is indexed by: those of ``exprs`` that are not integer polynomials
    of the others. A Conv's task classes read its output rows, columns and their product; the
    product is computed from the other two per cell, not made an axis of its own (ResNet-50's
    3x3 Convs: 8 x 105 x 105 cells instead of 8 x 12,481 x 105 x 105)."""
    axes: list = []
    for e in sorted(exprs, key=lambda e: (sympy.count_ops(e), sympy.default_sort_key(e))):
        if _over_axes(e, axes) is None:
            axes.append(e)
    return tuple(sorted(axes, key=sympy.default_sort_key))


def _over_axes(expr, axes) -> tuple[tuple, sympy.Expr] | None:
    """(dummies standing for ``axes``, ``expr`` as an integer polynomial of them), or None when
    ``expr`` is not one (it reads a symbol outside the axes, divides or rounds them)."""
    if not axes:
        return None
    dummies = tuple(sympy.Dummy(f"a{i}") for i in range(len(axes)))
    form = sympy.sympify(expr).xreplace(dict(zip(axes, dummies)))
    if not form.free_symbols <= set(dummies) or not form.is_polynomial(*dummies):
        return None
    if not all(c.is_Integer for c in sympy.Poly(form, *dummies).coeffs()):
        return None
    return dummies, form


@functools.lru_cache(maxsize=256)
def _over_axes_fn(expr, axes: tuple):
    """``expr``, an integer polynomial of ``axes``, as a numpy function of their values (int64
    arithmetic per cell); made once per key, not once per variant costed over it."""
    dummies, form = _over_axes(expr, axes)
    return sympy.lambdify(dummies, form, "numpy")


def _costs(kernel, key: DispatchKey, target: Target, symtab) -> np.ndarray:
    axes = np.meshgrid(*key.cell_values(), indexing="ij") if key.exprs else []
    grid = dict(zip(key.exprs, axes))
    shape = tuple(key.extents)

    def ev(expr):
        e = symtab.canon(sympy.sympify(expr))
        if e.is_Integer:
            return np.full(shape, int(e), np.int64)
        if e in grid:
            return grid[e]
        return np.broadcast_to(_over_axes_fn(e, key.exprs)(*axes), shape).astype(np.int64)

    per_wave = max(1, target.blocks_per_wave(kernel.resources()))
    return np.broadcast_to(cost_of(kernel, classes_fn(kernel)(kernel, ev, target.threads), per_wave), shape)


def _cost_grid(variants: list, symtab, target: Target) -> tuple[DispatchKey, np.ndarray] | None:
    """(the group's key, its variants' wave-model costs [variant, key cell]); None where no table
    can be made (the per-shape wave model decides for such a group)."""
    key = dispatch_key(variants, symtab)
    if key is None:
        return None
    try:
        return key, np.stack([_costs(k, key, target, symtab) for k in variants]).reshape(len(variants), -1)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def build_tables(kernels: dict[str, list], symtab, target: Target) -> dict[str, DispatchTable]:
    """Group name -> its table, for every group with more than one variant that can have one."""
    costed = {}
    for name, variants in kernels.items():
        grid = _cost_grid(variants, symtab, target)
        if grid is not None:
            costed[name] = grid
    homes = {name: _home_copy(kernels[name], costs) for name, (_, costs) in costed.items()}
    resident = _resident(kernels, homes, target)
    tables = {}
    for name, (key, costs) in costed.items():
        copy_charge = (_surcharges(kernels[name], costs, homes[name]) if resident
                       else np.zeros(len(kernels[name])))
        surcharge, margin = switch_charges(costs, _home_variant(kernels[name], costs, homes[name]), copy_charge)
        choice = charged_choice(costs, surcharge, margin).astype(np.uint8).reshape(key.extents)
        tables[name] = DispatchTable(key, np.ascontiguousarray(choice), tuple(float(x) for x in surcharge),
                                     tuple(float(x) for x in margin))
    return tables


def switch_charges(costs: np.ndarray, home: int, copy_charge: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, fraction of its cost) added per variant: every variant but ``home`` pays
    :data:`SWITCH_SECONDS` and :data:`SWITCH_MARGIN` on top of its ``copy_charge``."""
    away = np.arange(len(costs)) != home
    return copy_charge + np.where(away, SWITCH_SECONDS, 0.0), np.where(away, SWITCH_MARGIN, 0.0)


def charged_choice(costs: np.ndarray, surcharge: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """Per key cell, the variant whose charged cost (``cost x (1 + margin) + surcharge``) is least
    (ties to the earlier variant, as :func:`~tscomp.runtime.wave.pick_variant`)."""
    return np.argmin(costs * (1.0 + margin[:, None]) + surcharge[:, None], axis=0)


def _home_variant(variants: list, costs: np.ndarray, home_copy) -> int:
    """The variant that serves a group wherever no other is clearly faster: the cheapest summed over
    the key grid among those reading the home copy (or no copy)."""
    totals = costs.sum(axis=1)
    at_home = [v for v, k in enumerate(variants) if copy_key(k) in (None, home_copy)]
    return min(at_home or range(len(variants)), key=lambda v: totals[v])


def _copy_bytes(variants) -> dict[tuple, int]:
    """Packed copy (:func:`~tscomp.runtime.packing.copy_key`) -> its bytes, over ``variants``."""
    return {copy_key(k): k.packed.nbytes for k in variants if copy_key(k) is not None}


def _best_per_copy(variants: list, costs: np.ndarray) -> dict[tuple, np.ndarray]:
    """Packed copy -> per key cell, the cost of the cheapest variant reading it."""
    best: dict[tuple, np.ndarray] = {}
    for k, row in zip(variants, costs):
        copy = copy_key(k)
        if copy is not None:
            best[copy] = row if copy not in best else np.minimum(best[copy], row)
    return best


def _home_copy(variants: list, costs: np.ndarray) -> tuple | None:
    """The packed copy whose variants, picking the cheapest of them per cell, cost least summed
    over the key grid (None: the group's variants read no packed copy)."""
    totals = {copy: float(row.sum()) for copy, row in _best_per_copy(variants, costs).items()}
    return min(totals, key=totals.get) if totals else None


def _resident(kernels: dict[str, list], homes: dict, target: Target) -> bool:
    """Whether the model's home copies (a table's home, every other group's copies) fit in the
    target's share of the last level cache together; False for targets without one (GPUs)."""
    capacity = getattr(target.spec, "llc_share", 0)
    if not capacity:
        return False
    sizes: dict[tuple, int] = {}
    for name, variants in kernels.items():
        copies = _copy_bytes(variants)
        if name in homes:
            copies = {c: n for c, n in copies.items() if c == homes[name]}
        sizes.update(copies)
    return sum(sizes.values()) <= capacity


def _surcharges(variants: list, costs: np.ndarray, home) -> np.ndarray:
    """Per variant: 0 for the home copy's (and copy-less) variants, else its cost at the grid's
    first cell (the smallest shape of the range: its weight streamed once)."""
    out = np.zeros(len(variants))
    for v, k in enumerate(variants):
        copy = copy_key(k)
        if copy is not None and copy != home and np.isfinite(costs[v, 0]):
            out[v] = costs[v, 0]
    return out


#: a packed copy of a weight besides its group's home one is kept (compiled, stored, packed at
#: load) only if its variants make the group this much faster, geometric mean over its key grid
COPY_WORTH = 0.02

#: the same where the model's home copies fit in the last level cache together (:func:`_resident`):
#: there every switch between copies re-reads the one the last calls did not use, a cost the wave
#: model's warm-weight times do not see. Tiny BERT's two FFN copies (predicted +2.4%) measured
#: 0.994x the single-copy artifact's steady time over nine shapes (1x1 .. 8x512, A/B in one
#: process) and made the first call at L = 1 after L = 64 ~10 us (~20%) dearer
COPY_WORTH_RESIDENT = 0.10


#: ... and, where the model streams its weights anyway (not resident), a copy is kept whatever its
#: average gain where without it some shape of the range would run this many times slower than
#: with it: ResNet-50's channel-vector copies (lanes along the output channels) serve the late
#: stages of small images 2.3-5x faster than any position-vector tile, on 1-5% of the key grid,
#: 0.7-1.6% over it -- the average rule alone dropped them and left those shapes 1.5-2.5x slower
COPY_WORST_LOSS = 1.5


@dataclass(frozen=True)
class CopyRule:
    """When a further packed copy is kept: its variants make the group ``worth`` faster (geometric
    mean over the key grid), or ``worst_loss`` times faster at some cell."""
    worth: float
    worst_loss: float = math.inf

    def describe(self) -> str:
        loss = f" and < {self.worst_loss:g}x at every shape" if math.isfinite(self.worst_loss) else ""
        return f"< {self.worth:.0%} on average{loss}"


def copy_rule(resident: bool) -> CopyRule:
    """The rule for a model whose home copies stay cached between requests (``resident``) or not."""
    return CopyRule(COPY_WORTH_RESIDENT) if resident else CopyRule(COPY_WORTH, COPY_WORST_LOSS)


def _max_gain(before: np.ndarray, after: np.ndarray) -> float:
    """The largest before / after over the cells where both are finite (1 where there are none)."""
    both = np.isfinite(before) & np.isfinite(after)
    return float(np.max(before[both] / after[both])) if both.any() else 1.0


def _geomean_gain(before: np.ndarray, after: np.ndarray) -> float:
    """exp(mean log(before / after)) - 1 over the cells where both are finite; inf where only
    ``after`` is (a copy that serves cells nothing else can)."""
    both = np.isfinite(before) & np.isfinite(after)
    if np.any(np.isfinite(after) & ~np.isfinite(before)):
        return math.inf
    if not both.any():
        return 0.0
    return float(np.exp(np.mean(np.log(before[both] / after[both]))) - 1.0)


def worthwhile_copies(variants: list, costs: np.ndarray, rule: CopyRule | None = None) -> set:
    """The packed copies a group keeps: its home copy, then, greedily, each other copy whose
    variants lower the group's cost by at least ``rule.worth`` (geometric mean over the key grid)
    beyond the copies kept so far, or, failing that, make some cell ``rule.worst_loss`` times
    faster. A second copy of a weight doubles its memory (BERT-base: 708 MB of panels for 340 MB
    of weights, where its extra copies gained < 0.4% by the wave model)."""
    rule = rule or copy_rule(resident=False)
    best = _best_per_copy(variants, costs)
    home = _home_copy(variants, costs)
    if home is None:
        return set()
    kept, current = {home}, best[home]
    while True:
        gains = {c: _geomean_gain(current, np.minimum(current, row)) for c, row in best.items() if c not in kept}
        pick = max(gains, key=gains.get, default=None)
        if pick is None:
            return kept
        if gains[pick] < rule.worth:
            losses = {c: _max_gain(current, np.minimum(current, best[c])) for c in gains}
            pick = max(losses, key=losses.get)
            if losses[pick] < rule.worst_loss:
                return kept
        kept.add(pick)
        current = np.minimum(current, best[pick])


def drop_unworthy_copies(kernels: dict[str, list], symtab, target: Target) -> tuple[dict[str, int], CopyRule]:
    """Remove, in place, the variants that read a packed copy :func:`worthwhile_copies` does not
    keep (the compiler calls this once the variants are measured): (group -> bytes of panels no
    longer made, the rule a kept copy had to pass: :func:`copy_rule`, resident where the model's
    home copies fit in its share of the last level cache together). Groups without a
    dispatch table keep all their variants, and so do families whose copies are known only once
    loaded (not in :data:`~tscomp.runtime.packing.PACKERS`: their variants share an array after the
    artifact round trip only where it is equal, not before)."""
    # only groups with several copies need a cost grid: a home decides nothing where there is one
    grids = {name: grid for name, variants in kernels.items()
             if len(_copy_bytes(variants)) >= 2 and (grid := _cost_grid(variants, symtab, target)) is not None}
    homes = {name: _home_copy(kernels[name], costs) for name, (_, costs) in grids.items()}
    rule = copy_rule(_resident(kernels, homes, target))
    dropped: dict[str, int] = {}
    for name, (_, costs) in grids.items():
        variants, copies = kernels[name], _copy_bytes(kernels[name])
        if any(c[0] != "layout" for c in copies):
            continue
        kept = worthwhile_copies(variants, costs, rule)
        keep = [k for k in variants if copy_key(k) is None or copy_key(k) in kept]
        if len(keep) < len(variants):
            dropped[name] = sum(n for c, n in copies.items() if c not in kept)
            variants[:] = keep
    return dropped, rule


__all__ = ["COPY_WORST_LOSS", "COPY_WORTH", "COPY_WORTH_RESIDENT", "CopyRule", "DispatchKey", "DispatchTable", "MAX_GRID", "build_tables", "copy_rule", "dispatch_key", "drop_unworthy_copies",
           "worthwhile_copies"]
