"""GEMM, convolution, normalization, reduction, pooling and resampling operators.

These are the operators the fusion stage builds groups around (TSCompiler §4.2:
MatMul/Gemm/Conv/Einsum are *backbones*; Softmax, the normalizations and the
Reduce* family are *reductions*), plus the few that run as groups of their own
(Resize, the windowed pools).

Shape rules (TSCompiler §4.1, ``ComputeSymShape``) produce exact SymPy
expressions: a MatMul unifies its reduction dims (sibling inference), a Conv's
spatial output is ``floor((in + pad_begin + pad_end - dilation*(k-1) - 1)/stride) + 1``
(``floor(H/16)`` for a 16x16/16 patch embedding), a Resize by ``sizes`` computed
from ``Shape`` carries those expressions through. Where a compile-time-unknown
input (a runtime ``axes`` or ``scales`` tensor) decides a dim, the dim becomes a
data-dependent symbol bound at run time.

The numpy references compute in the input dtype (float32), as onnxruntime's CPU
kernels do, and are vectorized: Conv is im2col over a strided window view plus
one batched matmul (BLAS), pools reduce one strided slice per kernel tap, Resize is
separable (one gather-and-weight pass per resized axis).
"""
from __future__ import annotations

import functools
import operator
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx.defs
import sympy
from numpy.lib.stride_tricks import sliding_window_view

from tscomp.graph.ops.elementwise import onnx_dtype
from tscomp.graph.ops.registry import FusionClass, OpCall, OpDef, ShapeContext, register, same_shape
from tscomp.graph.symbols import Constraint, as_expr

BACKBONE = FusionClass.BACKBONE
REDUCTION = FusionClass.REDUCTION
OPAQUE = FusionClass.OPAQUE
MANY = 2**31

AttrSource = ShapeContext | OpCall


def _ints(src: AttrSource, key: str, default: Sequence[int] | None = None) -> list[int] | None:
    value = src.attr(key, None)
    if value is None:
        return None if default is None else list(default)
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _str(src: AttrSource, key: str, default: str) -> str:
    value = src.attr(key, default)
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_choice(ctx: ShapeContext, key: str, default: str, allowed: Sequence[str]) -> str:
    value = _str(ctx, key, default)
    if value not in allowed:
        ctx.unsupported(f"attribute {key}={value!r} is not supported (expected one of {', '.join(allowed)})")
    return value


def _vector_len(ctx: ShapeContext, i: int, what: str) -> sympy.Expr:
    shape = ctx.shape(i)
    if len(shape) != 1:
        ctx.fail(f"{what} (input {i}) must be 1-D, got rank {len(shape)}")
    return shape[0]


def _prod(values) -> int:
    return int(np.prod(list(values), dtype=np.int64))


# =========================================================================== MatMul, Gemm
def matmul_shape(ctx: ShapeContext) -> None:
    a, b = ctx.shape(0), ctx.shape(1)
    if not a or not b:
        ctx.fail("MatMul operands must have rank >= 1")
    a2 = (sympy.Integer(1),) + a if len(a) == 1 else a
    b2 = b + (sympy.Integer(1),) if len(b) == 1 else b
    ctx.unify(a2[-1], b2[-2], "MatMul reduction dim")
    batch = ctx.broadcast(a2[:-2], b2[:-2])
    rows = (a2[-2],) if len(a) > 1 else ()
    cols = (b2[-1],) if len(b) > 1 else ()
    ctx.set_output(0, ctx.dtype(0), batch + rows + cols)


def matmul_ref(call: OpCall, a, b):
    return np.matmul(a, b).astype(a.dtype, copy=False)


def gemm_shape(ctx: ShapeContext) -> None:
    a, b = ctx.shape(0), ctx.shape(1)
    if len(a) != 2 or len(b) != 2:
        ctx.fail(f"Gemm operands must be 2-D, got ranks {len(a)} and {len(b)}")
    m, k1 = a[::-1] if ctx.attr("transA", 0) else a
    k2, n = b[::-1] if ctx.attr("transB", 0) else b
    ctx.unify(k1, k2, "Gemm reduction dim")
    if ctx.has_input(2):
        c = ctx.shape(2)
        if len(c) > 2 or len(ctx.broadcast((m, n), c)) != 2:
            ctx.fail(f"C of rank {len(c)} does not broadcast to [M, N]")
    ctx.set_output(0, ctx.dtype(0), (m, n))


def gemm_ref(call: OpCall, a, b, c=None):
    a = a.T if call.attr("transA", 0) else a
    b = b.T if call.attr("transB", 0) else b
    y = np.matmul(a, b)
    alpha, beta = float(call.attr("alpha", 1.0)), float(call.attr("beta", 1.0))
    if alpha != 1.0:
        y = y * np.asarray(alpha, dtype=y.dtype)
    if c is not None and beta != 0.0:
        y = y + (c * np.asarray(beta, dtype=c.dtype) if beta != 1.0 else c)
    return y.astype(a.dtype, copy=False)


# =========================================================================== sliding windows
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class _AttrMapping:
    """The ``attr(key, default)`` view of an attribute mapping that :meth:`Window.read` reads."""
    attrs: Mapping

    def attr(self, key, default=None):
        return self.attrs.get(key, default)


