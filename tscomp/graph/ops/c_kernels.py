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
:class:`~tscomp.errors.IndexOutOfRangeError` naming node, input, value and position). Loops are
written out in C over ``int64_t``; shapes enter as kernel arguments, so one kernel serves every
binding. The loop *structure* goes through the writer, the one part that differs per target:
``w.parallel_for`` (independent iterations: OpenMP here, a grid-stride loop in the SIMT writer),
``w.serial()`` (statements that run once, in order, after the earlier loops) and
``w.index_table`` / ``w.table_row`` / ``w.table_at`` (a table of a function of one output index:
built once per call here, computed per thread on a GPU) — so the same writer is also the CUDA
target's kernel (:mod:`tscomp.codegen.simt.index`, TSCompiler §5).
"""
from __future__ import annotations

import math

import numpy as np
import sympy

from tscomp.graph.ops.nn import REDUCTIONS
from tscomp.graph.ops.registry import attach
from tscomp.graph.ops.tensor import SCATTER_REDUCTIONS, _fill_value


def _axis_split(w, shape, axis: int) -> tuple[str, str, str]:
    """(outer, extent, inner) of ``shape`` around ``axis``, as C."""
    return w.numel(shape[:axis]), w.c(shape[axis]), w.numel(shape[axis + 1:])


def _each_line(w, outer: str, n: str, inner: str) -> None:
    """Open a parallel loop over the ``outer x inner`` lines of ``n`` elements (``o``, ``q``)."""
    w.parallel_for([("o", outer), ("q", inner)], work=f"({outer}) * ({n}) * ({inner})")


def _line_at(n: str, inner: str, t: str) -> str:
    """The flat offset (C) of element ``t`` of line ``(o, q)``."""
    return f"(o * ({n}) + {t}) * ({inner}) + q"


def _line_extreme(w, x, n: str, inner: str, better: str, last: bool, indent: str = "    ") -> None:
    """``bi``: the index of the line's first extreme (the last with ``last``) under ``better``,
    NaN counting as the extreme as in numpy's argmax/argmin; 0 for an empty line."""
    take = f"v {better} best || v == best || v != v" if last else f"v {better} best || (v != v && best == best)"
    w.emit(f"{indent}int64_t bi = 0;")
    w.emit(f"{indent}if ({n} > 0) {{")
    w.emit(f"{indent}    {x.ctype} best = {x.at(f'o * ({n}) * ({inner}) + q')};")
    w.emit(f"{indent}    for (int64_t t = 1; t < {n}; ++t) {{")
    w.emit(f"{indent}        const {x.ctype} v = {x.at(_line_at(n, inner, 't'))};")
    w.emit(f"{indent}        if ({take}) {{ best = v; bi = t; }}")
    w.emit(f"{indent}    }}")
    w.emit(f"{indent}}}")


# =========================================================================== CumSum, CumProd
def _scan_c(update: str, identity: str):
    """CumSum / CumProd: one sequential scan per (outer, inner) line, lines in parallel; the
    running value kept in the element type, as numpy's ``cumsum/cumprod(dtype=x.dtype)``."""
    def scan_c(w) -> None:
        x, y = w.arg(0), w.out(0)
        axes = w.const_ints(1)
        if axes is None:
            w.fail("axis known only at run time")
        if not x.shape:
            w.fail(f"{w.op_type} of a scalar")
        a = axes[0] % len(x.shape)
        outer, n, inner = _axis_split(w, x.shape, a)
        rev, exc = bool(w.attr("reverse", 0)), bool(w.attr("exclusive", 0))
        w.emit(f"/* {w.op_type} over axis {a}{' reversed' if rev else ''}{' exclusive' if exc else ''}: "
               f"[{outer}] lines x [{n}] x [{inner}] */")
        w.parallel_for([("o", outer), ("q", inner)], work=f"({outer}) * ({inner})", min_work=64)
        w.emit(f"    {y.ctype} acc = {identity};")
        w.emit(f"    for (int64_t t = 0; t < {n}; ++t) {{")
        w.emit(f"        const int64_t p = {_line_at(n, inner, f'({n}) - 1 - t' if rev else 't')};")
        if exc:
            w.emit(f"        {y.at('p')} = acc;")
            w.emit(f"        acc {update}= {x.at('p')};")
        else:
            w.emit(f"        acc {update}= {x.at('p')};")
            w.emit(f"        {y.at('p')} = acc;")
        w.emit("    }")
        w.emit("}")
    return scan_c


# =========================================================================== Range, ConstantOfShape
def range_c(w) -> None:
    """``start + i * delta`` in the element type (the reference's arange cast, then multiply)."""
    y = w.out(0)
    start, delta = w.arg(0).at("0"), w.arg(2).at("0")
    n = w.c(y.shape[0])
    w.emit(f"/* Range: [{n}] elements start + i * delta */")
    w.parallel_for([("i", n)], simd=True, brace=False)
    w.emit(f"    {y.at('i')} = ({y.ctype})({start} + ({y.ctype})i * {delta});")


def constant_of_shape_c(w) -> None:
    y = w.out(0)
    value = w.literal(_fill_value(w.attr)[0], y.dtype)
    n = w.numel(y.shape)
    w.emit(f"/* ConstantOfShape: [{n}] elements = {value} */")
    w.parallel_for([("i", n)], simd=True, brace=False)
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
        w.emit(f"/* {w.op_type} over axis {a} ({'last' if last else 'first'} index): "
               f"[{outer}] x [{n}] x [{inner}] */")
        _each_line(w, outer, n, inner)
        _line_extreme(w, x, n, inner, better, last)
        w.emit(f"    {y.at(f'o * ({inner}) + q')} = bi;")
        w.emit("}")
    return arg_c


