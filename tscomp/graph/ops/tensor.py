"""Shape, layout and indexing operators.

Shape and Size; the index maps Reshape, Transpose, Unsqueeze, Squeeze, Flatten,
Concat, Split, Slice, Gather, GatherElements, GatherND, Expand and Tile; the
generators Range, ConstantOfShape, Constant and EyeLike; and Pad, Trilu, CumSum,
NonZero, OneHot, ScatterND, ScatterElements and (inference-mode) Dropout.

These operators carry the shape arithmetic of exported models, so their rules
do the heavy lifting of symbolic shape propagation (TSCompiler §4.1,
``ComputeSymShape``): Shape/Size emit their input's symbolic dims as element
values, the index maps move those values along (their numpy references are
generic over object arrays of SymPy expressions), and Reshape/Expand/Tile/
ConstantOfShape/Range/Slice turn them back into symbolic output shapes, with
the lengths simplified under the symbol ranges (``SymbolTable.canon``).

Conventions used throughout:

* parameters that moved from attributes to inputs across opsets (Reshape's
  shape before 5, Slice's starts/ends/axes before 10, Pad's pads before 11,
  Squeeze/Unsqueeze axes and Split's sizes before 13) are read through
  :func:`_param` in rules and :func:`_ref_param` in references, given the
  opset where the input form starts;
* a parameter whose values are unknown at compile time (a runtime graph
  input) gives fresh symbols for the dims it decides, the rank coming from the
  parameter's length; the reference executor binds them at run time;
* a variant tscomp does not implement raises ``ctx.unsupported``; an input that
  provably violates the operator's contract raises ``ctx.fail``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import sympy

from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.ops.elementwise import onnx_dtype
from tscomp.graph.ops.registry import (DATA_VIA_REFERENCE, FusionClass, OpCall, OpDef, ShapeContext,
                                       register, same_shape)
from tscomp.graph import views
from tscomp.graph.symbols import as_expr, numel, shape_str

Expr = sympy.Expr

#: ``_param`` result for a parameter that is present but whose values are unknown at compile time.
UNKNOWN = object()
#: The numpy ufunc applying each reduction ScatterND / ScatterElements accept (None: plain assignment).
SCATTER_REDUCTIONS = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum,
                      "min": np.minimum}
PAD_MODES = ("constant", "reflect", "edge", "wrap")


# =========================================================================== helpers
def _ints(arr) -> list[int]:
    """A concrete integer tensor (or object array of SymPy integers) as Python ints.

    Raises TypeError for symbolic elements, which tells a data rule to give up."""
    return [int(v) for v in np.asarray(arr).reshape(-1).tolist()]


def _obj_array(values: Sequence, shape=None) -> np.ndarray:
    """An object array of SymPy expressions (``np.array`` would try to iterate them)."""
    out = np.empty(len(values), dtype=object)
    out[:] = [as_expr(v) for v in values]
    return out.reshape(shape if shape is not None else (len(values),))


def _obj_scalar(value) -> np.ndarray:
    out = np.empty((), dtype=object)
    out[()] = as_expr(value)
    return out


def _param(ctx: ShapeContext, attr: str, index: int, since: int):
    """An integer-list parameter: attribute ``attr`` before opset ``since``, input ``index`` from it.

    Returns None when absent, :data:`UNKNOWN` when present but not known at compile time,
    else the values as SymPy expressions."""
    if ctx.opset < since:
        value = ctx.attr(attr)
        return None if value is None else [as_expr(int(v)) for v in np.atleast_1d(value).reshape(-1)]
    if not ctx.has_input(index):
        return None
    values = ctx.int_list(index)
    return UNKNOWN if values is None else values


def _ref_param(call: OpCall, args: Sequence, attr: str, index: int, since: int) -> list[int] | None:
    """The reference-side twin of :func:`_param` (``args`` are all the node's inputs)."""
    if call.opset < since:
        value = call.attr(attr)
        return None if value is None else _ints(np.atleast_1d(value))
    arg = args[index] if index < len(args) else None
    return None if arg is None else _ints(arg)


def _param_len(ctx: ShapeContext, index: int) -> int | None:
    """How many elements a 0-d/1-d parameter input holds, if its shape is concrete."""
    shape = ctx.shape(index)
    if len(shape) > 1:
        ctx.fail(f"input {index} must be 0-d or 1-d, got shape {shape_str(shape)}")
    n = numel(shape)
    return int(n) if n.is_Integer else None


def _fresh_dims(ctx: ShapeContext, n: int | None, stem: str) -> list[Expr]:
    """Unknown dims: one fresh symbol each. Without a rank nothing can be said, so it is unsupported."""
    if n is None:
        ctx.unsupported("the output rank depends on a tensor whose length is not known at compile time")
    return [ctx.fresh(stem) for _ in range(n)]


def _axes_list(ctx: ShapeContext, axes, rank: int):
    """Normalize concrete axes (or pass through None/UNKNOWN; symbolic axes count as UNKNOWN)."""
    if axes is None or axes is UNKNOWN:
        return axes
    if not all(a.is_Integer for a in axes):
        return UNKNOWN
    out = [ctx.normalize_axis(int(a), rank) for a in axes]
    if len(set(out)) != len(out):
        ctx.fail(f"axes {[int(a) for a in axes]} repeat an axis")
    return out


def _axis_attr(ctx: ShapeContext, rank: int, default: int | None = 0) -> int:
    axis = ctx.attr("axis", default)
    if axis is None:
        ctx.fail("the 'axis' attribute is required")
    return ctx.normalize_axis(int(axis), rank)


def _is(ctx: ShapeContext, value: Expr, n: int) -> bool | None:
    """Whether ``value == n`` over every binding in range (None: it depends)."""
    return ctx.symbols.decide("==", value, n)


def _canon(ctx: ShapeContext, expr) -> Expr:
    return ctx.symbols.canon(expr)


def _index_array(indices: np.ndarray, size: int) -> np.ndarray:
    """ONNX indices as int64 with negative ones counted from the end."""
    idx = np.asarray(indices).astype(np.int64)
    return np.where(idx < 0, idx + size, idx)


# =========================================================================== Shape, Size
def _shape_window(attrs_of) -> slice:
    """Shape-15's start/end: Python slicing clamps exactly as ONNX specifies."""
    return slice(int(attrs_of("start", 0)), attrs_of("end", None))


def shape_shape(ctx: ShapeContext) -> None:
    ctx.set_output(0, np.int64, [len(ctx.shape(0)[_shape_window(ctx.attr)])])


def shape_data(ctx: ShapeContext):
    return [_obj_array(ctx.shape(0)[_shape_window(ctx.attr)])]


def shape_ref(call: OpCall, x):
    return np.array(x.shape[_shape_window(call.attr)], dtype=np.int64)


def size_shape(ctx: ShapeContext) -> None:
    ctx.shape(0)
    ctx.set_output(0, np.int64, ())


def size_data(ctx: ShapeContext):
    return [_obj_scalar(numel(ctx.shape(0)))]


def size_ref(call: OpCall, x):
    return np.array(x.size, dtype=np.int64)


# =========================================================================== Reshape
def reshape_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    target = _param(ctx, "shape", 1, since=5)
    if target is None:
        ctx.fail("the target shape is missing")
    if target is UNKNOWN:
        n = _param_len(ctx, 1)
        # a rank-1 result can only hold every element, whatever the runtime shape says
        out = [numel(dims)] if n == 1 else _fresh_dims(ctx, n, "reshape")
    else:
        out = _reshape_dims(ctx, dims, target)
    ctx.set_output(0, ctx.dtype(0), out)


def _reshape_dims(ctx: ShapeContext, dims, target) -> list[Expr]:
    allowzero = bool(ctx.attr("allowzero", 0))
    out: list[Expr | None] = []
    infer = None
    for i, v in enumerate(target):
        is_zero = False if allowzero else _is(ctx, v, 0)
        is_infer = _is(ctx, v, -1)
        if is_zero is None and is_infer is False and i < len(dims) and v == dims[i]:
            out.append(v)  # copying dim i or taking the value literally gives the same dim
        elif is_zero is None or is_infer is None:
            out.append(ctx.fresh("reshape"))  # may or may not be 0 / -1 at run time
        elif is_zero:
            if i >= len(dims):
                ctx.fail(f"target {[str(t) for t in target]} copies dim {i} (0) "
                         f"of the rank-{len(dims)} input")
            out.append(dims[i])
        elif is_infer:
            if infer is not None:
                ctx.fail(f"target {[str(t) for t in target]} has more than one -1")
            infer = i
            out.append(None)
        elif ctx.symbols.decide("<", v, 0):
            ctx.fail(f"target {[str(t) for t in target]} has the invalid dim {v}")
        else:
            out.append(v)
    total = numel(dims)
    if infer is not None:
        out[infer] = _infer_dim(ctx, dims, out, total)
        return out
    same = ctx.symbols.decide("==", total, numel(out))
    if same is False:
        ctx.fail(f"cannot reshape {shape_str(dims)} ({total} elements) into {shape_str(out)} "
                 f"({numel(out)} elements)")
    if same is None:  # Reshape forces the counts equal: a fact for sibling inference
        ctx.unify(total, numel(out), f"element count of reshape {shape_str(dims)} -> {shape_str(out)}")
    return out


def _infer_dim(ctx: ShapeContext, dims, out, total) -> Expr:
    """The -1 dim: (product of input dims) / (product of the other target dims), kept exact."""
    known = numel([d for d in out if d is not None])
    if _is(ctx, known, 0):
        ctx.fail(f"cannot infer the -1 dim of {['-1' if d is None else str(d) for d in out]}: "
                 "the other dims multiply to 0")
    q = sympy.cancel(total / known)
    if q.is_number:
        if not q.is_Integer:
            ctx.fail(f"cannot reshape {shape_str(dims)} ({total} elements) into "
                     f"{['-1' if d is None else str(d) for d in out]}: {total} is not a multiple of {known}")
        return q
    if q.is_integer:
        return q
    # the other dims hold exact quotients (floor(H/2), an int64 Div of a Shape): where those divide
    # evenly, the -1 is the quotient without the floors (dynamo's pixel_unshuffle: [-1, C, H // 2,
    # 2, W // 2, 2] of [N, C, H, W] is N) -- the element counts' equality, checked per binding
    exact = sympy.cancel(q.replace(sympy.floor, lambda arg: arg))
    if exact != q and exact.is_integer:
        ctx.unify(total, known * exact, f"the -1 dim of {['-1' if d is None else str(d) for d in out]} "
                                        f"must be whole: {total} elements in blocks of {known}")
        return exact
    num, den = sympy.fraction(sympy.together(q))
    if den.is_Integer and den > 1 and num.is_integer:
        # [N, C, H, W] -> [N, C, -1, 2, W] is [.., H / 2, 2, ..]: whole only for an even H, which
        # the compiler cannot prove but Reshape demands -- a relation checked per binding (an odd H
        # is refused by name), and the dim is floor(H / 2), an integer expression
        whole = sympy.floor(num / den)
        ctx.unify(num, den * whole, f"the -1 dim of {['-1' if d is None else str(d) for d in out]} "
                                    f"must be whole: {num} a multiple of {den}")
        return whole
    return ctx.fresh("reshape")


def reshape_ref(call: OpCall, x, shape=None):
    target = _ref_param(call, [x, shape], "shape", 1, since=5)
    if not call.attr("allowzero", 0):
        target = [x.shape[i] if v == 0 else v for i, v in enumerate(target)]
    return x.reshape(target)


# =========================================================================== Transpose, Flatten
def _perm(attr, rank: int) -> list[int]:
    perm = attr("perm", None)
    return list(range(rank))[::-1] if perm is None else [int(p) for p in perm]


def transpose_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    perm = _perm(ctx.attr, len(dims))
    if sorted(perm) != list(range(len(dims))):
        ctx.fail(f"perm {perm} is not a permutation of the {len(dims)} input axes")
    ctx.set_output(0, ctx.dtype(0), [dims[p] for p in perm])


def transpose_ref(call: OpCall, x):
    return np.transpose(x, _perm(call.attr, x.ndim))


def flatten_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    axis = int(ctx.attr("axis", 1))
    if not -len(dims) <= axis <= len(dims):
        ctx.fail(f"axis {axis} is out of range [-{len(dims)}, {len(dims)}]")
    axis = axis + len(dims) if axis < 0 else axis
    ctx.set_output(0, ctx.dtype(0), [numel(dims[:axis]), numel(dims[axis:])])


def flatten_ref(call: OpCall, x):
    axis = int(call.attr("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))


# =========================================================================== Unsqueeze, Squeeze
def unsqueeze_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    axes = _param(ctx, "axes", 1, since=13)
    if axes is None:
        ctx.fail("axes are required")
    count = _param_len(ctx, 1) if axes is UNKNOWN else len(axes)
    rank = None if count is None else len(dims) + count
    axes = _axes_list(ctx, axes, rank) if rank is not None else UNKNOWN
    if axes is UNKNOWN:
        ctx.set_output(0, ctx.dtype(0), _fresh_dims(ctx, rank, "unsqueeze"))
        return
    rest = iter(dims)
    ctx.set_output(0, ctx.dtype(0), [1 if i in axes else next(rest) for i in range(rank)])


def unsqueeze_ref(call: OpCall, x, axes=None):
    return np.expand_dims(x, tuple(_ref_param(call, [x, axes], "axes", 1, since=13)))


def squeeze_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    axes = _param(ctx, "axes", 1, since=13)
    count = _param_len(ctx, 1) if axes is UNKNOWN else None if axes is None else len(axes)
    axes = _axes_list(ctx, axes, len(dims))
    if axes is UNKNOWN:
        rank = None if count is None else len(dims) - count
        ctx.set_output(0, ctx.dtype(0), _fresh_dims(ctx, rank, "squeeze"))
        return
    if axes is None:
        axes = [i for i, d in enumerate(dims) if _squeezable(ctx, i, d)]
    for a in axes:
        if _is(ctx, dims[a], 1) is False:
            ctx.fail(f"cannot squeeze axis {a} of {shape_str(dims)}: its size is not 1")
        ctx.unify(dims[a], 1, f"squeezed axis {a}")
    ctx.set_output(0, ctx.dtype(0), [d for i, d in enumerate(dims) if i not in axes])


def _squeezable(ctx: ShapeContext, axis: int, dim: Expr) -> bool:
    one = _is(ctx, dim, 1)
    if one is None:
        ctx.unsupported(f"Squeeze without axes on input dim {axis} = {dim}, which may or may not be 1: "
                        "the output rank would depend on the runtime shape (give the axes, or a range "
                        "for the symbol that excludes 1)")
    return one


def squeeze_ref(call: OpCall, x, axes=None):
    axes = _ref_param(call, [x, axes], "axes", 1, since=13)
    return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))


# =========================================================================== Concat, Split
def concat_shape(ctx: ShapeContext) -> None:
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs)) if ctx.has_input(i)]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        ctx.fail(f"inputs have different ranks: {', '.join(shape_str(s) for s in shapes)}")
    axis = _axis_attr(ctx, rank, default=1 if ctx.opset < 4 else None)
    out = list(shapes[0])
    for s in shapes[1:]:
        for j in range(rank):
            if j != axis:
                out[j] = ctx.unify(out[j], s[j], f"concat along axis {axis}: axis {j} of "
                                   f"{shape_str(shapes[0])} vs {shape_str(s)}")
    out[axis] = sum((s[axis] for s in shapes), sympy.Integer(0))
    ctx.set_output(0, ctx.dtype(0), out)