@dataclass(frozen=True)
class Window:
    """The sliding-window attributes shared by Conv, ConvTranspose and the pools."""
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begin_1..begin_n, end_1..end_n
    auto_pad: str
    ceil_mode: bool

    @staticmethod
    def read(src: AttrSource, kernel: Sequence[int]) -> "Window":
        n = len(kernel)
        return Window(tuple(int(k) for k in kernel),
                      tuple(_ints(src, "strides", [1] * n)),
                      tuple(_ints(src, "dilations", [1] * n)),
                      tuple(_ints(src, "pads", [0] * 2 * n)),
                      _str(src, "auto_pad", "NOTSET") or "NOTSET",
                      bool(src.attr("ceil_mode", 0)))

    @staticmethod
    def from_attrs(attrs: Mapping, kernel: Sequence[int]) -> "Window":
        """:meth:`read` from a node's or an op's attribute mapping (a rewrite, a kernel generator)."""
        return Window.read(_AttrMapping(attrs), kernel)

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def validate(self, ctx: ShapeContext) -> None:
        n = self.rank
        if self.auto_pad not in AUTO_PADS:
            ctx.unsupported(f"attribute auto_pad={self.auto_pad!r} is not supported")
        for key, vals, want in (("strides", self.strides, n), ("dilations", self.dilations, n),
                                ("pads", self.pads, 2 * n)):
            if len(vals) != want:
                ctx.fail(f"attribute {key} has {len(vals)} values, expected {want}")
        if min(self.strides + self.dilations + self.kernel, default=1) < 1 or min(self.pads, default=0) < 0:
            ctx.fail(f"invalid window attributes kernel={list(self.kernel)} strides={list(self.strides)} "
                     f"dilations={list(self.dilations)} pads={list(self.pads)}")

    def span(self, i: int) -> int:
        """Extent of the dilated kernel along spatial axis ``i``."""
        return self.dilations[i] * (self.kernel[i] - 1) + 1

    def out_dim(self, i: int, size) -> sympy.Expr:
        """Output length along spatial axis ``i`` (symbolic in ``size``)."""
        size = sympy.sympify(size)
        stride = self.strides[i]
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            return sympy.ceiling(size / stride)
        begin, end = (0, 0) if self.auto_pad == "VALID" else (self.pads[i], self.pads[i + self.rank])
        room = size + begin + end - self.span(i)
        if not self.ceil_mode:
            return sympy.floor(room / stride) + 1
        ceil = sympy.ceiling(room / stride) + 1
        if end + stride <= self.span(i):
            return ceil  # the last window then always starts inside the input
        # otherwise it must start inside the input or the begin padding
        return sympy.Min(ceil, sympy.floor((size + begin - 1) / stride) + 1)

    def geometry(self, i: int, size: int) -> tuple[int, int, int, int]:
        """(pad_begin, pad_end, extra_end, out) used at a concrete input length: SAME pads
        resolved, and ``extra_end`` the padding ceil mode needs beyond the declared pads."""
        return tuple(int(x) for x in self._geometry(i, int(size), max, lambda t: t // 2))

    def geometry_expr(self, i: int, size) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
        """:meth:`geometry` as expressions of a symbolic length (what generated host code evaluates)."""
        return self._geometry(i, sympy.sympify(size), sympy.Max, lambda t: sympy.floor(t / 2))

    def _geometry(self, i: int, size, maximum, half) -> tuple:
        out = self.out_dim(i, size)
        out = int(out) if isinstance(size, int) else out
        stride, span = self.strides[i], self.span(i)
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = maximum((out - 1) * stride + span - size, 0)
            begin = half(total) if self.auto_pad == "SAME_UPPER" else total - half(total)
            end = total - begin
        elif self.auto_pad == "VALID":
            begin = end = 0
        else:
            begin, end = self.pads[i], self.pads[i + self.rank]
        extra = maximum(0, (out - 1) * stride + span - (size + begin + end))
        return begin, end, extra, out


def _window_view(padded: np.ndarray, win: Window, outs: Sequence[int]) -> np.ndarray:
    """The (N, C, *out, *kernel) view of windows over a padded (N, C, *spatial) array."""
    n = win.rank
    view = sliding_window_view(padded, [win.span(i) for i in range(n)], axis=tuple(range(2, 2 + n)))
    index = ((slice(None), slice(None))
             + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(outs, win.strides))
             + tuple(slice(None, None, d) for d in win.dilations))
    return view[index]


def _padded(x: np.ndarray, geometry, value) -> np.ndarray:
    widths = [(0, 0), (0, 0)] + [(b, e + extra) for b, e, extra, _ in geometry]
    return np.pad(x, widths, constant_values=value)


def _spatial_dims(ctx: ShapeContext, win: Window, spatial: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    return [ctx.symbols.canon(win.out_dim(i, d)) for i, d in enumerate(spatial)]


# =========================================================================== Conv
def _conv_operands(ctx: ShapeContext):
    """X and W shapes, the validated window and the group count shared by Conv and ConvTranspose."""
    x, w = ctx.shape(0), ctx.shape(1)
    if len(x) < 3 or len(w) != len(x):
        ctx.fail(f"{ctx.op_type} needs X of rank >= 3 and W of the same rank, got {len(x)} and {len(w)}")
    win = Window.read(ctx, _conv_kernel(ctx, w[2:]))
    win.validate(ctx)
    return x, w, win, int(ctx.attr("group", 1))


def conv_shape(ctx: ShapeContext, bias: bool = True) -> None:
    """``bias``: input 2 is the bias (ConvInteger's input 2 is a zero point instead)."""
    x, w, win, group = _conv_operands(ctx)
    ctx.unify(x[1], w[1] * group, f"Conv input channels (group={group})")
    if w[0].is_Integer and int(w[0]) % group:
        ctx.fail(f"{int(w[0])} output channels are not divisible by group={group}")
    if bias and ctx.has_input(2):
        ctx.unify(_vector_len(ctx, 2, "bias"), w[0], "Conv bias length")
    ctx.set_output(0, ctx.dtype(0), (x[0], w[0], *_spatial_dims(ctx, win, x[2:])))


def _conv_kernel(ctx: ShapeContext, w_spatial: Sequence[sympy.Expr]) -> list[int]:
    kernel = _ints(ctx, "kernel_shape")
    if kernel is not None:
        if len(kernel) != len(w_spatial):
            ctx.fail(f"kernel_shape {kernel} does not match the weight's {len(w_spatial)} spatial dims")
        for k, d in zip(kernel, w_spatial):
            ctx.unify(k, d, "kernel_shape vs weight shape")
        return kernel
    if not all(d.is_Integer for d in w_spatial):
        ctx.unsupported("the weight's spatial dims must be static")
    return [int(d) for d in w_spatial]


def conv_ref(call: OpCall, x, w, b=None):
    """im2col over a strided window view, then one batched matmul over the groups."""
    n, group = x.ndim - 2, int(call.attr("group", 1))
    win = Window.read(call, w.shape[2:])
    geometry = [win.geometry(i, x.shape[2 + i]) for i in range(n)]
    outs = [g[3] for g in geometry]
    batch, channels, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg, taps = channels // group, m // group, _prod(win.kernel)
    cols = _window_view(_padded(x, geometry, 0), win, outs)  # (N, C, *out, *k)
    cols = cols.reshape(batch, group, cg, *outs, *win.kernel)
    perm = (1, 0, *range(3, 3 + n), 2, *range(3 + n, 3 + 2 * n))
    cols = cols.transpose(perm).reshape(group, batch * _prod(outs), cg * taps)
    weights = w.reshape(group, mg, cg * taps).transpose(0, 2, 1)
    y = np.matmul(cols, weights)  # (group, N*out, mg)
    y = y.reshape(group, batch, *outs, mg).transpose(1, 0, n + 2, *range(2, n + 2)).reshape(batch, m, *outs)
    if b is not None:
        y = y + b.reshape(m, *[1] * n)
    return y.astype(x.dtype, copy=False)


# =========================================================================== ConvTranspose
def conv_transpose_shape(ctx: ShapeContext) -> None:
    x, w, win, group = _conv_operands(ctx)
    ctx.unify(x[1], w[0], "ConvTranspose input channels")
    channels = w[1] * group
    if ctx.has_input(2):
        ctx.unify(_vector_len(ctx, 2, "bias"), channels, "ConvTranspose bias length")
    spatial = [ctx.symbols.canon(d) for d in _transposed_dims(ctx, win, x[2:])]
    ctx.set_output(0, ctx.dtype(0), (x[0], channels, *spatial))


def _transposed_dims(src: AttrSource, win: Window, spatial) -> list:
    n = win.rank
    given = _ints(src, "output_shape")
    if given is not None:
        return given[-n:]
    if win.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return [d * s for d, s in zip(spatial, win.strides)]
    extra = _ints(src, "output_padding", [0] * n)
    return [win.strides[i] * (d - 1) + extra[i] + win.span(i) - win.pads[i] - win.pads[i + n]
            for i, d in enumerate(spatial)]


def _transposed_pad_begin(call: OpCall, win: Window, size: int, out: int, i: int) -> int:
    """Begin padding (cropped off the full transposed output) along spatial axis ``i``."""
    same = win.auto_pad in ("SAME_UPPER", "SAME_LOWER")
    if win.auto_pad == "VALID":
        return 0
    if not same and (_ints(call, "pads") is not None or _ints(call, "output_shape") is None):
        return win.pads[i]
    # pads derived from the requested output length (the spec's total_padding split)
    extra = _ints(call, "output_padding", [0] * win.rank)[i]
    total = win.strides[i] * (size - 1) + extra + win.span(i) - out
    return total // 2 if win.auto_pad == "SAME_UPPER" else total - total // 2


def conv_transpose_ref(call: OpCall, x, w, b=None):
    """One batched matmul gives every (input pixel, kernel tap) contribution; each kernel
    tap is then scatter-added into the output with a strided slice (col2im)."""
    n, group = x.ndim - 2, int(call.attr("group", 1))
    win = Window.read(call, w.shape[2:])
    batch, channels = x.shape[:2]
    cg, mg, taps = channels // group, w.shape[1], _prod(win.kernel)
    ins = x.shape[2:]
    outs = [int(d) for d in _transposed_dims(call, win, ins)]
    begins = [_transposed_pad_begin(call, win, ins[i], outs[i], i) for i in range(n)]
    xs = x.reshape(batch, group, cg, _prod(ins)).transpose(1, 0, 3, 2).reshape(group, -1, cg)
    cols = np.matmul(xs, w.reshape(group, cg, mg * taps))  # (group, N*in, mg*taps)
    cols = cols.reshape(group, batch, *ins, mg, taps)
    cols = cols.transpose(1, 0, n + 2, n + 3, *range(2, n + 2))  # (N, group, mg, taps, *in)
    full = [win.strides[i] * (ins[i] - 1) + win.span(i) for i in range(n)]
    offset = [max(0, -bg) for bg in begins]
    length = [max(full[i], begins[i] + outs[i]) + offset[i] for i in range(n)]
    buf = np.zeros((batch, group, mg, *length), dtype=np.result_type(x, w))
    for t, tap in enumerate(np.ndindex(*win.kernel)):
        where = tuple(slice(offset[i] + tap[i] * win.dilations[i],
                            offset[i] + tap[i] * win.dilations[i] + win.strides[i] * (ins[i] - 1) + 1,
                            win.strides[i]) for i in range(n))
        buf[(slice(None),) * 3 + where] += cols[:, :, :, t]
    crop = tuple(slice(offset[i] + begins[i], offset[i] + begins[i] + outs[i]) for i in range(n))
    y = buf[(slice(None),) * 3 + crop].reshape(batch, group * mg, *outs)
    if b is not None:
        y = y + b.reshape(-1, *[1] * n)
    return y.astype(x.dtype, copy=False)


# =========================================================================== pools
def pool_shape(ctx: ShapeContext) -> None:
    x = ctx.shape(0)
    kernel = _ints(ctx, "kernel_shape")
    if kernel is None:
        ctx.fail("attribute kernel_shape is required")
    if len(x) != len(kernel) + 2:
        ctx.fail(f"input of rank {len(x)} does not match kernel_shape {kernel}")
    win = Window.read(ctx, kernel)
    win.validate(ctx)
    if _ints(ctx, "storage_order", [0])[0] not in (0, 1):
        ctx.unsupported(f"attribute storage_order={ctx.attr('storage_order')} is not supported")
    out = (x[0], x[1], *_spatial_dims(ctx, win, x[2:]))
    ctx.set_output(0, ctx.dtype(0), out)
    if ctx.num_outputs > 1:
        ctx.set_output(1, np.int64, out)


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _tap_slices(padded: np.ndarray, win: Window, outs: Sequence[int]):
    """(tap index, (N, C, *out) strided view) for every kernel tap: pools reduce over taps
    one slice at a time instead of materializing all windows."""
    for t, tap in enumerate(np.ndindex(*win.kernel)):
        index = tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                      for k, d, o, s in zip(tap, win.dilations, outs, win.strides))
        yield t, padded[(slice(None), slice(None)) + index]


def _pool_setup(call: OpCall, x: np.ndarray):
    win = Window.read(call, _ints(call, "kernel_shape"))
    geometry = [win.geometry(i, x.shape[2 + i]) for i in range(win.rank)]
    return win, geometry, [g[3] for g in geometry]


def maxpool_ref(call: OpCall, x):
    win, geometry, outs = _pool_setup(call, x)
    padded = _padded(x, geometry, _lowest(x.dtype))
    if call.num_outputs < 2:
        return functools.reduce(np.maximum, (view for _, view in _tap_slices(padded, win, outs)))
    best, arg = None, None
    for t, view in _tap_slices(padded, win, outs):
        if best is None:
            best, arg = view.copy(), np.zeros(view.shape, dtype=np.int64)
            continue
        better = view > best  # strict: the first maximal tap wins, as in onnxruntime
        best = np.where(better, view, best)
        arg = np.where(better, t, arg)
    return best, _maxpool_indices(call, win, geometry, x.shape, arg)


def _maxpool_indices(call: OpCall, win: Window, geometry, shape, arg: np.ndarray) -> np.ndarray:
    """Flat indices into the unpadded input (row-major, or column-major over the spatial
    axes for storage_order=1), as MaxPool's second output defines them."""
    n, spatial = win.rank, shape[2:]
    taps = np.unravel_index(arg, win.kernel)
    coords = [np.arange(geometry[i][3]).reshape([-1 if a == i else 1 for a in range(n)]) * win.strides[i]
              + taps[i] * win.dilations[i] - geometry[i][0] for i in range(n)]
    order = range(n - 1, -1, -1) if call.attr("storage_order", 0) else range(n)
    flat = np.zeros(arg.shape, dtype=np.int64)
    for i in order:
        flat = flat * spatial[i] + coords[i]
    base = np.arange(shape[0] * shape[1], dtype=np.int64).reshape(shape[0], shape[1], *[1] * n)
    return base * _prod(spatial) + flat


def avgpool_ref(call: OpCall, x):
    win, geometry, outs = _pool_setup(call, x)
    total = sum(view for _, view in _tap_slices(_padded(x, geometry, 0), win, outs))
    # the divisor: taps on the input, plus (count_include_pad) taps on the declared padding
    counted = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
    if call.attr("count_include_pad", 0):
        counted = np.pad(counted, [(0, 0), (0, 0)] + [(b, e) for b, e, _, _ in geometry], constant_values=1)
        geometry = [(0, 0, extra, out) for _, _, extra, out in geometry]
    count = sum(view for _, view in _tap_slices(_padded(counted, geometry, 0), win, outs))
    return (total / count).astype(x.dtype, copy=False)


def global_pool_shape(ctx: ShapeContext) -> None:
    x = ctx.shape(0)
    if len(x) < 3:
        ctx.fail(f"input must have rank >= 3, got {len(x)}")
    ctx.set_output(0, ctx.dtype(0), (x[0], x[1]) + (1,) * (len(x) - 2))


def _global(fn):
    def ref(call: OpCall, x):
        return fn(x, axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype, copy=False)
    return ref


# =========================================================================== Softmax family
def softmax_shape(ctx: ShapeContext) -> None:
    ctx.normalize_axis(int(ctx.attr("axis", _softmax_default_axis(ctx.opset))), ctx.rank(0))
    same_shape(ctx)


def _softmax_default_axis(opset: int) -> int:
    return -1 if opset >= 13 else 1


def _softmax_axes(call: OpCall, rank: int) -> tuple[int, ...]:
    """Before opset 13 the input is coerced to 2-D at ``axis``: the normalization runs over
    every axis from ``axis`` on; from 13 on it runs over ``axis`` alone."""
    axis = int(call.attr("axis", _softmax_default_axis(call.opset))) % max(rank, 1)
    return tuple(range(axis, rank)) if call.opset < 13 else (axis,)


def _shifted(call: OpCall, x):
    axes = _softmax_axes(call, x.ndim)
    shifted = x - x.max(axis=axes, keepdims=True)
    return shifted, axes


def softmax_ref(call: OpCall, x):
    shifted, axes = _shifted(call, x)
    e = np.exp(shifted)
    return (e / e.sum(axis=axes, keepdims=True)).astype(x.dtype, copy=False)


def log_softmax_ref(call: OpCall, x):
    shifted, axes = _shifted(call, x)
    return (shifted - np.log(np.exp(shifted).sum(axis=axes, keepdims=True))).astype(x.dtype, copy=False)


# =========================================================================== normalization
def layer_norm_shape(ctx: ShapeContext) -> None:
    x = ctx.shape(0)
    axis = ctx.normalize_axis(int(ctx.attr("axis", -1)), len(x))
    stash = onnx_dtype(ctx, ctx.attr("stash_type", 1))
    for i, what in ((1, "Scale"), (2, "B")):
        if ctx.has_input(i):
            if len(ctx.broadcast(x[axis:], ctx.shape(i))) != len(x) - axis:
                ctx.fail(f"{what} does not broadcast to the normalized shape")
    ctx.set_output(0, ctx.dtype(0), x)
    stats = x[:axis] + (1,) * (len(x) - axis)
    for i in range(1, ctx.num_outputs):
        ctx.set_output(i, stash, stats)


def _layer_norm_rows(ctx: ShapeContext) -> list[int]:
    rank = ctx.rank(0)
    return list(range(ctx.normalize_axis(int(ctx.attr("axis", -1)), rank), rank))


def _softmax_rows(ctx: ShapeContext) -> list[int]:
    return list(_softmax_axes(ctx.call, ctx.rank(0)))


def _spatial_rows(ctx: ShapeContext) -> list[int]:
    return list(range(2, ctx.rank(0)))


def layer_norm_ref(call: OpCall, x, scale, bias=None):
    """ONNX's function body: statistics in ``stash_type`` (float32 by default), then the
    affine transform in the input type."""
    axis = int(call.attr("axis", -1)) % x.ndim
    stash = onnx_dtype(call, call.attr("stash_type", 1))
    eps = float(call.attr("epsilon", 1e-5))
    axes = tuple(range(axis, x.ndim))
    xs = x.astype(stash, copy=False)
    mean = xs.mean(axis=axes, keepdims=True)
    centered = xs - mean
    inv_std = 1 / np.sqrt((centered * centered).mean(axis=axes, keepdims=True) + stash.type(eps))
    y = (centered * inv_std).astype(x.dtype, copy=False) * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype, copy=False), mean, inv_std