# =========================================================================== TopK
def topk_c(w) -> None:
    """Every element's rank in its line -- how many elements come before it: better, or equal at a
    lower index (NaN after every number, as the reference's stable sort) -- and the K of rank < K
    written at their rank. O(n^2) compares per line, no scratch: the same code runs as a SIMT
    kernel; TopK's K and lines are short in the models that use it (routers, beam scores)."""
    x = w.arg(0)
    vals, idx = (w.out(k) if w.has_out(k) else None for k in (0, 1))
    if not x.shape:
        w.fail("TopK of a scalar")
    a = int(w.attr("axis", -1)) % len(x.shape)
    outer, n, inner = _axis_split(w, x.shape, a)
    k = w.c((vals or idx).shape[a])
    cmp = ">" if w.attr("largest", 1) else "<"
    w.emit(f"/* TopK ({'largest' if cmp == '>' else 'smallest'}) over axis {a}: [{outer}] x [{n}] x [{inner}], "
           f"K = {k}, sorted, ties in index order */")
    w.parallel_for([("o", outer), ("q", inner), ("t", n)], work=f"({outer}) * ({inner}) * ({n}) * ({n})")
    w.emit(f"    const {x.ctype} v = {x.at(_line_at(n, inner, 't'))};")
    w.emit("    int64_t r = 0;")
    w.emit(f"    for (int64_t s = 0; s < {n}; ++s) {{")
    w.emit(f"        const {x.ctype} u = {x.at(_line_at(n, inner, 's'))};")
    w.emit(f"        r += (u {cmp} v) || (u == u && v != v) || (s < t && (u == v || (u != u && v != v)));")
    w.emit("    }")
    w.emit(f"    if (r < {k}) {{")
    for out, value in ((vals, "v"), (idx, "t")):
        if out is not None:      # an output nothing reads is not stored
            w.emit(f"        {out.at(f'(o * ({k}) + r) * ({inner}) + q')} = {value};")
    w.emit("    }")
    w.emit("}")


# =========================================================================== Reduce*
#: the reductions the registry gives no C form for (:class:`~tscomp.graph.ops.nn.ReductionC`):
#: (initial value, update of ``acc`` with ``v``, result); NaN propagates through max/min as in
#: numpy, ReduceLogSumExp accumulates exp(v - top) after a first pass finds ``top``
REDUCE_SPECIAL_C = {
    "ReduceMax": ("-INFINITY", "acc = (v > acc || v != v) ? v : acc;", "acc"),
    "ReduceMin": ("INFINITY", "acc = (v < acc || v != v) ? v : acc;", "acc"),
    "ReduceLogSumExp": ("0.0", "acc += exp(v - top);", "log(acc) + top"),
}


def _reduce_form(op: str) -> tuple[str, str, str]:
    """(initial value, update of ``acc`` with ``v``, result) of ``op`` in double precision."""
    form = REDUCTIONS[op].c
    if form is None:
        return REDUCE_SPECIAL_C[op]
    return form.init, form.update.format(a="acc", x="v"), form.result.format(a="acc", n="{n}", t="double", f="")


def reduce_c(w) -> None:
    """Any set of reduced axes (the row kernel takes trailing ones only: ConvNeXt-V2's GRN reduces
    the spatial axes of an NHWC tensor): one output element per iteration of a collapsed loop nest
    over the kept axes (no division per element: OpenMP steps the indices; a flat index divided
    into coordinates per element cost Hiera's pooling ReduceMax ~5 divisions an element), its
    reduced elements walked by nested loops over the reduced axes, innermost last.
    ReduceLogSumExp takes the maximum first (a non-finite maximum shifts by 0, as the reference
    does)."""
    x, y = w.arg(0), w.out(0)
    if np.dtype(x.dtype).kind != "f":
        w.fail(f"{w.op_type} of {np.dtype(x.dtype)} (the C kernel reduces floating-point tensors)")
    axes = w.reduced_axes()
    if axes is None:
        w.fail("reduction axes known only at run time")
    if not axes:
        w.fail("noop_with_empty_axes (an identity) is not a reduction kernel")
    rank = len(x.shape)
    kept = [d for d in range(rank) if d not in axes]
    strides = [w.numel(x.shape[d + 1:]) for d in range(rank)]
    n = w.numel([x.shape[d] for d in axes])
    init, update, result = _reduce_form(w.op_type)
    w.emit(f"/* {w.op_type} over axes {list(axes)} of [{', '.join(w.c(d) for d in x.shape)}]: one output "
           f"element per iteration, the reduced elements in nested loops */")
    loops = [(f"c{k}", w.c(x.shape[d])) for k, d in enumerate(kept)] or [("c0", "1")]
    w.parallel_for(loops, work=w.numel(x.shape))
    out_strides = [w.numel([x.shape[d] for d in kept[k + 1:]]) for k in range(len(kept))]
    flat = " + ".join(f"c{k} * ({out_strides[k]})" for k in range(len(kept))) or "0"
    base = " + ".join(f"c{k} * ({strides[d]})" for k, d in enumerate(kept)) or "0"
    w.emit(f"    const int64_t p = {flat};")
    w.emit(f"    const int64_t base = {base};")

    def walk_reduced(body: str) -> None:
        off = "base"
        for depth, d in enumerate(axes):
            pad = "    " * (depth + 1)
            w.emit(f"{pad}for (int64_t r{d} = 0; r{d} < {w.c(x.shape[d])}; ++r{d}) {{")
            w.emit(f"{pad}    const int64_t o{d} = {off} + r{d} * ({strides[d]});")
            off = f"o{d}"
        pad = "    " * (len(axes) + 1)
        w.emit(f"{pad}const double v = (double){x.at(off)};")
        w.emit(f"{pad}{body}")
        for depth in reversed(range(len(axes))):
            w.emit("    " * (depth + 1) + "}")

    if w.op_type == "ReduceLogSumExp":
        w.emit("    double top = -INFINITY;")
        walk_reduced("top = v > top ? v : top;")
        w.emit("    if (!isfinite(top)) top = 0.0;")
    w.emit(f"    double acc = {init};")
    walk_reduced(update)
    w.emit(f"    {y.at('p')} = ({y.ctype})({result.format(n=n)});")
    w.emit("}")