def concat_ref(call: OpCall, *xs):
    return np.concatenate([x for x in xs if x is not None], axis=int(call.attr("axis", 1)))


def _split_sizes(ctx: ShapeContext):
    sizes = _param(ctx, "split", 1, since=13)
    if sizes is None and ctx.opset < 2 and ctx.has_input(1):  # Split-1 also took them as an input
        sizes = ctx.int_list(1)
        sizes = UNKNOWN if sizes is None else sizes
    return sizes


def _equal_split(ctx: ShapeContext, dim: Expr, n: int) -> list[Expr]:
    """n parts of ceil(dim/n), the last one taking what is left (exact when n divides dim)."""
    part = _canon(ctx, sympy.ceiling(dim / n))
    last = _canon(ctx, dim - (n - 1) * part)
    if last.is_Integer and (last < 0 or (ctx.opset < 18 and last != part)):
        ctx.fail(f"dim {dim} cannot be split into {n} equal parts")
    return [part] * (n - 1) + [last]


def split_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    axis = _axis_attr(ctx, len(dims))
    n = ctx.num_outputs
    if ctx.attr("num_outputs") is not None and int(ctx.attr("num_outputs")) != n:
        ctx.fail(f"num_outputs={ctx.attr('num_outputs')} but the node has {n} outputs")
    sizes = _split_sizes(ctx)
    if sizes is UNKNOWN:
        sizes = _fresh_dims(ctx, n, "split")
    elif sizes is None:
        sizes = _equal_split(ctx, dims[axis], n)
    elif len(sizes) != n:
        ctx.fail(f"split sizes {[str(s) for s in sizes]} do not match the {n} outputs")
    elif ctx.symbols.decide("==", sum(sizes), dims[axis]) is False:
        ctx.fail(f"split sizes {[str(s) for s in sizes]} do not add up to dim {axis} = {dims[axis]}")
    for i, size in enumerate(sizes):
        ctx.set_output(i, ctx.dtype(0), dims[:axis] + (size,) + dims[axis + 1:])