def batch_norm_shape(ctx: ShapeContext) -> None:
    """Inference BN; training mode (batch statistics) only of a compile-time constant, which
    constant folding then computes once: weight standardization (BiT's convolutions normalize
    their own weights with ``F.batch_norm(w, training=True)``, exported as a training-mode BN)."""
    training = bool(ctx.attr("training_mode", 0))
    if training and ctx.const(0) is None:
        ctx.unsupported("training mode (statistics of the batch itself) on a run-time tensor is not "
                        "supported; export the model in eval mode")
    if ctx.num_outputs > 1 and not training:
        ctx.unsupported(f"{ctx.num_outputs} outputs: the running/saved statistics outputs exist only in "
                        "training mode")
    if ctx.num_outputs > 3:
        ctx.unsupported(f"{ctx.num_outputs} outputs (opset < 14 saved statistics) are not supported")
    if not ctx.attr("spatial", 1):
        ctx.unsupported("attribute spatial=0 (per-activation statistics) is not supported")
    x = ctx.shape(0)
    if len(x) < 2:
        ctx.fail(f"input must have rank >= 2, got {len(x)}")
    for i, what in ((1, "scale"), (2, "B"), (3, "mean"), (4, "var")):
        ctx.unify(_vector_len(ctx, i, what), x[1], f"{what} length vs channels")
    same_shape(ctx)
    for k in range(1, ctx.num_outputs):       # training mode: the running mean and variance
        ctx.set_output(k, ctx.dtype(3), [x[1]])