# =========================================================================== ScatterElements, ScatterND
#: reduction attribute -> C update of ``d`` (the output element) with ``u`` (the update)
SCATTER_UPDATES = {"none": "{d} = {u};", "add": "{d} += {u};", "mul": "{d} *= {u};",
                   "max": "{d} = {u} > {d} ? {u} : {d};", "min": "{d} = {u} < {d} ? {u} : {d};"}
assert set(SCATTER_UPDATES) == set(SCATTER_REDUCTIONS)


def _copy(w, src, dst) -> None:
    n = w.numel(dst.shape)
    w.parallel_for([("p", n)], simd=True, brace=False)
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
    with w.serial():
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
    with w.serial():
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


# =========================================================================== Resize
#: coordinate_transformation_mode -> C (double) source coordinate of output index ``y`` for scale
#: ``s``, input length ``n`` and output length ``o`` (the reference's COORDINATE_TRANSFORMS)
RESIZE_COORDS = {
    "half_pixel": "(y + 0.5) / s - 0.5",
    "half_pixel_symmetric": "n / 2 * (1 - o / (s * n)) + (y + 0.5) / s - 0.5",
    "pytorch_half_pixel": "o > 1 ? (y + 0.5) / s - 0.5 : 0.0",
    "align_corners": "o > 1 ? y * (n - 1) / (o - 1) : 0.0",
    "asymmetric": "y / s",
    "tf_half_pixel_for_nn": "(y + 0.5) / s",
}
#: nearest_mode -> C rounding of the coordinate ``x``
RESIZE_ROUNDING = {"round_prefer_floor": "ceil(x - 0.5)", "round_prefer_ceil": "floor(x + 0.5)",
                   "floor": "floor(x)", "ceil": "ceil(x)"}
#: mode -> (kernel radius, C weight of distance ``t`` with cubic coefficient ``a``)
RESIZE_KERNELS = {
    "linear": (1, "(t < 1 ? 1 - t : 0.0)"),
    "cubic": (2, "(t <= 1 ? ((a + 2) * t - (a + 3)) * t * t + 1 : t < 2 ? ((a * t - 5 * a) * t + 8 * a) * t - 4 * a "
                 ": 0.0)"),
}