def split_ref(call: OpCall, x, split=None):
    axis = int(call.attr("axis", 0)) % x.ndim
    sizes = _ref_param(call, [x, split], "split", 1, since=13)
    if sizes is None and call.opset < 2 and split is not None:
        sizes = _ints(split)
    if sizes is None:
        n, d = call.num_outputs, x.shape[axis]
        part = -(-d // n)
        sizes = [part] * (n - 1) + [d - part * (n - 1)]
    return np.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis)


# =========================================================================== Slice
def _from_end(ctx: ShapeContext, v: Expr, dim: Expr) -> Expr | None:
    """A negative start/end counts from the end; None when its sign depends on the binding."""
    negative = ctx.symbols.decide("<", v, 0)
    return None if negative is None else (v + dim if negative else v)


def _clamp(ctx: ShapeContext, v: Expr, lo, hi) -> Expr:
    return _canon(ctx, sympy.Min(sympy.Max(v, lo), hi))


def _slice_len(ctx: ShapeContext, dim: Expr, start, end, step) -> Expr | None:
    """ONNX Slice length along one axis (clamping rules), or None when not decidable."""
    if start is None or end is None or step is None or not step.is_Integer:
        return None
    if step == 0:
        ctx.fail("a slice step is 0")
    start, end = _from_end(ctx, start, dim), _from_end(ctx, end, dim)
    if start is None or end is None:
        return None
    if step > 0:
        start, end = _clamp(ctx, start, 0, dim), _clamp(ctx, end, 0, dim)
    else:
        start, end = _clamp(ctx, start, 0, dim - 1), _clamp(ctx, end, -1, dim - 1)
    return _canon(ctx, sympy.Max(sympy.ceiling((end - start) / step), 0))