def _per_channel(v: np.ndarray, rank: int) -> np.ndarray:
    return v.reshape(-1, *[1] * (rank - 2))


def batch_norm_ref(call: OpCall, x, scale, bias, mean, var):
    eps = np.asarray(float(call.attr("epsilon", 1e-5)), dtype=var.dtype)
    if call.attr("training_mode", 0):
        return _batch_norm_training(call, x, scale, bias, mean, var, eps)
    factor = scale / np.sqrt(var + eps)
    y = (x - _per_channel(mean, x.ndim)) * _per_channel(factor, x.ndim) + _per_channel(bias, x.ndim)
    return y.astype(x.dtype, copy=False)


def _batch_norm_training(call: OpCall, x, scale, bias, mean, var, eps):
    """ONNX's training mode: normalize by the statistics of ``x`` itself over every axis but the
    channels (population variance); the running statistics are the inputs' blended with them by
    ``momentum``."""
    axes = (0,) + tuple(range(2, x.ndim))
    cur_mean = x.mean(axis=axes, dtype=np.float64)
    cur_var = ((x - _per_channel(cur_mean, x.ndim)) ** 2).mean(axis=axes)
    y = (x - _per_channel(cur_mean, x.ndim)) / np.sqrt(_per_channel(cur_var, x.ndim) + eps) \
        * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)
    m = float(call.attr("momentum", 0.9))
    outs = (y.astype(x.dtype), (mean * m + cur_mean * (1 - m)).astype(mean.dtype),
            (var * m + cur_var * (1 - m)).astype(var.dtype))
    return outs[:call.num_outputs] if call.num_outputs > 1 else outs[0]


def instance_norm_shape(ctx: ShapeContext) -> None:
    x = ctx.shape(0)
    if len(x) < 3:
        ctx.fail(f"input must have rank >= 3, got {len(x)}")
    for i, what in ((1, "scale"), (2, "B")):
        ctx.unify(_vector_len(ctx, i, what), x[1], f"{what} length vs channels")
    same_shape(ctx)


def instance_norm_ref(call: OpCall, x, scale, bias):
    eps = np.asarray(float(call.attr("epsilon", 1e-5)), dtype=x.dtype)
    axes = tuple(range(2, x.ndim))
    centered = x - x.mean(axis=axes, keepdims=True)
    inv_std = 1 / np.sqrt((centered * centered).mean(axis=axes, keepdims=True) + eps)
    y = centered * inv_std * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)
    return y.astype(x.dtype, copy=False)


