"""C kernels of the opaque index operators, one writer per op (issue 11: no group of a supported
model runs on numpy). Each ``*_c(w)`` writes the body of a one-op kernel through the writer ``w``
of :mod:`tscomp.codegen.cpu_index` and is attached to the op's registry entry as
:attr:`~tscomp.graph.ops.registry.OpDef.c_kernel` at the bottom of this module; the numpy
``reference`` of the same entry is the semantics each reproduces (the tests compare both with
onnxruntime).

The writer gives operands (``w.arg(i)``, ``w.out(k)``) with their C element type, symbolic shape
and flat loads (``x.at(off)``), shape expressions printed as C (``w.c``, ``w.numel``), compile-time
integer inputs (``w.const_ints``), element literals, range-checked data-dependent indices
(``w.index``: ``ts_index`` with the kernel's error record, so a bad index becomes
:class:`~tscomp.errors.IndexOutOfRangeError` naming node, input, value and position) and the
OpenMP condition of a loop over ``n`` elements (``w.parallel(n)``). Loops are written out in C
over ``int64_t``; shapes enter as kernel arguments, so one kernel serves every binding.
"""
from __future__ import annotations

import numpy as np

from tscomp.graph.ops.registry import attach
from tscomp.graph.ops.tensor import SCATTER_REDUCTIONS, _fill_value


def _axis_split(w, shape, axis: int) -> tuple[str, str, str]:
    """(outer, extent, inner) of ``shape`` around ``axis``, as C."""
    return w.numel(shape[:axis]), w.c(shape[axis]), w.numel(shape[axis + 1:])


# =========================================================================== CumSum
def cumsum_c(w) -> None:
    """One sequential scan per (outer, inner) line, lines in parallel; the sum is kept in the
    element type, as numpy's ``cumsum(dtype=x.dtype)`` does."""
    x, y = w.arg(0), w.out(0)
    axes = w.const_ints(1)
    if axes is None:
        w.fail("axis known only at run time")
    if not x.shape:
        w.fail("CumSum of a scalar")
    a = axes[0] % len(x.shape)
    outer, n, inner = _axis_split(w, x.shape, a)
    rev, exc = bool(w.attr("reverse", 0)), bool(w.attr("exclusive", 0))
    w.emit(f"/* CumSum over axis {a}{' reversed' if rev else ''}{' exclusive' if exc else ''}: "
           f"[{outer}] lines x [{n}] x [{inner}] */")
    w.emit(f"#pragma omp parallel for collapse(2) schedule(static){w.parallel(f'({outer}) * ({inner})', 64)}")
    w.emit(f"for (int64_t o = 0; o < {outer}; ++o)")
    w.emit(f"for (int64_t q = 0; q < {inner}; ++q) {{")
    w.emit(f"    {y.ctype} acc = 0;")
    w.emit(f"    for (int64_t t = 0; t < {n}; ++t) {{")
    w.emit(f"        const int64_t p = (o * ({n}) + {f'({n}) - 1 - t' if rev else 't'}) * ({inner}) + q;")
    if exc:
        w.emit(f"        {y.at('p')} = acc;")
        w.emit(f"        acc += {x.at('p')};")
    else:
        w.emit(f"        acc += {x.at('p')};")
        w.emit(f"        {y.at('p')} = acc;")
    w.emit("    }")
    w.emit("}")


# =========================================================================== Range, ConstantOfShape
def range_c(w) -> None:
    """``start + i * delta`` in the element type (the reference's arange cast, then multiply)."""
    y = w.out(0)
    start, delta = w.arg(0).at("0"), w.arg(2).at("0")
    n = w.c(y.shape[0])
    w.emit(f"/* Range: [{n}] elements start + i * delta */")
    w.emit(f"#pragma omp parallel for simd schedule(static){w.parallel(n)}")
    w.emit(f"for (int64_t i = 0; i < {n}; ++i)")
    w.emit(f"    {y.at('i')} = ({y.ctype})({start} + ({y.ctype})i * {delta});")


def constant_of_shape_c(w) -> None:
    y = w.out(0)
    value = w.literal(_fill_value(w.attr)[0], y.dtype)
    n = w.numel(y.shape)
    w.emit(f"/* ConstantOfShape: [{n}] elements = {value} */")
    w.emit(f"#pragma omp parallel for simd schedule(static){w.parallel(n)}")
    w.emit(f"for (int64_t i = 0; i < {n}; ++i)")
    w.emit(f"    {y.at('i')} = {value};")


# =========================================================================== ArgMax, ArgMin
def _arg_c(better: str):
    def arg_c(w) -> None:
        """One scan per (outer, inner) line; the first extreme (the last with
        ``select_last_index``), NaN counting as the extreme as in numpy's argmax/argmin."""
        x, y = w.arg(0), w.out(0)
        if not x.shape:
            w.fail(f"{w.op_type} of a scalar")
        a = int(w.attr("axis", 0)) % len(x.shape)
        outer, n, inner = _axis_split(w, x.shape, a)
        last = bool(w.attr("select_last_index", 0))
        take = f"v {better} best || v == best || v != v" if last else f"v {better} best || (v != v && best == best)"
        w.emit(f"/* {w.op_type} over axis {a} ({'last' if last else 'first'} index): "
               f"[{outer}] x [{n}] x [{inner}] */")
        w.emit(f"#pragma omp parallel for collapse(2) schedule(static){w.parallel(f'({outer}) * ({n}) * ({inner})')}")
        w.emit(f"for (int64_t o = 0; o < {outer}; ++o)")
        w.emit(f"for (int64_t q = 0; q < {inner}; ++q) {{")
        w.emit("    int64_t bi = 0;")
        w.emit(f"    if ({n} > 0) {{")
        w.emit(f"        {x.ctype} best = {x.at(f'o * ({n}) * ({inner}) + q')};")
        w.emit(f"        for (int64_t t = 1; t < {n}; ++t) {{")
        w.emit(f"            const {x.ctype} v = {x.at(f'(o * ({n}) + t) * ({inner}) + q')};")
        w.emit(f"            if ({take}) {{ best = v; bi = t; }}")
        w.emit("        }")
        w.emit("    }")
        w.emit(f"    {y.at(f'o * ({inner}) + q')} = bi;")
        w.emit("}")
    return arg_c