def _nth(param, i: int, default=None):
    """Element ``i`` of a ``_param`` result: ``default`` when absent, None when unknown."""
    if param is None:
        return default
    return None if param is UNKNOWN else param[i]


def _slice_params(ctx: ShapeContext):
    starts, ends = _param(ctx, "starts", 1, since=10), _param(ctx, "ends", 2, since=10)
    axes, steps = _param(ctx, "axes", 3, since=10), _param(ctx, "steps", 4, since=10)
    if starts is None or ends is None:
        ctx.fail("starts and ends are required")
    known = [p for p in (starts, ends, axes, steps) if p is not None and p is not UNKNOWN]
    n = len(known[0]) if known else _param_len(ctx, 1)
    if any(len(p) != n for p in known):
        ctx.fail("starts, ends, axes and steps have different lengths")
    return n, starts, ends, axes, steps


def slice_shape(ctx: ShapeContext) -> None:
    dims = list(ctx.shape(0))
    n, starts, ends, axes, steps = _slice_params(ctx)
    if axes is None and n is not None:
        axes = [sympy.Integer(i) for i in range(n)]
    axes = _axes_list(ctx, axes, len(dims))
    if axes is UNKNOWN or axes is None:
        ctx.set_output(0, ctx.dtype(0), _fresh_dims(ctx, len(dims), "slice"))
        return
    for i, a in enumerate(axes):
        length = _slice_len(ctx, dims[a], _nth(starts, i), _nth(ends, i), _nth(steps, i, sympy.Integer(1)))
        dims[a] = ctx.fresh("slice") if length is None else length
    ctx.set_output(0, ctx.dtype(0), dims)


def slice_ref(call: OpCall, x, *rest):
    args = (x, *rest)
    starts = _ref_param(call, args, "starts", 1, since=10)
    ends = _ref_param(call, args, "ends", 2, since=10)
    axes = _ref_param(call, args, "axes", 3, since=10)
    steps = _ref_param(call, args, "steps", 4, since=10)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for a, s, e, k in zip(axes, starts, ends, steps):
        index[a % x.ndim] = views.onnx_slice(x.shape[a], s, e, k)
    return x[tuple(index)]


# =========================================================================== Gather family
def gather_shape(ctx: ShapeContext) -> None:
    data, idx = ctx.shape(0), ctx.shape(1)
    axis = _axis_attr(ctx, len(data))
    ctx.set_output(0, ctx.dtype(0), data[:axis] + idx + data[axis + 1:])


def gather_ref(call: OpCall, data, indices):
    axis = int(call.attr("axis", 0)) % max(data.ndim, 1)
    return np.take(data, _index_array(indices, data.shape[axis]), axis=axis)


def gather_elements_shape(ctx: ShapeContext) -> None:
    data, idx = ctx.shape(0), ctx.shape(1)
    if len(data) != len(idx):
        ctx.fail(f"indices {shape_str(idx)} and data {shape_str(data)} must have the same rank")
    _axis_attr(ctx, len(data))
    ctx.set_output(0, ctx.dtype(0), idx)


def gather_elements_ref(call: OpCall, data, indices):
    axis = int(call.attr("axis", 0)) % data.ndim
    return np.take_along_axis(data, _index_array(indices, data.shape[axis]), axis=axis)


def gather_nd_shape(ctx: ShapeContext) -> None:
    data, idx = ctx.shape(0), ctx.shape(1)
    b = int(ctx.attr("batch_dims", 0))
    if not idx or not idx[-1].is_Integer:
        ctx.unsupported(f"indices {shape_str(idx)} need a static last dim")
    k = int(idx[-1])
    if b + k > len(data) or b >= len(idx):
        ctx.fail(f"batch_dims={b} with index depth {k} does not fit data {shape_str(data)}")
    for i in range(b):
        ctx.unify(data[i], idx[i], f"batch dim {i} of data {shape_str(data)} and indices {shape_str(idx)}")
    ctx.set_output(0, ctx.dtype(0), idx[:-1] + data[b + k:])


def gather_nd_ref(call: OpCall, data, indices):
    b = int(call.attr("batch_dims", 0))
    k = indices.shape[-1]
    out_shape = indices.shape[:-1] + data.shape[b + k:]
    n = int(np.prod(data.shape[:b]))
    flat_data = data.reshape((n,) + data.shape[b:])
    flat_idx = np.asarray(indices).astype(np.int64).reshape((n,) + indices.shape[b:])
    flat_idx = np.where(flat_idx < 0, flat_idx + np.array(data.shape[b:b + k], dtype=np.int64), flat_idx)
    parts = [flat_data[j][tuple(np.moveaxis(flat_idx[j], -1, 0))] for j in range(n)]
    return np.stack(parts).reshape(out_shape) if parts else np.empty(out_shape, dtype=data.dtype)


# =========================================================================== Expand, Tile
def expand_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    target = ctx.int_list(1)
    if target is not None:
        ctx.set_output(0, ctx.dtype(0), ctx.broadcast(dims, tuple(target)))
        return
    # unknown target: a dim that is not 1 stays (the target must be 1 or equal); 1s become unknown
    rank = max(len(dims), _param_len(ctx, 1) or 0)
    padded = (sympy.Integer(1),) * (rank - len(dims)) + dims
    ctx.set_output(0, ctx.dtype(0), [ctx.fresh("expand") if _is(ctx, d, 1) is not False else d
                                     for d in padded])