# =========================================================================== Reduce*
def _identity_of(ufunc, dtype: np.dtype):
    """The value an empty max/min reduction yields (ONNX: -inf/+inf, or the type's limits)."""
    if dtype == np.bool_:
        return ufunc is np.minimum
    if dtype.kind == "f":
        return -np.inf if ufunc is np.maximum else np.inf
    info = np.iinfo(dtype)
    return info.min if ufunc is np.maximum else info.max


def _extreme(ufunc):
    def fn(x, axes):
        return ufunc.reduce(x, axis=axes, keepdims=True, initial=_identity_of(ufunc, x.dtype))
    return fn


def _log_sum_exp(x, axes):
    top = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    top = np.where(np.isfinite(top), top, 0).astype(x.dtype)
    return np.log(np.exp(x - top).sum(axis=axes, keepdims=True)) + top


@dataclass(frozen=True)
class ReductionC:
    """A reduction as C, for the kernels that generate it (the row kernel, the index family's
    any-axes kernel): the accumulator's initial value, the update of accumulator ``{a}`` with
    element ``{x}``, the OpenMP reduction operator that combines partial accumulators, and the
    result from the accumulator (``{n}`` the reduced count, ``{t}`` the accumulator's C type,
    ``{f}`` libm's suffix for that type: ``f`` for float)."""
    init: str
    update: str
    omp: str
    result: str = "{a}"


@dataclass(frozen=True)
class Reduction:
    fn: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]  # (x, axes) -> result with keepdims
    axes_input_since: int  # the opset from which ``axes`` is an input instead of an attribute
    symbolic: Callable | None = None  # binary SymPy function for shape-holding data
    #: the sum-like reductions' C form; None for the extremes and LogSumExp, which each generator
    #: writes itself (NaN propagation, the shift by the maximum)
    c: ReductionC | None = None


_SUM = ReductionC("0", "{a} += {x};", "+")
REDUCTIONS: dict[str, Reduction] = {
    "ReduceSum": Reduction(lambda x, a: np.sum(x, axis=a, keepdims=True), 13, operator.add, _SUM),
    "ReduceMean": Reduction(lambda x, a: np.mean(x, axis=a, keepdims=True), 18,
                            c=ReductionC("0", "{a} += {x};", "+", "{a} / ({t})({n})")),
    "ReduceMax": Reduction(_extreme(np.maximum), 18, sympy.Max),
    "ReduceMin": Reduction(_extreme(np.minimum), 18, sympy.Min),
    "ReduceProd": Reduction(lambda x, a: np.prod(x, axis=a, keepdims=True), 18, operator.mul,
                            ReductionC("1", "{a} *= {x};", "*")),
    "ReduceL1": Reduction(lambda x, a: np.sum(np.abs(x), axis=a, keepdims=True), 18,
                          c=ReductionC("0", "{a} += {x} < 0 ? -{x} : {x};", "+")),
    "ReduceL2": Reduction(lambda x, a: np.sqrt(np.sum(x * x, axis=a, keepdims=True)), 18,
                          c=ReductionC("0", "{a} += {x} * {x};", "+", "sqrt{f}({a})")),
    "ReduceSumSquare": Reduction(lambda x, a: np.sum(x * x, axis=a, keepdims=True), 18,
                                 c=ReductionC("0", "{a} += {x} * {x};", "+")),
    "ReduceLogSum": Reduction(lambda x, a: np.log(np.sum(x, axis=a, keepdims=True)), 18,
                              c=ReductionC("0", "{a} += {x};", "+", "log{f}({a})")),
    "ReduceLogSumExp": Reduction(_log_sum_exp, 18),
}


def _reduce_axes(ctx: ShapeContext, rank: int) -> list[int] | None:
    """The reduced axes (sorted), or None when a runtime ``axes`` input decides them."""
    if ctx.opset >= REDUCTIONS[ctx.op_type].axes_input_since:
        if not ctx.has_input(1) or tuple(ctx.shape(1)) == (0,):
            axes = []
        else:
            values = ctx.int_list(1)
            if values is None or not all(v.is_Integer for v in values):
                return None
            axes = [int(v) for v in values]
    else:
        axes = _ints(ctx, "axes", [])
    if not axes:
        return [] if ctx.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({ctx.normalize_axis(a, rank) for a in axes})


def reduce_shape(ctx: ShapeContext) -> None:
    x = ctx.shape(0)
    keep = bool(ctx.attr("keepdims", 1))
    axes = _reduce_axes(ctx, len(x))
    if axes is None:
        ctx.set_output(0, ctx.dtype(0), _unknown_reduction(ctx, x, keep))
        return
    out = [1 if i in axes else d for i, d in enumerate(x)] if keep else \
        [d for i, d in enumerate(x) if i not in axes]
    ctx.set_output(0, ctx.dtype(0), out)


def _unknown_reduction(ctx: ShapeContext, x, keep: bool) -> list:
    """Output dims when the axes are only known at run time: each may or may not be reduced."""
    if keep:
        return [d if d == 1 else ctx.data_dependent("reduced") for d in x]
    count = ctx.shape(1)[0] if ctx.rank(1) == 1 else None
    if count is None or not count.is_Integer:
        ctx.unsupported("keepdims=0 with an axes input whose length is unknown at compile time")
    return [ctx.data_dependent("reduced") for _ in range(len(x) - int(count))]


def _reduce_axes_now(call: OpCall, x: np.ndarray, axes_input) -> tuple[int, ...]:
    if call.opset >= REDUCTIONS[call.op_type].axes_input_since:
        axes = [] if axes_input is None else [int(a) for a in np.asarray(axes_input).reshape(-1)]
    else:
        axes = _ints(call, "axes", [])
    if not axes:
        return () if call.attr("noop_with_empty_axes", 0) else tuple(range(x.ndim))
    return tuple(sorted({a % x.ndim for a in axes}))


def _reduce_ref(spec: Reduction):
    def ref(call: OpCall, x, axes_input=None):
        axes = _reduce_axes_now(call, x, axes_input)
        if not axes:
            return x
        with np.errstate(divide="ignore", invalid="ignore"):  # empty sets: log(0) = -inf, mean = nan
            y = spec.fn(x, axes)
        if not call.attr("keepdims", 1):
            y = y.reshape([d for i, d in enumerate(x.shape) if i not in axes])
        return np.asarray(y).astype(x.dtype, copy=False)
    return ref


def _reduce_data(spec: Reduction):
    """Reduce shape-holding data (``Shape -> ReduceProd``) as SymPy expressions."""
    def rule(ctx: ShapeContext):
        vals = ctx.values(0)
        axes = _reduce_axes(ctx, vals.ndim)
        if axes is None or any(vals.shape[a] == 0 for a in axes):
            return None
        if not axes:
            return [vals]
        kept = [a for a in range(vals.ndim) if a not in axes]
        rows = vals.transpose(kept + axes).reshape(-1, _prod(vals.shape[a] for a in axes))
        out = np.empty(len(rows), dtype=object)
        out[:] = [ctx.symbols.canon(functools.reduce(spec.symbolic, row)) for row in rows]
        return [out.reshape([int(d) for d in ctx.out_shapes[0]])]
    return rule