# =========================================================================== ScatterElements, ScatterND
#: reduction attribute -> C update of ``d`` (the output element) with ``u`` (the update)
SCATTER_UPDATES = {"none": "{d} = {u};", "add": "{d} += {u};", "mul": "{d} *= {u};",
                   "max": "{d} = {u} > {d} ? {u} : {d};", "min": "{d} = {u} < {d} ? {u} : {d};"}
assert set(SCATTER_UPDATES) == set(SCATTER_REDUCTIONS)


def _copy(w, src, dst) -> None:
    n = w.numel(dst.shape)
    w.emit(f"#pragma omp parallel for simd schedule(static){w.parallel(n)}")
    w.emit(f"for (int64_t p = 0; p < {n}; ++p)")
    w.emit(f"    {dst.at('p')} = {src.at('p')};")


def _update(w) -> str:
    reduction = w.attr("reduction", "none")
    if reduction not in SCATTER_UPDATES:
        w.fail(f"reduction {reduction!r}")
    return SCATTER_UPDATES[reduction]


def scatter_elements_c(w) -> None:
    """Copy data, then the updates one by one in index order (serial: duplicate indices resolve
    as the reference does, the last write or every reduction in order)."""
    data, ind, upd, y = w.arg(0), w.arg(1), w.arg(2), w.out(0)
    update = _update(w)
    r = len(data.shape)
    if r == 0 or len(ind.shape) != r:
        w.fail(f"indices of rank {len(ind.shape)} for data of rank {r}")
    a = int(w.attr("axis", 0)) % r
    w.emit(f"/* ScatterElements along axis {a}: copy data, then {len(ind.shape)}-d updates in order */")
    _copy(w, data, y)
    # index p over the indices' shape, the data offset with the axis coordinate replaced
    dims = [w.c(d) for d in ind.shape]
    strides = [w.numel(data.shape[k + 1:]) for k in range(r)]
    w.emit("{")
    w.emit("    int64_t p = 0;")
    for k in range(r):
        w.emit("    " * (k + 1) + f"for (int64_t c{k} = 0; c{k} < {dims[k]}; ++c{k})")
    body = "    " * (r + 1)
    w.emit(body[:-4] + "{")
    k_c = w.index(ind.at("p"), w.c(data.shape[a]), 1, "p")
    w.emit(body + f"const int64_t k = {k_c};")
    off = " + ".join(f"{'k' if k == a else f'c{k}'} * ({strides[k]})" for k in range(r))
    w.emit(body + f"const int64_t d = {off};")
    w.emit(body + update.format(d=y.at("d"), u=upd.at("p")))
    w.emit(body + "++p;")
    w.emit(body[:-4] + "}")
    w.emit("}")


def scatter_nd_c(w) -> None:
    """Copy data, then one slice of ``prod(data.shape[q:])`` elements per index tuple, tuples in
    order (serial, as the reference)."""
    data, ind, upd, y = w.arg(0), w.arg(1), w.arg(2), w.out(0)
    update = _update(w)
    if not ind.shape or not ind.shape[-1].is_Integer:
        w.fail("indices whose last dim is not a number")
    q = int(ind.shape[-1])
    if q > len(data.shape):
        w.fail(f"index tuples of length {q} for data of rank {len(data.shape)}")
    rows, piece = w.numel(ind.shape[:-1]), w.numel(data.shape[q:])
    w.emit(f"/* ScatterND: copy data, then [{rows}] index tuples of length {q}, slices of [{piece}] */")
    _copy(w, data, y)
    w.emit(f"for (int64_t r = 0; r < {rows}; ++r) {{")
    terms = []
    for j in range(q):
        g = w.index(ind.at(f"r * {q} + {j}"), w.c(data.shape[j]), 1, f"r * {q} + {j}")
        w.emit(f"    const int64_t g{j} = {g};")
        terms.append(f"g{j} * ({w.numel(data.shape[j + 1:])})")
    w.emit(f"    const int64_t base = {' + '.join(terms) or '0'};")
    w.emit(f"    for (int64_t e = 0; e < {piece}; ++e)")
    w.emit("        " + update.format(d=y.at("base + e"), u=upd.at(f"r * ({piece}) + e")))
    w.emit("}")


C_KERNELS = {
    "CumSum": cumsum_c,
    "Range": range_c,
    "ConstantOfShape": constant_of_shape_c,
    "ArgMax": _arg_c(">"),
    "ArgMin": _arg_c("<"),
    "ScatterElements": scatter_elements_c,
    "ScatterND": scatter_nd_c,
}

for _op, _fn in C_KERNELS.items():
    attach(_op, c_kernel=_fn)

__all__ = ["C_KERNELS"]