def expand_ref(call: OpCall, x, shape):
    out_shape = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return np.array(np.broadcast_to(x, out_shape))


def _tile_repeats(ctx: ShapeContext, rank: int) -> list[Expr] | None:
    if ctx.opset >= 6:
        return ctx.int_list(1)
    tiles, axis = ctx.int_list(1), ctx.int_list(2)  # Tile-1: a repeat count for one axis
    if tiles is None or axis is None or not axis[0].is_Integer:
        return None
    reps = [sympy.Integer(1)] * rank
    reps[ctx.normalize_axis(int(axis[0]), rank)] = tiles[0]
    return reps


def tile_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    reps = _tile_repeats(ctx, len(dims))
    if reps is None:
        ctx.set_output(0, ctx.dtype(0), _fresh_dims(ctx, len(dims), "tile"))
        return
    if len(reps) != len(dims):
        ctx.fail(f"{len(reps)} repeats for a rank-{len(dims)} input")
    ctx.set_output(0, ctx.dtype(0), [d * r for d, r in zip(dims, reps)])


def tile_ref(call: OpCall, x, repeats, axis=None):
    if call.opset < 6:
        reps = [1] * x.ndim
        reps[_ints(axis)[0] % x.ndim] = _ints(repeats)[0]
        return np.tile(x, reps)
    return np.tile(x, _ints(repeats))