# =========================================================================== ArgMax/ArgMin
def arg_shape(ctx: ShapeContext) -> None:
    x = ctx.shape(0)
    axis = ctx.normalize_axis(int(ctx.attr("axis", 0)), len(x))
    out = [1 if i == axis else d for i, d in enumerate(x)] if ctx.attr("keepdims", 1) else \
        [d for i, d in enumerate(x) if i != axis]
    ctx.set_output(0, np.int64, out)


def _arg_ref(fn):
    def ref(call: OpCall, x):
        axis = int(call.attr("axis", 0)) % x.ndim
        if call.attr("select_last_index", 0):
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis=axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        if call.attr("keepdims", 1):
            idx = np.expand_dims(idx, axis)
        return idx.astype(np.int64)
    return ref


# =========================================================================== TopK
def topk_shape(ctx: ShapeContext) -> None:
    """Values and int64 indices: the input's shape with K on the axis (K a constant or a shape
    expression; K <= the axis extent is checked per binding where ranges do not decide it)."""
    x = ctx.shape(0)
    axis = ctx.normalize_axis(int(ctx.attr("axis", -1)), len(x))
    if ctx.opset < 10:
        k = as_expr(int(ctx.attr("k")))
    else:
        ks = ctx.int_list(1)
        if ks is not None and len(ks) != 1:
            ctx.fail(f"K (input 1) must hold one value, got {len(ks)}")
        k = ks[0] if ks is not None else ctx.data_dependent("topk")     # K from tensor data
    if ctx.symbols.decide("<", k, 0):
        ctx.fail(f"K = {k} is negative")
    fits = ctx.symbols.decide("<=", k, x[axis])
    if fits is False:
        ctx.fail(f"K = {k} exceeds the axis extent {x[axis]}")
    if fits is None:
        ctx.symbols.constraints.append(Constraint(k, x[axis], f"{ctx.where()}: K at most the axis extent", "<="))
    out = [k if i == axis else d for i, d in enumerate(x)]
    ctx.set_output(0, ctx.dtype(0), out)
    ctx.set_output(1, np.int64, out)


def topk_ref(call: OpCall, x, k=None):
    """The K largest (smallest) along the axis, sorted, ties in index order (stable), NaN after
    every number."""
    axis = int(call.attr("axis", -1)) % x.ndim
    k = int(call.attr("k")) if k is None else int(np.asarray(k).reshape(-1)[0])
    key = x
    if call.attr("largest", 1):      # a key that reverses the order without overflow (-x of INT_MIN)
        key = -x if x.dtype.kind == "f" else np.iinfo(x.dtype).max - x if x.dtype.kind == "u" else ~x
    order = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


# =========================================================================== LpNormalization, LRN, Hardmax, Det
def lp_normalization_ref(call: OpCall, x):
    """x over its L1 or L2 norm along ``axis``; 0 where the norm is 0 (onnxruntime's and the
    conformance cases' value)."""
    axis, p = int(call.attr("axis", -1)), int(call.attr("p", 2))
    norm = np.abs(x).sum(axis=axis, keepdims=True) if p == 1 else np.sqrt((x * x).sum(axis=axis, keepdims=True))
    return np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(x.dtype)