def _str_attr(w, key: str, default: str) -> str:
    v = w.attr(key, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def resize_c(w) -> None:
    """Separable resampling in double, as the reference: per resized axis a table of source
    indices and weights (taps) per output index, built once per call; then every output element
    is the weighted sum over the product of its axes' taps. Axes whose length and scale are 1:1 at
    compile time are copied, not resampled."""
    x, y = w.arg(0), w.out(0)
    mode = _str_attr(w, "mode", "nearest")
    coord = _str_attr(w, "coordinate_transformation_mode", "half_pixel")
    policy = _str_attr(w, "keep_aspect_ratio_policy", "stretch")
    if coord not in RESIZE_COORDS:
        w.fail(f"coordinate_transformation_mode {coord!r} (no C kernel; tf_crop_and_resize runs on numpy)")
    if mode != "nearest" and mode not in RESIZE_KERNELS:
        w.fail(f"mode {mode!r}")
    if x.dtype.kind != "f":
        w.fail(f"Resize of {x.dtype} (only floating point has a C kernel)")
    r = len(x.shape)
    axes = [a % r for a in w.attr("axes", list(range(r)))]
    present = lambda i: len(w.op.args) > i and w.op.args[i] is not None and tuple(w.op.args[i].shape) != (0,)  # noqa: E731
    sizes = w.arg(3) if present(3) else None
    scales = w.arg(2) if sizes is None and present(2) else None
    if sizes is None and scales is None:
        w.fail("neither scales nor sizes")
    ns = [w.c(x.shape[a]) for a in axes]
    os_ = [w.c(y.shape[a]) for a in axes]
    # compile-time identity axes: same length, and scale 1 (given) or stretched sizes
    same_len = [w.canon(x.shape[a]) == w.canon(y.shape[a]) for a in axes]
    const_scales = w.const_floats(2) if scales is not None else None
    ident = [sl and (sizes is not None and policy == "stretch" or (const_scales is not None and const_scales[k] == 1.0))
             for k, sl in enumerate(same_len)]
    resized = [(k, a) for k, a in enumerate(axes) if not ident[k]]
    w.emit(f"/* Resize {mode} ({coord}): axes {[a for _, a in resized]} resampled, the rest copied */")
    if sizes is not None and policy != "stretch":
        pick = "fmin" if policy == "not_larger" else "fmax"
        w.emit(f"double s_all = (double)({sizes.at('0')}) / (double)({ns[0]});")
        for k in range(1, len(axes)):
            w.emit(f"s_all = {pick}(s_all, (double)({sizes.at(str(k))}) / (double)({ns[k]}));")
    antialias = bool(w.attr("antialias", 0)) and mode != "nearest"
    exclude = bool(w.attr("exclude_outside", 0))
    a_coef = float(w.attr("cubic_coeff_a", -0.75))
    tables = {}
    for k, a in resized:
        if sizes is None:
            scale = f"(double)({scales.at(str(k))})"
        elif policy == "stretch":
            scale = f"(double)({os_[k]}) / (double)({ns[k]})"
        else:
            scale = "s_all"
        w.emit(f"/* axis {a}: taps of each of its {os_[k]} outputs */")
        w.emit(f"const double s{a} = {scale};")
        if mode == "nearest":
            w.emit(f"const int64_t nt{a} = 1;")
        else:
            radius = RESIZE_KERNELS[mode][0]
            w.emit(f"const double st{a} = {'s%d < 1 ? s%d : 1.0' % (a, a) if antialias else '1.0'};")
            w.emit(f"const int64_t t0{a} = (int64_t)floor(-{radius}.0 / st{a}) + 1;")
            w.emit(f"const int64_t nt{a} = 2 - 2 * t0{a};")
        head = [f"const double y = (double)i, s = s{a}, n = (double)({ns[k]}), o = (double)({os_[k]});",
                f"const double x = {RESIZE_COORDS[coord]};"]
        if mode == "nearest":
            body = [f"ix[0] = (int64_t)({RESIZE_ROUNDING[_str_attr(w, 'nearest_mode', 'round_prefer_floor')]});",
                    "wx[0] = 1.0;"]
            max_width = 1
        else:
            body = ["const double base = ceil(x) - 1;",
                    f"const double a = {a_coef!r};",
                    "double total = 0;",
                    f"for (int64_t j = 0; j < nt{a}; ++j) {{",
                    f"    const double t = fabs(((double)(t0{a} + j) - (x - base)) * st{a});",
                    f"    ix[j] = (int64_t)base + t0{a} + j;",
                    f"    wx[j] = {RESIZE_KERNELS[mode][1]};",
                    "    total += wx[j];",
                    "}"]
            if antialias:
                body.append(f"for (int64_t j = 0; j < nt{a}; ++j) wx[j] /= total;")
            max_width = _resize_taps(radius, const_scales[k] if const_scales is not None and sizes is None else None,
                                     antialias)
        if exclude:
            body.append("double kept = 0;")
            body.append(f"for (int64_t j = 0; j < nt{a}; ++j) {{ if (ix[j] < 0 || ix[j] >= ({ns[k]})) wx[j] = 0; "
                        "kept += wx[j]; }")
            body.append(f"if (kept != 0) for (int64_t j = 0; j < nt{a}; ++j) wx[j] /= kept;")
        body.append(f"for (int64_t j = 0; j < nt{a}; ++j) ix[j] = ix[j] < 0 ? 0 : (ix[j] >= ({ns[k]}) ? ({ns[k]}) - 1 : ix[j]);")
        tables[a] = w.index_table(str(a), os_[k], f"nt{a}", max_width,
                                  [(f"ia{a}", "int64_t", "ix"), (f"wa{a}", "double", "wx")], head, body)
    total = w.numel(y.shape)
    # the sizes once, as locals; one parallel iteration per output row (every axis but the last),
    # its elements in an inner loop: the row's index arithmetic (divisions by the sizes) and its
    # taps along the other axes are then paid once per row, not per element (a 2x bilinear
    # upsampling ran ~24 cycles per element, most of them in divisions)
    for d in range(r):
        w.emit(f"const int64_t od{d} = {w.c(y.shape[d])}, xs{d} = {w.numel(x.shape[d + 1:])};")
    last = r - 1
    rows = " * ".join(f"od{d}" for d in range(last)) or "1"
    moved = {a for _, a in resized}
    w.parallel_for([("q", rows)], work=total, min_work=4096)
    w.emit("    int64_t rest = q;")
    for d in reversed(range(last)):
        w.emit(f"    const int64_t c{d} = rest % od{d}; rest /= od{d};")
    fixed = " + ".join(f"c{d} * xs{d}" for d in range(last) if d not in moved)
    w.emit(f"    const int64_t row = {fixed or '0'};")
    for _, a in resized:
        if a != last:
            w.table_row(tables[a], f"c{a}")
    w.emit(f"    for (int64_t c{last} = 0; c{last} < od{last}; ++c{last}) {{")
    if last in moved:
        w.table_row(tables[last], f"c{last}")
    w.emit(f"        const int64_t fixed = row{'' if last in moved else f' + c{last} * xs{last}'};")
    w.emit("        double acc = 0;")
    depth, weight, off = 2, "1.0", "fixed"
    for _, a in resized:
        w.emit("    " * depth + f"for (int64_t j{a} = 0; j{a} < nt{a}; ++j{a}) {{")
        depth += 1
        w.emit("    " * depth + f"const double w{a} = {weight} * {w.table_at(tables[a], f'wa{a}', f'j{a}')};")
        w.emit("    " * depth + f"const int64_t f{a} = {off} + {w.table_at(tables[a], f'ia{a}', f'j{a}')} * xs{a};")
        weight, off = f"w{a}", f"f{a}"
    w.emit("    " * depth + f"acc += {weight} * (double){x.at(off)};")
    for _ in resized:
        depth -= 1
        w.emit("    " * depth + "}")
    w.emit(f"        {y.at(f'q * od{last} + c{last}')} = ({y.ctype})acc;")
    w.emit("    }")
    w.emit("}")
    for _, a in resized:
        w.free_table(tables[a])


def _resize_taps(radius: int, scale: float | None, antialias: bool) -> int | None:
    """Taps per output index of a linear/cubic axis (the kernel's ``nt``): ``2 * radius``, or with
    antialias and a compile-time downscale the stretched support; None when only run time knows."""
    if not antialias:
        return 2 * radius
    if scale is None or scale <= 0:
        return None
    st = scale if scale < 1 else 1.0
    return 2 - 2 * (math.floor(-radius / st) + 1)


# =========================================================================== Pad, Trilu, OneHot, EyeLike
def _coords(w, shape, flat: str = "p") -> None:
    """``c0 .. c{r-1}``: the multi-index of flat position ``flat`` in ``shape`` (C locals)."""
    w.emit("    int64_t rest = %s;" % flat)
    for d in reversed(range(len(shape))):
        w.emit(f"    const int64_t c{d} = rest % ({w.c(shape[d])}); rest /= ({w.c(shape[d])});")


def _each_element(w, shape, what: str) -> None:
    n = w.numel(shape)
    w.emit(f"/* {what}: one output element per iteration over [{', '.join(w.c(d) for d in shape)}] */")
    w.parallel_for([("p", n)])
    _coords(w, shape)


#: Pad mode -> C of the source position (in the cropped input of length ``n``) of padded position ``t``,
#: or for "constant" the condition that it lies inside
PAD_SOURCE = {
    "edge": "{t} < 0 ? 0 : ({t} >= {n} ? {n} - 1 : {t})",
    "wrap": "ts_mod({t}, {n})",
    "reflect": "{n} == 1 ? 0 : (ts_mod({t}, 2 * ({n} - 1)) < {n} ? ts_mod({t}, 2 * ({n} - 1)) "
               ": 2 * ({n} - 1) - ts_mod({t}, 2 * ({n} - 1)))",
}


def pad_c(w) -> None:
    """Negative pads crop first, then every output element reads its source position under the
    mode (numpy's pad: reflect and wrap repeat periodically for pads longer than the input).

    One iteration per output *row* (every axis but the last), so the multi-index is divided out
    once per row, not per element: a per-element version spent ~5 ns an element on its integer
    divisions, more than the convolution it feeds (TF-style "same" padding in front of every Conv
    of MobileNetV2 made the Pads 80% of the model). Constant mode fills a row outside the source
    with the value and otherwise copies its interior in one unit-stride loop between two fills."""
    x, y = w.arg(0), w.out(0)
    r = len(x.shape)
    mode = w.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if w.opset < 11:
        pads = [int(v) for v in w.attr("pads", w.attr("paddings", []))]
        value = w.literal(float(w.attr("value", 0.0)), x.dtype)
        axes = list(range(r))
    else:
        pads = w.const_exprs(1)
        if pads is None:
            w.fail("pads known only at run time")
        value = w.arg(2).at("0") if w.has_arg(2) and w.op.args[2].shape != (0,) else w.literal(0, x.dtype)
        axes = w.const_ints(3) if w.has_arg(3) else list(range(r))
        if axes is None:
            w.fail("axes known only at run time")
        axes = [a % r for a in axes]
    if mode != "constant" and mode not in PAD_SOURCE:
        w.fail(f"mode {mode!r}")
    begin = {a: pads[k] for k, a in enumerate(axes)}
    end = {a: pads[k + len(axes)] for k, a in enumerate(axes)}
    rows, last = y.shape[:-1], r - 1
    width = w.c(y.shape[-1])
    w.emit(f"/* Pad ({mode}): one output row per iteration over [{', '.join(w.c(d) for d in rows)}], "
           f"{width} elements each */")
    w.parallel_for([("p", w.numel(rows) if rows else "1")], work=w.numel(y.shape))
    _coords(w, rows)
    inside = []
    for d in range(r):
        if d not in begin:
            w.emit(f"    const int64_t lead = 0, n{d} = {w.c(x.shape[d])}, s{d} = 0;" if d == last
                   else f"    const int64_t s{d} = c{d};")
            continue
        crop0, lead = sympy.Max(-begin[d], 0), sympy.Max(begin[d], 0)
        n = w.c(x.shape[d] - crop0 - sympy.Max(-end[d], 0))
        crop0, lead = w.c(crop0), w.c(lead)
        if d == last:      # the row's own axis: its lead, length and first source column
            w.emit(f"    const int64_t lead = {lead}, n{d} = {n}, s{d} = {crop0};")
            continue
        w.emit(f"    const int64_t t{d} = c{d} - ({lead}), n{d} = {n};")
        if mode == "constant":
            inside.append(f"t{d} >= 0 && t{d} < n{d}")
            w.emit(f"    const int64_t s{d} = ({crop0}) + t{d};")
        else:
            src = PAD_SOURCE[mode].format(t=f"t{d}", n=f"n{d}")
            w.emit(f"    const int64_t s{d} = ({crop0}) + ({src});")
    row = " + ".join(f"s{d} * ({w.numel(x.shape[d + 1:])})" for d in range(r - 1)) or "0"
    w.emit(f"    const int64_t dst = p * ({width}), src = {row} + s{last};")
    if mode == "constant":
        if inside:
            w.emit(f"    if (!({' && '.join(inside)})) {{")
            w.emit(f"        for (int64_t j = 0; j < {width}; ++j) {y.at('dst + j')} = {value};")
            w.emit("        continue;")
            w.emit("    }")
        w.emit(f"    for (int64_t j = 0; j < lead; ++j) {y.at('dst + j')} = {value};")
        w.emit(f"    for (int64_t j = 0; j < n{last}; ++j) {y.at('dst + lead + j')} = {x.at('src + j')};")
        w.emit(f"    for (int64_t j = lead + n{last}; j < {width}; ++j) {y.at('dst + j')} = {value};")
    else:
        col = PAD_SOURCE[mode].format(t="(j - lead)", n=f"n{last}")
        w.emit(f"    for (int64_t j = 0; j < {width}; ++j) {y.at('dst + j')} = {x.at(f'src + ({col})')};")
    w.emit("}")


def trilu_c(w) -> None:
    x, y = w.arg(0), w.out(0)
    r = len(x.shape)
    k = w.arg(1).at("0") if w.has_arg(1) else "0"
    keep = f"c{r - 1} - c{r - 2} >= ({k})" if w.attr("upper", 1) else f"c{r - 1} - c{r - 2} <= ({k})"
    _each_element(w, y.shape, f"Trilu ({'upper' if w.attr('upper', 1) else 'lower'})")
    w.emit(f"    {y.at('p')} = ({keep}) ? {x.at('p')} : 0;")
    w.emit("}")


def onehot_c(w) -> None:
    """``values[1]`` where the index (negative counting from the end) equals the position on the
    new axis, else ``values[0]``; out-of-range indices match nothing, as in the reference."""
    ind, vals, y = w.arg(0), w.arg(2), w.out(0)
    r = len(y.shape)
    axis = int(w.attr("axis", -1)) % r
    depth = w.c(y.shape[axis])
    _each_element(w, y.shape, f"OneHot on axis {axis}")
    src = [d for d in range(r) if d != axis]
    off = " + ".join(f"c{d} * ({w.numel(y.shape[d + 1:axis] + y.shape[max(d + 1, axis + 1):])})" for d in src) or "0"
    w.emit(f"    int64_t v = (int64_t)({ind.at(off)});")
    w.emit(f"    if (v < 0) v += {depth};")
    w.emit(f"    {y.at('p')} = v == c{axis} ? {vals.at('1')} : {vals.at('0')};")
    w.emit("}")


def eye_like_c(w) -> None:
    y = w.out(0)
    _each_element(w, y.shape, "EyeLike")
    w.emit(f"    {y.at('p')} = (c1 - c0 == {int(w.attr('k', 0))}) ? 1 : 0;")
    w.emit("}")


# =========================================================================== LpNormalization, LRN, Hardmax, Det
def lp_normalization_c(w) -> None:
    """Each line along ``axis`` over its L1 or L2 norm (accumulated in double); 0 where the norm is 0."""
    x, y = w.arg(0), w.out(0)
    p = int(w.attr("p", 2))
    if p not in (1, 2):
        w.fail(f"p = {p} (ONNX defines 1 and 2)")
    a = int(w.attr("axis", -1)) % len(x.shape)
    outer, n, inner = _axis_split(w, x.shape, a)
    w.emit(f"/* LpNormalization (L{p}) over axis {a}: [{outer}] x [{n}] x [{inner}] */")
    _each_line(w, outer, n, inner)
    w.emit("    double s = 0.0;")
    w.emit(f"    for (int64_t t = 0; t < {n}; ++t) {{")
    w.emit(f"        const double v = (double){x.at(_line_at(n, inner, 't'))};")
    w.emit(f"        s += {'fabs(v)' if p == 1 else 'v * v'};")
    w.emit("    }")
    w.emit(f"    const {x.ctype} norm = ({x.ctype})({'s' if p == 1 else 'sqrt(s)'});")
    w.emit(f"    for (int64_t t = 0; t < {n}; ++t) {{")
    w.emit(f"        const int64_t at = {_line_at(n, inner, 't')};")
    w.emit(f"        {y.at('at')} = norm == 0 ? ({y.ctype})0 : {x.at('at')} / norm;")
    w.emit("    }")
    w.emit("}")


def lrn_c(w) -> None:
    """Across channels: every element over ``(bias + alpha / size * the sum of squares of the
    size channels around its own) ** beta``, the window clipped at the first and last channel
    (sums in double, as the reference)."""
    x, y = w.arg(0), w.out(0)
    if len(x.shape) < 3:
        w.fail(f"LRN of a rank-{len(x.shape)} input (it normalizes [N, C, spatial...])")
    size = int(w.attr("size"))
    alpha, beta, bias = (float(w.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    channels, plane = w.c(x.shape[1]), w.numel(x.shape[2:])
    w.emit(f"/* LRN size {size} (channels c - {lo} .. c + {hi}), alpha {alpha!r}, beta {beta!r}, bias {bias!r} */")
    w.emit(f"const int64_t lrn_c = {channels}, lrn_plane = {plane};")
    w.parallel_for([("p", w.numel(x.shape))], work=f"({w.numel(x.shape)}) * {size}")
    w.emit("    const int64_t c = p / lrn_plane % lrn_c;")
    w.emit(f"    const int64_t first = c - {lo} < 0 ? 0 : c - {lo}, last = c + {hi} >= lrn_c ? lrn_c - 1 : c + {hi};")
    w.emit("    double s = 0.0;")
    w.emit("    for (int64_t i = first; i <= last; ++i) {")
    w.emit(f"        const double v = (double){x.at('p + (i - c) * lrn_plane')};")
    w.emit("        s += v * v;")
    w.emit("    }")
    w.emit(f"    {y.at('p')} = ({y.ctype})((double){x.at('p')} / pow({bias!r} + {alpha!r} / {size} * s, {beta!r}));")
    w.emit("}")


def hardmax_c(w) -> None:
    """1 at each line's first largest element (ArgMax's scan: NaN counting as the largest, as
    numpy's argmax), 0 elsewhere; before opset 13 the lines are the input flattened to 2-d at ``axis``."""
    x, y = w.arg(0), w.out(0)
    if not x.shape:
        w.fail("Hardmax of a scalar")
    r = len(x.shape)
    if w.opset < 13:
        a = int(w.attr("axis", 1)) % r
        outer, n, inner = w.numel(x.shape[:a]), w.numel(x.shape[a:]), "1"
    else:
        a = int(w.attr("axis", -1)) % r
        outer, n, inner = _axis_split(w, x.shape, a)
    w.emit(f"/* Hardmax: [{outer}] x [{n}] x [{inner}] lines */")
    _each_line(w, outer, n, inner)
    _line_extreme(w, x, n, inner, ">", last=False)
    w.emit(f"    for (int64_t t = 0; t < {n}; ++t) {y.at(_line_at(n, inner, 't'))} = t == bi;")
    w.emit("}")


#: the largest static matrix order Det's kernel factors in registers and on the stack
DET_MAX_ORDER = 32


def det_c(w) -> None:
    """Each matrix's determinant by LU factorization with partial pivoting, in double."""
    x, y = w.arg(0), w.out(0)
    m = x.shape[-1]
    if not m.is_Integer or not 1 <= int(m) <= DET_MAX_ORDER:
        w.fail(f"matrices of order {m} (the C kernel factors static orders 1 to {DET_MAX_ORDER})")
    m = int(m)
    w.emit(f"/* Det of [{w.numel(x.shape[:-2])}] matrices {m}x{m}: LU with partial pivoting */")
    w.parallel_for([("b", w.numel(x.shape[:-2]))], work=f"({w.numel(x.shape[:-2])}) * {m * m * m}")
    w.emit(f"    double a[{m * m}], det = 1.0;")
    w.emit(f"    for (int64_t i = 0; i < {m * m}; ++i) a[i] = (double){x.at(f'b * {m * m} + i')};")
    w.emit(f"    for (int64_t k = 0; k < {m}; ++k) {{")
    w.emit("        int64_t piv = k;")
    w.emit(f"        for (int64_t i = k + 1; i < {m}; ++i) if (fabs(a[i * {m} + k]) > fabs(a[piv * {m} + k])) piv = i;")
    w.emit("        if (piv != k) {")
    w.emit(f"            for (int64_t j = 0; j < {m}; ++j) {{ const double t = a[k * {m} + j]; "
           f"a[k * {m} + j] = a[piv * {m} + j]; a[piv * {m} + j] = t; }}")
    w.emit("            det = -det;")
    w.emit("        }")
    w.emit(f"        const double d = a[k * {m} + k];")
    w.emit("        det *= d;")
    w.emit("        if (d == 0) break;")
    w.emit(f"        for (int64_t i = k + 1; i < {m}; ++i) {{")
    w.emit(f"            const double f = a[i * {m} + k] / d;")
    w.emit(f"            for (int64_t j = k + 1; j < {m}; ++j) a[i * {m} + j] -= f * a[k * {m} + j];")
    w.emit("        }")
    w.emit("    }")
    w.emit(f"    {y.at('b')} = ({y.ctype})det;")
    w.emit("}")


# =========================================================================== ReverseSequence
def reverse_sequence_c(w) -> None:
    """Each batch entry's first ``lens[b]`` steps along the time axis reversed, the rest copied;
    a length outside ``[0, time steps]`` is an error naming the node, the input and the value."""
    x, lens, y = w.arg(0), w.arg(1), w.out(0)
    batch_axis, time_axis = int(w.attr("batch_axis", 1)), int(w.attr("time_axis", 0))
    steps, stride = w.c(x.shape[time_axis]), w.numel(x.shape[time_axis + 1:])
    _each_element(w, y.shape, f"ReverseSequence (batch axis {batch_axis}, time axis {time_axis})")
    n = w.count_check(lens.at(f"c{batch_axis}"), steps, 1, f"c{batch_axis}")
    w.emit(f"    const int64_t n = {n}, t = c{time_axis};")
    w.emit(f"    {y.at('p')} = {x.at(f'p + (t < n ? n - 1 - 2 * t : 0) * ({stride})')};")
    w.emit("}")


# =========================================================================== GridSample
#: taps per spatial axis of each mode, and the most tap combinations a point may gather
GRID_SAMPLE_TAPS = {"nearest": 1, "linear": 2, "cubic": 4}
GRID_SAMPLE_MAX_COMBOS = 64


def grid_sample_c(w) -> None:
    """``GridSample`` as its numpy reference (:func:`tscomp.graph.ops.sampling.grid_sample_ref`),
    in double: one parallel iteration per output point, which maps its coordinates to each spatial
    axis (``align_corners``), applies the padding mode to the coordinate (border clamps it, except
    for cubic; reflection folds it into range) and to each tap (zeros drops an outside tap, border
    clamps it, reflection folds it), then sums the product of its axes' taps for every channel.
    A coordinate past any range (or NaN) converts to an index outside the image, never to an
    undefined cast."""
    from tscomp.graph.ops.sampling import _MODES
    x, grid, y = w.arg(0), w.arg(1), w.out(0)
    if x.dtype.kind != "f" or grid.dtype.kind != "f":
        w.fail(f"GridSample of {x.dtype} at {grid.dtype} coordinates (only floating point has a C kernel)")
    mode = _MODES[_str_attr(w, "mode", "linear")]
    padding = _str_attr(w, "padding_mode", "zeros")
    align = bool(w.attr("align_corners", 0))
    r = len(x.shape) - 2
    taps = GRID_SAMPLE_TAPS[mode]
    combos = taps ** r
    if combos > GRID_SAMPLE_MAX_COMBOS:
        w.fail(f"{mode} sampling over {r} spatial axes gathers {combos} taps per point "
               f"(at most {GRID_SAMPLE_MAX_COMBOS} in the C kernel)")
    dims = [w.c(d) for d in x.shape[2:]]
    w.emit(f"/* GridSample {mode}, padding {padding}, align_corners {int(align)}: {r} spatial axes, "
           f"{combos} taps per point */")
    w.emit(f"const int64_t gs_n = {w.c(x.shape[0])}, gs_c = {w.c(x.shape[1])}, gs_points = "
           f"{w.numel(y.shape[2:])}, gs_plane = {w.numel(x.shape[2:])};")
    w.parallel_for([("i", "gs_n * gs_points")], work=f"gs_n * gs_points * gs_c * {combos}")
    w.emit("    const int64_t n = i / gs_points;")
    w.emit(f"    int64_t off[{combos}]; double wt[{combos}];")
    w.emit("    off[0] = 0; wt[0] = 1.0;")
    for k in range(r):
        _grid_sample_axis(w, grid, k, r, dims[k], w.numel(x.shape[3 + k:]), mode, padding, align, taps)
    w.emit("    for (int64_t c = 0; c < gs_c; ++c) {")
    w.emit(f"        const int64_t base = (n * gs_c + c) * gs_plane;")
    w.emit("        double acc = 0.0;")
    w.emit(f"        for (int t = 0; t < {combos}; ++t) acc += wt[t] * (double){x.at('base + off[t]')};")
    w.emit(f"        {y.at('(n * gs_c + c) * gs_points + i % gs_points')} = ({y.ctype})acc;")
    w.emit("    }")
    w.emit("}")


def _grid_sample_reflect(w, v: str, lo: str, hi: str, indent: str) -> None:
    """``v`` (a double lvalue) reflected at ``lo`` and ``hi`` until inside, in place."""
    w.emit(f"{indent}{{ const double span = {hi} - {lo};")
    w.emit(f"{indent}  if (span <= 0) {v} = {lo};")
    w.emit(f"{indent}  else if ({v} < {lo} || {v} > {hi}) {{")
    w.emit(f"{indent}    const int below = {v} < {lo};")
    w.emit(f"{indent}    const double dist = below ? {lo} - {v} : {v} - {hi}, m = floor(dist / span), "
           f"rest = dist - m * span;")
    w.emit(f"{indent}    const int even = fmod(m, 2.0) == 0;")
    w.emit(f"{indent}    {v} = below ? (even ? {lo} + rest : {hi} - rest) : (even ? {hi} - rest : {lo} + rest);")
    w.emit(f"{indent}  }} }}")


def _grid_sample_axis(w, grid, k: int, r: int, d: str, stride: str, mode: str, padding: str, align: bool,
                      taps: int) -> None:
    """Spatial axis ``k``'s taps of the point, folded into the running offsets and weights of the
    tap combinations (``off``/``wt``, ``taps ** k`` of them so far)."""
    ind = "    "
    w.emit(f"{ind}{{ /* spatial axis {k}: extent {d}, grid coordinate {r - 1 - k} */")
    w.emit(f"{ind}const double d = (double)({d});")
    w.emit(f"{ind}const double g = (double){grid.at(f'i * {r} + {r - 1 - k}')};")
    w.emit(f"{ind}double x = {'(g + 1) / 2 * (d - 1)' if align else '((g + 1) * d - 1) / 2'};")
    if mode == "nearest":
        w.emit(f"{ind}x = rint(x);")
    lo, hi = ("0.0", "d - 1") if align else ("-0.5", "d - 0.5")
    w.emit(f"{ind}const double lo = {lo}, hi = {hi};")
    if padding == "border" and mode != "cubic":     # cubic clamps its taps only (onnxruntime, torch)
        w.emit(f"{ind}if (x < lo || x > hi) x = fmin(fmax(x, 0.0), d - 1);")
    elif padding == "reflection":
        _grid_sample_reflect(w, "x", "lo", "hi", ind)
    w.emit(f"{ind}double tx[{taps}]; double tw[{taps}];")
    if mode == "nearest":
        w.emit(f"{ind}tx[0] = x; tw[0] = 1.0;")
    else:
        w.emit(f"{ind}const double b = floor(x), t = x - b;")
        if mode == "linear":
            w.emit(f"{ind}tx[0] = b; tw[0] = 1 - t; tx[1] = b + 1; tw[1] = t;")
        else:       # Keys' cubic convolution weights, alpha -0.75, of the taps at -1, 0, 1, 2 -- each tap's
            # own branch, as the reference (Resize's kernel picks the branch by the distance, which
            # turns a NaN coordinate's weights into 0 where GridSample's reference gives NaN)
            w.emit(f"{ind}const double a = -0.75;")
            for j, dist in enumerate(("t + 1", "t", "1 - t", "2 - t")):
                e = (f"((a * ({dist}) - 5 * a) * ({dist}) + 8 * a) * ({dist}) - 4 * a" if j in (0, 3)
                     else f"((a + 2) * ({dist}) - (a + 3)) * ({dist}) * ({dist}) + 1")
                w.emit(f"{ind}tx[{j}] = b + {j - 1}; tw[{j}] = {e};")
    w.emit(f"{ind}int64_t ti[{taps}];")
    w.emit(f"{ind}for (int j = 0; j < {taps}; ++j) {{")
    # truncation toward zero as the reference's casts; past the image (or NaN): a sure outside index
    w.emit(f"{ind}    double v = tx[j];")
    w.emit(f"{ind}    v = v == v ? fmin(fmax(v, -8.0), d + 8.0) : -8.0;")
    w.emit(f"{ind}    int64_t ix = (int64_t)v;")
    if padding == "zeros":
        w.emit(f"{ind}    if (ix < 0 || ix >= ({d})) tw[j] = tw[j] * 0.0;")
    elif padding == "reflection":
        w.emit(f"{ind}    double fx = (double)ix;")
        _grid_sample_reflect(w, "fx", "lo", "hi", ind + "    ")
        w.emit(f"{ind}    ix = (int64_t)fx;")
    w.emit(f"{ind}    ti[j] = ix < 0 ? 0 : (ix >= ({d}) ? ({d}) - 1 : ix);")
    w.emit(f"{ind}}}")
    so_far = taps ** k
    w.emit(f"{ind}for (int q = {so_far} - 1; q >= 0; --q)     /* each combination so far times each tap */")
    w.emit(f"{ind}    for (int j = {taps} - 1; j >= 0; --j) {{")
    w.emit(f"{ind}        off[q * {taps} + j] = off[q] + ti[j] * ({stride});")
    w.emit(f"{ind}        wt[q * {taps} + j] = wt[q] * tw[j];")
    w.emit(f"{ind}    }}")
    w.emit(f"{ind}}}")


C_KERNELS = {
    "CumSum": _scan_c("+", "0"),
    "CumProd": _scan_c("*", "1"),
    "Range": range_c,
    "ConstantOfShape": constant_of_shape_c,
    "ArgMax": _arg_c(">"),
    "ArgMin": _arg_c("<"),
    "ScatterElements": scatter_elements_c,
    "ScatterND": scatter_nd_c,
    "Resize": resize_c,
    "Pad": pad_c,
    "Trilu": trilu_c,
    "OneHot": onehot_c,
    "EyeLike": eye_like_c,
    "TopK": topk_c,
    "GridSample": grid_sample_c,
    "LpNormalization": lp_normalization_c,
    "LRN": lrn_c,
    "Hardmax": hardmax_c,
    "Det": det_c,
    "ReverseSequence": reverse_sequence_c,
    **{op: reduce_c for op in REDUCTIONS},
}

for _op, _fn in C_KERNELS.items():
    attach(_op, c_kernel=_fn)

__all__ = ["C_KERNELS"]