# =========================================================================== Range, ConstantOfShape, Constant
def _range_count(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> int:
    """max(ceil((limit - start) / delta), 0), in the arithmetic onnxruntime uses."""
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if delta == 0:
        raise ValueError("Range delta is 0")
    if delta.dtype.kind in "iu":
        return max(-((int(start) - int(limit)) // int(delta)), 0)
    return max(math.ceil(float(limit - start) / float(delta)), 0)


def range_shape(ctx: ShapeContext) -> None:
    consts = [ctx.const(i) for i in range(3)]
    if all(c is not None for c in consts):
        try:
            n = _range_count(*consts)
        except ValueError as e:
            ctx.fail(str(e))
    else:
        vals = [ctx.int_list(i) for i in range(3)]
        n = ctx.fresh("range") if any(v is None for v in vals) else _range_len(ctx, *(v[0] for v in vals))
    ctx.set_output(0, ctx.dtype(0), [n])


def _range_len(ctx: ShapeContext, start: Expr, limit: Expr, delta: Expr) -> Expr:
    if _is(ctx, delta, 0):
        ctx.fail("delta is 0")
    return _canon(ctx, sympy.Max(sympy.ceiling((limit - start) / delta), 0))


def range_data(ctx: ShapeContext):
    start, _, delta = (ctx.int_list(i)[0] for i in range(3))
    n = int(ctx.out_shapes[0][0])
    return [_obj_array([start + i * delta for i in range(n)])]


def range_ref(call: OpCall, start, limit, delta):
    dtype = np.asarray(start).dtype
    n = _range_count(start, limit, delta)
    return (start + np.arange(n).astype(dtype) * np.asarray(delta, dtype)).astype(dtype)


def _fill_value(attrs_of) -> np.ndarray:
    value = attrs_of("value", None)
    return np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)[:1]


def constant_of_shape_shape(ctx: ShapeContext) -> None:
    target = ctx.int_list(0)
    if target is None:
        target = _fresh_dims(ctx, _param_len(ctx, 0), "fill")
    elif any(ctx.symbols.decide("<", d, 0) for d in target):
        ctx.fail(f"negative dim in shape {shape_str(target)}")
    ctx.set_output(0, _fill_value(ctx.attr).dtype, target)


def constant_of_shape_data(ctx: ShapeContext):
    shape = tuple(int(d) for d in ctx.out_shapes[0])
    out = np.empty(shape, dtype=object)
    out[...] = as_expr(_fill_value(ctx.attr)[0])
    return [out]


def constant_of_shape_ref(call: OpCall, shape):
    fill = _fill_value(call.attr)
    return np.full(tuple(_ints(shape)), fill[0], dtype=fill.dtype)


#: Constant's value attributes -> how each becomes an array.
CONSTANT_VALUES = {
    "value": np.asarray,
    "value_float": lambda v: np.array(v, dtype=np.float32),
    "value_floats": lambda v: np.array(v, dtype=np.float32),
    "value_int": lambda v: np.array(v, dtype=np.int64),
    "value_ints": lambda v: np.array(v, dtype=np.int64),
}


def _constant_keys(attrs: dict) -> list[str]:
    return [k for k in attrs if k.startswith("value") or k == "sparse_value"]


def constant_shape(ctx: ShapeContext) -> None:
    keys = _constant_keys(ctx.attrs)
    if len(keys) != 1:
        ctx.fail(f"exactly one value attribute is required, got {keys or 'none'}")
    if keys[0] not in CONSTANT_VALUES:
        ctx.unsupported(f"attribute {keys[0]!r} (string and sparse constants are not supported)")
    value = CONSTANT_VALUES[keys[0]](ctx.attrs[keys[0]])
    if value.dtype.kind in "USO":
        ctx.unsupported(f"constant of element type {value.dtype}")
    ctx.set_output(0, value.dtype, value.shape)


def constant_ref(call: OpCall):
    key = _constant_keys(call.attrs)[0]
    return CONSTANT_VALUES[key](call.attrs[key])


# =========================================================================== Pad
def _pad_params(ctx: ShapeContext):
    pads = _param(ctx, "pads" if ctx.opset >= 2 else "paddings", 1, since=11)
    axes = _param(ctx, "axes", 3, since=18)
    if pads is None:
        ctx.fail("pads are required")
    return pads, axes


def pad_shape(ctx: ShapeContext) -> None:
    mode = ctx.attr("mode", "constant")
    if mode not in PAD_MODES or (mode == "wrap" and ctx.opset < 19):
        ctx.unsupported(f"Pad mode {mode!r} (supported: {', '.join(PAD_MODES)}; wrap from opset 19)")
    dims = list(ctx.shape(0))
    pads, axes = _pad_params(ctx)
    axes = _axes_list(ctx, axes, len(dims))
    if axes is UNKNOWN:
        ctx.set_output(0, ctx.dtype(0), _fresh_dims(ctx, len(dims), "pad"))
        return
    axes = list(range(len(dims))) if axes is None else axes
    if pads is not UNKNOWN and len(pads) != 2 * len(axes):
        ctx.fail(f"{len(pads)} pads for {len(axes)} axes (need 2 per axis)")
    for i, a in enumerate(axes):
        dims[a] = ctx.fresh("pad") if pads is UNKNOWN else dims[a] + pads[i] + pads[i + len(axes)]
        if ctx.symbols.decide("<", dims[a], 0):
            ctx.fail(f"pads {[str(p) for p in pads]} crop axis {a} below size 0")
    ctx.set_output(0, ctx.dtype(0), dims)


def pad_ref(call: OpCall, data, pads=None, constant_value=None, axes=None):
    args = (data, pads, constant_value, axes)
    pads = _ref_param(call, args, "pads" if call.opset >= 2 else "paddings", 1, since=11)
    axes = _ref_param(call, args, "axes", 3, since=18)
    axes = list(range(data.ndim)) if axes is None else [a % data.ndim for a in axes]
    if call.opset < 11:
        value = call.attr("value", 0.0)
    else:
        value = 0 if constant_value is None or not np.size(constant_value) else \
            np.asarray(constant_value).reshape(-1)[0]
    width, crop = [(0, 0)] * data.ndim, [slice(None)] * data.ndim
    for i, a in enumerate(axes):
        begin, end = pads[i], pads[i + len(axes)]
        width[a] = (max(begin, 0), max(end, 0))
        crop[a] = slice(max(-begin, 0), data.shape[a] - max(-end, 0))  # negative pads crop
    mode = call.attr("mode", "constant")
    kwargs = {"constant_values": value} if mode == "constant" else {}
    return np.pad(data[tuple(crop)], width, mode=mode, **kwargs).astype(data.dtype)


# =========================================================================== Trilu, CumSum, EyeLike
def trilu_shape(ctx: ShapeContext) -> None:
    if ctx.rank(0) < 2:
        ctx.fail(f"input {shape_str(ctx.shape(0))} must have rank >= 2")
    same_shape(ctx)


def trilu_ref(call: OpCall, x, k=None):
    k = 0 if k is None else _ints(k)[0]
    return np.triu(x, k) if call.attr("upper", 1) else np.tril(x, k)


def _scan_ref(scan, identity):
    """CumSum / CumProd: ``scan`` along the axis, reversed and/or exclusive (shifted by one, the
    identity first)."""
    def ref(call: OpCall, x, axis):
        axis = _ints(axis)[0] % x.ndim
        reverse, exclusive = bool(call.attr("reverse", 0)), bool(call.attr("exclusive", 0))
        y = np.flip(x, axis) if reverse else x
        out = scan(y, axis=axis, dtype=x.dtype)
        if exclusive:
            dst, src = [slice(None)] * x.ndim, [slice(None)] * x.ndim
            dst[axis], src[axis] = slice(1, None), slice(None, -1)
            shifted = np.full_like(out, identity)
            shifted[tuple(dst)] = out[tuple(src)]
            out = shifted
        return np.flip(out, axis) if reverse else out
    return ref


cumsum_ref = _scan_ref(np.cumsum, 0)
cumprod_ref = _scan_ref(np.cumprod, 1)


def reverse_sequence_ref(call: OpCall, x, lens):
    """Each batch entry's first ``lens[b]`` steps along the time axis reversed, the rest kept."""
    batch_axis, time_axis = int(call.attr("batch_axis", 1)), int(call.attr("time_axis", 0))
    out = x.copy()
    for b, n in enumerate(np.asarray(lens).reshape(-1)):
        src = [slice(None)] * x.ndim
        src[batch_axis], src[time_axis] = b, slice(0, int(n))
        out[tuple(src)] = np.flip(x[tuple(src)], axis=time_axis - (batch_axis < time_axis))
    return out


def eye_like_shape(ctx: ShapeContext) -> None:
    if ctx.rank(0) != 2:
        ctx.fail(f"input {shape_str(ctx.shape(0))} must be 2-d")
    dtype = ctx.attr("dtype")
    ctx.set_output(0, ctx.dtype(0) if dtype is None else onnx_dtype(ctx, dtype), ctx.shape(0))


def eye_like_ref(call: OpCall, x):
    dtype = call.attr("dtype")
    dtype = x.dtype if dtype is None else onnx_dtype(call, dtype)
    return np.eye(x.shape[0], x.shape[1], k=int(call.attr("k", 0)), dtype=dtype)


# =========================================================================== NonZero, OneHot
def _nonzero_mask(ctx: ShapeContext) -> np.ndarray | None:
    """Which elements are nonzero, when every one is decided at compile time."""
    const = ctx.const(0)
    if const is not None:
        return const != 0
    values = ctx.values(0)
    if values is None:
        return None
    decided = [ctx.symbols.decide("!=", v, 0) for v in values.reshape(-1)]
    return None if None in decided else np.array(decided, dtype=bool).reshape(values.shape)


def nonzero_shape(ctx: ShapeContext) -> None:
    dims = ctx.shape(0)
    mask = _nonzero_mask(ctx)
    if mask is not None:
        count = sympy.Integer(int(np.count_nonzero(mask)))
    else:
        count = ctx.data_dependent("nonzero")
        hi = ctx.symbols.bounds(numel(dims))[1]
        if math.isfinite(hi):
            ctx.symbols.tighten(count, 0, int(hi), f"{ctx.where()}: at most one index per element")
    ctx.set_output(0, np.int64, [len(dims), count])


def _nonzero_indices(x: np.ndarray) -> np.ndarray:
    if x.ndim == 0:  # numpy refuses nonzero on 0-d arrays
        return np.zeros((0, int(x != 0)), dtype=np.int64)
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


def nonzero_data(ctx: ShapeContext):
    mask = _nonzero_mask(ctx)
    if mask is None:
        return None
    indices = _nonzero_indices(mask)
    return [_obj_array(indices.reshape(-1).tolist(), indices.shape)]


def nonzero_ref(call: OpCall, x):
    return _nonzero_indices(x)


def onehot_shape(ctx: ShapeContext) -> None:
    idx = ctx.shape(0)
    axis = ctx.normalize_axis(int(ctx.attr("axis", -1)), len(idx) + 1)
    depth = ctx.int_list(1)
    if depth is None:
        depth = ctx.fresh("depth")
    else:
        depth = sympy.Integer(int(depth[0])) if depth[0].is_number else depth[0]
    ctx.set_output(0, ctx.dtype(2), idx[:axis] + (depth,) + idx[axis:])


def onehot_ref(call: OpCall, indices, depth, values):
    depth = int(np.asarray(depth).reshape(-1)[0])
    rank = indices.ndim + 1
    axis = int(call.attr("axis", -1)) % rank
    idx = np.asarray(indices).astype(np.int64)
    idx = np.expand_dims(np.where(idx < 0, idx + depth, idx), axis)  # out of range: matches nothing
    hot = idx == np.arange(depth).reshape([-1 if i == axis else 1 for i in range(rank)])
    off, on = np.asarray(values).reshape(-1)[:2]
    return np.where(hot, on, off).astype(values.dtype)


# =========================================================================== ScatterND, ScatterElements
def scatter_shape(ctx: ShapeContext) -> None:
    reduction = ctx.attr("reduction", "none")
    if reduction not in SCATTER_REDUCTIONS:
        ctx.unsupported(f"reduction {reduction!r} (supported: {', '.join(SCATTER_REDUCTIONS)})")
    if ctx.op_type == "ScatterElements" and ctx.rank(1) != ctx.rank(0):
        ctx.fail(f"indices {shape_str(ctx.shape(1))} and data {shape_str(ctx.shape(0))} differ in rank")
    same_shape(ctx)


def _scatter(out: np.ndarray, index: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    ufunc = SCATTER_REDUCTIONS[reduction]
    if ufunc is None:
        out[index] = updates
    else:
        ufunc.at(out, index, updates)
    return out


def scatter_nd_ref(call: OpCall, data, indices, updates):
    index = tuple(np.moveaxis(np.asarray(indices).astype(np.int64), -1, 0))
    return _scatter(data.copy(), index, updates, call.attr("reduction", "none"))


def scatter_elements_ref(call: OpCall, data, indices, updates):
    axis = int(call.attr("axis", 0)) % data.ndim
    idx = _index_array(indices, data.shape[axis])
    index = list(np.indices(idx.shape, sparse=True))
    index[axis] = idx
    return _scatter(data.copy(), tuple(index), updates, call.attr("reduction", "none"))


# =========================================================================== DepthToSpace, SpaceToDepth
# Both are a Reshape -> Transpose -> Reshape of [N, C, H, W] (pixel shuffle / unshuffle): a view,
# which the fusion stage composes into the reading kernel's index map.
def _space_layout(n, c, h, w, b: int, crd: bool, to_depth: bool):
    """(middle shape, permutation, output shape) of the Reshape -> Transpose -> Reshape, for ints or
    shape expressions alike (``//`` of a SymPy expression is its floor)."""
    if to_depth:      # [N, C, H/b, b, W/b, b] -> [N, b, b, C, H/b, W/b] (DCR)
        hb, wb = h // b, w // b
        return (n, c, hb, b, wb, b), (0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4), (n, c * b * b, hb, wb)
    cb = c // (b * b)
    if crd:
        return (n, cb, b, b, h, w), (0, 1, 4, 2, 5, 3), (n, cb, h * b, w * b)
    return (n, b, b, cb, h, w), (0, 3, 4, 1, 5, 2), (n, cb, h * b, w * b)


def _space_chain(ctx: ShapeContext, to_depth: bool):
    """:func:`_space_layout` of the node's input, its whole blocks required (H and W, or C)."""
    dims = ctx.shape(0)
    if len(dims) != 4:
        ctx.fail(f"expects a 4-d [N, C, H, W] input, got rank {len(dims)}")
    n, c, h, w = dims
    b = int(ctx.attr("blocksize", 0))
    if b < 1:
        ctx.fail(f"blocksize must be positive, got {b}")
    layout = _space_layout(n, c, h, w, b, ctx.attr("mode", "DCR") == "CRD", to_depth)
    if to_depth:
        for d, name in ((h, "H"), (w, "W")):
            ctx.unify(d, b * (d // b), f"{name} must be a multiple of the blocksize {b}")
    else:
        ctx.unify(c, b * b * (c // (b * b)), f"the channels must be a multiple of blocksize^2 = {b * b}")
    return layout


def _space_shape(to_depth: bool):
    def rule(ctx: ShapeContext) -> None:
        ctx.set_output(0, ctx.dtype(0), list(_space_chain(ctx, to_depth)[2]))
    return rule


def _space_ref(to_depth: bool):
    def ref(call: OpCall, x):
        mid, perm, out = _space_layout(*x.shape, int(call.attr("blocksize")), call.attr("mode", "DCR") == "CRD",
                                       to_depth)
        return x.reshape(mid).transpose(perm).reshape(out)
    return ref


def _space_view(to_depth: bool):
    def rule(ctx: ShapeContext, outs):
        mid, perm, _ = _space_chain(ctx, to_depth)
        return [(views.reshape(mid), views.permute(perm, mid), views.reshape(outs[0]))]
    return rule


# =========================================================================== Dropout
def _dropout_ratio(ctx: ShapeContext) -> Expr | None:
    if ctx.opset < 12:
        return as_expr(float(ctx.attr("ratio", 0.5)))
    ratio = ctx.int_list(1) if ctx.has_input(1) else [as_expr(0.5)]
    return None if ratio is None else ratio[0]


def dropout_shape(ctx: ShapeContext) -> None:
    training = ctx.int_list(2) if ctx.opset >= 12 and ctx.has_input(2) else [sympy.Integer(0)]
    ratio = _dropout_ratio(ctx)
    if training is not None and training[0] != 0 and ratio is not None and ratio != 0:
        ctx.unsupported("training-mode Dropout (random masking); tscomp compiles for inference")
    same_shape(ctx)
    if ctx.num_outputs > 1:
        ctx.set_output(1, np.bool_ if ctx.opset >= 10 else ctx.dtype(0), ctx.shape(0))


def dropout_ref(call: OpCall, x, ratio=None, training_mode=None):
    training = training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0])
    if training and (ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0):
        raise UnsupportedOperatorError(f"Dropout node {call.name!r}: training-mode Dropout (random "
                                       "masking) is not supported; tscomp compiles for inference")
    if call.num_outputs < 2:
        return x
    return x, np.ones(x.shape, dtype=np.bool_ if call.opset >= 10 else x.dtype)


# =========================================================================== views (index maps)
def reshape_view(ctx: ShapeContext, outs):
    """Reshape, Flatten, Squeeze, Unsqueeze: the output re-addresses the input row-major."""
    return [(views.reshape(outs[0]),)]


def transpose_view(ctx: ShapeContext, outs):
    return [(views.permute(_perm(ctx.attr, ctx.rank(0)), ctx.shape(0)),)]


def expand_view(ctx: ShapeContext, outs):
    rank, dims = len(outs[0]), ctx.shape(0)
    chain = (views.reshape((sympy.Integer(1),) * (rank - len(dims)) + dims),) if rank > len(dims) else ()
    return [chain + (views.expand(outs[0]),)]


def slice_view(ctx: ShapeContext, outs):
    n, starts, ends, axes, steps = _slice_params(ctx)
    rank = ctx.rank(0)
    if axes is None and n is not None:
        axes = [sympy.Integer(i) for i in range(n)]
    axes = _axes_list(ctx, axes, rank)
    if UNKNOWN in (starts, ends, axes, steps) or axes is None:
        return None
    steps = steps or [sympy.Integer(1)] * len(axes)
    return [(views.slice_view(outs[0], list(zip(axes, starts, ends, steps))),)]


def split_view(ctx: ShapeContext, outs):
    axis = _axis_attr(ctx, ctx.rank(0))
    chains, offset = [], sympy.Integer(0)
    for shape in outs:
        end = offset + shape[axis]
        chains.append((views.slice_view(shape, [(axis, offset, end, sympy.Integer(1))]),))
        offset = end
    return chains


# =========================================================================== the table
I, SH, OP = FusionClass.INJECTIVE, FusionClass.SHAPE, FusionClass.OPAQUE
MANY = 2**31

OPS = [
    OpDef("Shape", SH, shape_shape, shape_ref, data_rule=shape_data, arity=(1, 1)),
    OpDef("Size", SH, size_shape, size_ref, data_rule=size_data, arity=(1, 1)),
    OpDef("Reshape", I, reshape_shape, reshape_ref, data_rule=DATA_VIA_REFERENCE, arity=(1, 2),
          view_rule=reshape_view),
    OpDef("Transpose", I, transpose_shape, transpose_ref, data_rule=DATA_VIA_REFERENCE, arity=(1, 1),
          view_rule=transpose_view),
    OpDef("DepthToSpace", I, _space_shape(False), _space_ref(False), arity=(1, 1), view_rule=_space_view(False)),
    OpDef("SpaceToDepth", I, _space_shape(True), _space_ref(True), arity=(1, 1), view_rule=_space_view(True)),
    OpDef("Unsqueeze", I, unsqueeze_shape, unsqueeze_ref, data_rule=DATA_VIA_REFERENCE, arity=(1, 2),
          view_rule=reshape_view),
    OpDef("Squeeze", I, squeeze_shape, squeeze_ref, data_rule=DATA_VIA_REFERENCE, arity=(1, 2),
          view_rule=reshape_view),
    OpDef("Flatten", I, flatten_shape, flatten_ref, data_rule=DATA_VIA_REFERENCE, arity=(1, 1),
          view_rule=reshape_view),
    OpDef("Concat", I, concat_shape, concat_ref, data_rule=DATA_VIA_REFERENCE, arity=(1, MANY)),
    OpDef("Split", I, split_shape, split_ref, data_rule=DATA_VIA_REFERENCE, arity=(1, 2),
          view_rule=split_view),
    OpDef("Slice", I, slice_shape, slice_ref, data_rule=DATA_VIA_REFERENCE, arity=(1, 5),
          view_rule=slice_view),
    OpDef("Gather", I, gather_shape, gather_ref, data_rule=DATA_VIA_REFERENCE, arity=(2, 2)),
    OpDef("GatherElements", I, gather_elements_shape, gather_elements_ref, data_rule=DATA_VIA_REFERENCE,
          arity=(2, 2)),
    OpDef("GatherND", I, gather_nd_shape, gather_nd_ref, data_rule=DATA_VIA_REFERENCE, arity=(2, 2)),
    OpDef("Expand", I, expand_shape, expand_ref, data_rule=DATA_VIA_REFERENCE, arity=(2, 2),
          view_rule=expand_view),
    OpDef("Tile", I, tile_shape, tile_ref, data_rule=DATA_VIA_REFERENCE, arity=(2, 3)),
    OpDef("Range", OP, range_shape, range_ref, data_rule=range_data, arity=(3, 3)),
    OpDef("ConstantOfShape", OP, constant_of_shape_shape, constant_of_shape_ref,
          data_rule=constant_of_shape_data, arity=(1, 1)),
    OpDef("Constant", OP, constant_shape, constant_ref, arity=(0, 0)),
    OpDef("Pad", OP, pad_shape, pad_ref, arity=(1, 4)),
    OpDef("Trilu", OP, trilu_shape, trilu_ref, arity=(1, 2)),
    OpDef("CumSum", OP, same_shape, cumsum_ref, arity=(2, 2)),
    OpDef("CumProd", OP, same_shape, cumprod_ref, arity=(2, 2)),
    OpDef("ReverseSequence", OP, same_shape, reverse_sequence_ref, arity=(2, 2)),
    OpDef("NonZero", OP, nonzero_shape, nonzero_ref, data_rule=nonzero_data, arity=(1, 1)),
    OpDef("OneHot", OP, onehot_shape, onehot_ref, arity=(3, 3)),
    OpDef("ScatterND", OP, scatter_shape, scatter_nd_ref, arity=(3, 3)),
    OpDef("ScatterElements", OP, scatter_shape, scatter_elements_ref, arity=(3, 3)),
    OpDef("EyeLike", OP, eye_like_shape, eye_like_ref, arity=(1, 1)),
    OpDef("Dropout", FusionClass.ELEMENTWISE, dropout_shape, dropout_ref, arity=(1, 3)),
]

for _opdef in OPS:
    register(_opdef)