def lrn_ref(call: OpCall, x):
    """Local response normalization across channels: x / (bias + alpha / size * sum of squares over
    the ``size`` channels around each one) ** beta."""
    size = int(call.attr("size"))
    alpha, beta, bias = (float(call.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    sq = np.square(x.astype(np.float64))
    padded = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    window = sum(padded[:, k:k + x.shape[1]] for k in range(size))
    return (x / (bias + alpha / size * window) ** beta).astype(x.dtype)


def hardmax_ref(call: OpCall, x):
    """1 at the first largest element along ``axis`` (before opset 13: of the input flattened to 2-d
    at ``axis``), 0 elsewhere."""
    if call.opset < 13:
        axis = int(call.attr("axis", 1)) % x.ndim
        flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
        return hardmax_2d(flat).reshape(x.shape)
    axis = int(call.attr("axis", -1)) % x.ndim
    moved = np.moveaxis(x, axis, -1)
    return np.moveaxis(hardmax_2d(moved.reshape(-1, moved.shape[-1])).reshape(moved.shape), -1, axis)


def hardmax_2d(x):
    out = np.zeros_like(x)
    if x.shape[-1]:
        out[np.arange(x.shape[0]), np.argmax(x, axis=-1)] = 1
    return out


def det_shape(ctx: ShapeContext) -> None:
    x = ctx.shape(0)
    if len(x) < 2:
        ctx.fail(f"Det needs [..., M, M] matrices, got rank {len(x)}")
    ctx.unify(x[-1], x[-2], "Det's matrices are square")
    ctx.set_output(0, ctx.dtype(0), list(x[:-2]))


# =========================================================================== Einsum
@dataclass(frozen=True)
class EinsumSpec:
    inputs: tuple[str, ...]  # one term per operand; "." stands for the whole ellipsis
    output: str | None       # None: implicit output


def parse_einsum(equation: str) -> EinsumSpec:
    eq = re.sub(r"\s+", "", equation).replace("...", ".")
    lhs, arrow, rhs = eq.partition("->")
    return EinsumSpec(tuple(lhs.split(",")), rhs if arrow else None)


def _implicit_output(spec: EinsumSpec) -> str:
    letters = "".join(spec.inputs).replace(".", "")
    once = sorted(c for c in set(letters) if letters.count(c) == 1)
    return ("." if any("." in t for t in spec.inputs) else "") + "".join(once)


def einsum_shape(ctx: ShapeContext) -> None:
    spec = parse_einsum(_str(ctx, "equation", ""))
    if len(spec.inputs) != len(ctx.inputs):
        ctx.fail(f"equation {spec} names {len(spec.inputs)} operands, the node has {len(ctx.inputs)}")
    dims: dict[str, sympy.Expr] = {}
    ellipses = []
    for i, term in enumerate(spec.inputs):
        shape = ctx.shape(i)
        letters = term.replace(".", "")
        if not re.fullmatch(r"[A-Za-z]*", letters) or term.count(".") > 1:
            ctx.unsupported(f"attribute equation={_str(ctx, 'equation', '')!r} is not supported")
        n_ell = len(shape) - len(letters)
        if n_ell < 0 or (n_ell and "." not in term):
            ctx.fail(f"operand {i} of rank {len(shape)} does not match term {term!r}")
        split = term.find(".") if "." in term else len(term)
        ellipses.append(shape[split:split + n_ell])
        for label, d in zip(letters, shape[:split] + shape[split + n_ell:]):
            dims[label] = d if label not in dims else ctx.broadcast((dims[label],), (d,))[0]
    ell = ctx.broadcast(*ellipses)
    output = spec.output if spec.output is not None else _implicit_output(spec)
    out = []
    for label in output:
        if label == ".":
            out.extend(ell)
        elif label in dims:
            out.append(dims[label])
        else:
            ctx.fail(f"output label {label!r} appears in no input")
    ctx.set_output(0, ctx.dtype(0), out)


def einsum_ref(call: OpCall, *operands):
    equation = re.sub(r"\s+", "", _str(call, "equation", ""))
    spec = parse_einsum(equation)
    fast = _einsum_as_matmul(spec, operands) if len(operands) == 2 else None
    y = fast if fast is not None else np.einsum(equation, *operands, optimize=len(operands) > 2)
    return np.asarray(y).astype(operands[0].dtype, copy=False)


def _einsum_as_matmul(spec: EinsumSpec, operands) -> np.ndarray | None:
    """A two-operand contraction (``bhid,bhjd->bhij``) as one batched matmul, so it runs on
    BLAS; None when the form does not fit (ellipsis, diagonals, sums, broadcasting)."""
    (ta, tb), out = spec.inputs, spec.output
    a, b = operands
    if out is None or "." in ta + tb + out or len(set(ta)) < len(ta) or len(set(tb)) < len(tb):
        return None
    sizes: dict[str, int] = {}
    for term, arr in ((ta, a), (tb, b)):
        for label, n in zip(term, arr.shape):
            if sizes.setdefault(label, n) != n:
                return None
    batch = [c for c in out if c in ta and c in tb]
    contract = [c for c in ta if c in tb and c not in out]
    free_a, free_b = [c for c in ta if c not in tb], [c for c in tb if c not in ta]
    if any(c not in out for c in free_a + free_b) or len(batch) + len(free_a) + len(free_b) != len(out):
        return None

    def arrange(arr, term, groups):
        order = [c for g in groups for c in g]
        return arr.transpose([term.index(c) for c in order]).reshape(
            [_prod(sizes[c] for c in g) for g in groups])

    y = np.matmul(arrange(a, ta, (batch, free_a, contract)), arrange(b, tb, (batch, contract, free_b)))
    done = batch + free_a + free_b
    return y.reshape([sizes[c] for c in done]).transpose([done.index(c) for c in out])


# =========================================================================== Resize
RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_half_pixel_for_nn", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _scale_ratio(scale: float) -> sympy.Rational:
    """A float32 scale as the simple fraction it was meant to be (0.7f -> 7/10) when that
    fraction rounds to it, else its exact value; output dims are ``floor(in * ratio)``.
    This matches onnxruntime, whose float32 product 0.7f * 10 rounds to 7 (the exact value
    of 0.7f times 10 is just below 7)."""
    exact = Fraction(float(scale))
    nice = exact.limit_denominator(1000)
    chosen = nice if np.float32(float(nice)) == np.float32(scale) else exact
    return sympy.Rational(chosen.numerator, chosen.denominator)


def _resize_axes(src: AttrSource, rank: int) -> list[int]:
    axes = _ints(src, "axes")
    return list(range(rank)) if axes is None else [a % rank for a in axes]


def _present(facts_or_array) -> bool:
    return facts_or_array is not None and int(np.prod(np.shape(facts_or_array))) > 0


def _resized_by_sizes(policy: str, dims: Sequence, sizes: Sequence) -> list:
    """New lengths of the resized axes from ``sizes`` under keep_aspect_ratio_policy."""
    if policy == "stretch":
        return list(sizes)
    ratios = [sympy.sympify(s) / d for s, d in zip(sizes, dims)]
    scale = (sympy.Min if policy == "not_larger" else sympy.Max)(*ratios)
    return [sympy.floor(scale * d + sympy.Rational(1, 2)) for d in dims]


def resize_shape(ctx: ShapeContext) -> None:
    mode = _check_choice(ctx, "mode", "nearest", RESIZE_MODES)
    coords = _check_choice(ctx, "coordinate_transformation_mode", "half_pixel", COORDINATE_MODES)
    _check_choice(ctx, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    policy = _check_choice(ctx, "keep_aspect_ratio_policy", "stretch", ASPECT_POLICIES)
    if ctx.attr("antialias", 0) and mode == "nearest":
        ctx.unsupported("attribute antialias=1 with mode='nearest' is not defined")
    x = ctx.shape(0)
    axes = _resize_axes(ctx, len(x))
    dims = [x[a] for a in axes]
    with_sizes = ctx.has_input(3) and tuple(ctx.shape(3)) != (0,)
    if with_sizes:
        sizes = ctx.int_list(3)
        new = None if sizes is None else _resized_by_sizes(policy, dims, sizes)
    elif ctx.has_input(2) and tuple(ctx.shape(2)) != (0,):
        if coords == "tf_crop_and_resize":
            ctx.unsupported("tf_crop_and_resize with scales (the spec sizes the output by the roi, "
                            "onnxruntime does not); give sizes instead")
        scales = ctx.const(2)
        new = None if scales is None else [sympy.floor(d * _scale_ratio(s))
                                           for d, s in zip(dims, scales.reshape(-1))]
    else:
        ctx.fail("one of scales and sizes must be given")
    if new is not None and len(new) != len(axes):
        ctx.fail(f"{'sizes' if with_sizes else 'scales'} has {len(new)} values for {len(axes)} axes")
    if new is None:
        new = [ctx.data_dependent("resized") for _ in axes]
    out = list(x)
    for a, d in zip(axes, new):
        out[a] = d
    ctx.set_output(0, ctx.dtype(0), out)


def _resize_plan(call: OpCall, shape, scales, sizes) -> list[tuple[int, int, float]]:
    """(axis, output length, scale) per resized axis, computed exactly as the shape rule does."""
    axes = _resize_axes(call, len(shape))
    dims = [shape[a] for a in axes]
    if _present(sizes):
        policy = _str(call, "keep_aspect_ratio_policy", "stretch")
        outs = [int(v) for v in _resized_by_sizes(policy, dims, [int(s) for s in sizes.reshape(-1)])]
        if policy == "stretch":
            factors = [o / d for o, d in zip(outs, dims)]
        else:
            ratios = [int(s) / d for s, d in zip(sizes.reshape(-1), dims)]
            factors = [(min if policy == "not_larger" else max)(ratios)] * len(dims)
    else:
        factors = [float(s) for s in scales.reshape(-1)]
        outs = [int(sympy.floor(d * _scale_ratio(s))) for d, s in zip(dims, factors)]
    return list(zip(axes, outs, factors))


def resize_ref(call: OpCall, x, roi=None, scales=None, sizes=None):
    rank = x.ndim
    plan = _resize_plan(call, x.shape, scales, sizes)
    rois = _roi_per_axis(call, rank, roi)
    y = x.astype(np.float64)
    for axis, out, scale in plan:
        if out == y.shape[axis] and scale == 1.0 and rois[axis] == (0.0, 1.0):
            continue
        y = _resize_axis(call, y, axis, out, scale, rois[axis])
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return y.astype(x.dtype)


def _roi_per_axis(call: OpCall, rank: int, roi) -> list[tuple[float, float]]:
    full = [(0.0, 1.0)] * rank
    if _str(call, "coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize" or not _present(roi):
        return full
    axes = _resize_axes(call, rank)
    vals = [float(v) for v in np.asarray(roi).reshape(-1)]
    for i, a in enumerate(axes):
        full[a] = (vals[i], vals[i + len(axes)])
    return full


def _source_coords(call: OpCall, out: int, scale: float, size: int, roi) -> tuple[np.ndarray, np.ndarray | None]:
    """Input coordinate of each output index under coordinate_transformation_mode, and for
    tf_crop_and_resize the mask of outputs that fall outside the input (extrapolated).

    ``length_resized`` in the spec's formulas is the output length ``out`` (the integer,
    as onnxruntime uses it; onnx's Python reference uses the fractional ``scale * size``,
    which differs only when scales do not divide the input evenly)."""
    y = np.arange(out, dtype=np.float64)
    mode = _str(call, "coordinate_transformation_mode", "half_pixel")
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out > 1:
            x = start * (size - 1) + y * (end - start) * (size - 1) / (out - 1)
        else:
            x = np.full(out, 0.5 * (start + end) * (size - 1))
        return x, (x < 0) | (x > size - 1)
    return COORDINATE_TRANSFORMS[mode](y, scale, size, out), None


COORDINATE_TRANSFORMS: dict[str, Callable] = {
    "half_pixel": lambda y, s, n, out: (y + 0.5) / s - 0.5,
    "half_pixel_symmetric": lambda y, s, n, out: n / 2 * (1 - out / (s * n)) + (y + 0.5) / s - 0.5,
    "pytorch_half_pixel": lambda y, s, n, out: (y + 0.5) / s - 0.5 if out > 1 else np.zeros(out),
    "align_corners": lambda y, s, n, out: y * (n - 1) / (out - 1) if out > 1 else np.zeros(out),
    "asymmetric": lambda y, s, n, out: y / s,
    "tf_half_pixel_for_nn": lambda y, s, n, out: (y + 0.5) / s,
}

NEAREST_ROUNDING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _linear_kernel(t: np.ndarray, a: float) -> np.ndarray:
    return np.clip(1 - t, 0, 1)


def _cubic_kernel(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient ``a`` (``cubic_coeff_a``)."""
    inner = ((a + 2) * t - (a + 3)) * t * t + 1
    outer = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, inner, np.where(t < 2, outer, 0.0))


#: mode -> (kernel radius, kernel function)
INTERPOLATION_KERNELS = {"linear": (1, _linear_kernel), "cubic": (2, _cubic_kernel)}


def _taps(call: OpCall, x: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Input indices (out, n) and weights (out, n) sampling coordinates ``x``."""
    mode = _str(call, "mode", "nearest")
    if mode == "nearest":
        rounding = NEAREST_ROUNDING[_str(call, "nearest_mode", "round_prefer_floor")]
        return rounding(x).astype(np.int64)[:, None], np.ones((len(x), 1))
    radius, kernel = INTERPOLATION_KERNELS[mode]
    antialias = bool(call.attr("antialias", 0))
    stretch = min(scale, 1.0) if antialias else 1.0  # widen the kernel when downsampling
    start = int(np.floor(-radius / stretch)) + 1
    offsets = np.arange(start, 1 - start + 1)
    base = np.ceil(x) - 1  # the left neighbour; x - base lies in (0, 1]
    weights = kernel(np.abs((offsets[None, :] - (x - base)[:, None]) * stretch),
                     float(call.attr("cubic_coeff_a", -0.75)))
    if antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return base.astype(np.int64)[:, None] + offsets[None, :], weights


def _resize_axis(call: OpCall, data: np.ndarray, axis: int, out: int, scale: float, roi) -> np.ndarray:
    size = data.shape[axis]
    coords, outside = _source_coords(call, out, scale, size, roi)
    index, weights = _taps(call, coords, scale)
    if call.attr("exclude_outside", 0):
        weights = np.where((index < 0) | (index >= size), 0.0, weights)
        weights = weights / np.where(weights.sum(axis=1, keepdims=True) == 0, 1, weights.sum(axis=1, keepdims=True))
    index = np.clip(index, 0, size - 1)
    bshape = [1] * data.ndim
    bshape[axis] = out
    result = sum(np.take(data, index[:, j], axis=axis) * weights[:, j].reshape(bshape)
                 for j in range(index.shape[1]))
    if outside is not None and outside.any():
        result = np.where(outside.reshape(bshape), float(call.attr("extrapolation_value", 0.0)), result)
    return result


# =========================================================================== the table
register(OpDef("MatMul", BACKBONE, matmul_shape, matmul_ref, arity=(2, 2)))
register(OpDef("Gemm", BACKBONE, gemm_shape, gemm_ref, arity=(2, 3)))
register(OpDef("Conv", BACKBONE, conv_shape, conv_ref, arity=(2, 3)))
register(OpDef("ConvTranspose", BACKBONE, conv_transpose_shape, conv_transpose_ref, arity=(2, 3)))
register(OpDef("Einsum", BACKBONE, einsum_shape, einsum_ref, arity=(1, MANY)))

register(OpDef("Softmax", REDUCTION, softmax_shape, softmax_ref, arity=(1, 1), reduced_axes=_softmax_rows))
register(OpDef("LogSoftmax", REDUCTION, softmax_shape, log_softmax_ref, arity=(1, 1),
               reduced_axes=_softmax_rows))
register(OpDef("LayerNormalization", REDUCTION, layer_norm_shape, layer_norm_ref, arity=(2, 3),
               reduced_axes=_layer_norm_rows))
register(OpDef("InstanceNormalization", REDUCTION, instance_norm_shape, instance_norm_ref, arity=(3, 3),
               reduced_axes=_spatial_rows))
register(OpDef("BatchNormalization", FusionClass.ELEMENTWISE, batch_norm_shape, batch_norm_ref, arity=(5, 5)))

for _op, _spec in REDUCTIONS.items():
    register(OpDef(_op, REDUCTION, reduce_shape, _reduce_ref(_spec),
                   data_rule=_reduce_data(_spec) if _spec.symbolic else None, arity=(1, 2),
                   reduced_axes=lambda ctx: _reduce_axes(ctx, ctx.rank(0)),
                   selects_elements=_op in ("ReduceMax", "ReduceMin")))

ARG_REDUCTIONS = {"ArgMax": np.argmax, "ArgMin": np.argmin}
for _op, _fn in ARG_REDUCTIONS.items():
    register(OpDef(_op, REDUCTION, arg_shape, _arg_ref(_fn), arity=(1, 1),
                   reduced_axes=lambda ctx: [ctx.normalize_axis(int(ctx.attr("axis", 0)), ctx.rank(0))]))

register(OpDef("TopK", OPAQUE, topk_shape, topk_ref, arity=(1, 2)))
register(OpDef("LpNormalization", OPAQUE, same_shape, lp_normalization_ref, arity=(1, 1)))
register(OpDef("LRN", OPAQUE, same_shape, lrn_ref, arity=(1, 1)))
register(OpDef("Hardmax", OPAQUE, same_shape, hardmax_ref, arity=(1, 1)))
register(OpDef("Det", OPAQUE, det_shape, lambda call, x: np.linalg.det(x).astype(x.dtype), arity=(1, 1)))

GLOBAL_POOLS = {"GlobalAveragePool": np.mean, "GlobalMaxPool": np.max}
for _op, _fn in GLOBAL_POOLS.items():
    register(OpDef(_op, REDUCTION, global_pool_shape, _global(_fn), arity=(1, 1), reduced_axes=_spatial_rows,
                   selects_elements=_op == "GlobalMaxPool"))

register(OpDef("MaxPool", OPAQUE, pool_shape, maxpool_ref, arity=(1, 1), selects_elements=True))
register(OpDef("AveragePool", OPAQUE, pool_shape, avgpool_ref, arity=(1, 1)))
register(OpDef("Resize", OPAQUE, resize_shape, resize_ref, arity=(1, 4), opsets=(11, onnx.defs.onnx_opset_version())))
