"""Elementwise operators: unary math, binary arithmetic and comparisons, Where, Cast.

Every entry here broadcasts its inputs (numpy/ONNX multidirectional rules,
unifying unequal symbolic dims) and belongs to the ELEMENTWISE fusion class.
The numpy references compute in the input dtype so that float32 results track
onnxruntime's. Data rules let shape arithmetic (``Shape -> Div -> Cast``) stay
symbolic.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx.defs
import sympy
from onnx import helper
from scipy import special

from tscomp.graph.ops.registry import (DATA_VIA_REFERENCE, FusionClass, OpCall, OpDef, ShapeContext,
                                       register)

E = FusionClass.ELEMENTWISE


# --------------------------------------------------------------------------- shape rules
def same_dtype_broadcast(ctx: ShapeContext) -> None:
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs)) if ctx.has_input(i)]
    ctx.set_output(0, ctx.dtype(0), ctx.broadcast(*shapes))


def bool_broadcast(ctx: ShapeContext) -> None:
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs)) if ctx.has_input(i)]
    ctx.set_output(0, np.bool_, ctx.broadcast(*shapes))


def where_shape(ctx: ShapeContext) -> None:
    ctx.set_output(0, ctx.dtype(1), ctx.broadcast(ctx.shape(0), ctx.shape(1), ctx.shape(2)))


def cast_shape(ctx: ShapeContext) -> None:
    ctx.set_output(0, onnx_dtype(ctx, ctx.attr("to")), ctx.shape(0))


def castlike_shape(ctx: ShapeContext) -> None:
    ctx.set_output(0, ctx.dtype(1), ctx.shape(0))


def onnx_dtype(ctx_or_call, code) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(code)))
    except Exception:
        fail = getattr(ctx_or_call, "unsupported", None)
        msg = f"element type {code} is not supported"
        if fail:
            fail(msg)
        raise ValueError(msg)


# --------------------------------------------------------------------------- references
def _unary(fn: Callable[[np.ndarray], np.ndarray]):
    def ref(call: OpCall, x):
        return np.asarray(fn(x)).astype(x.dtype, copy=False)
    return ref


def _float_attr(call: OpCall, key: str, default: float) -> float:
    return float(call.attr(key, default))


def gelu_ref(call: OpCall, x):
    if call.attr("approximate", "none") == "tanh":
        inner = np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x ** 3)
        return (0.5 * x * (1 + np.tanh(inner))).astype(x.dtype)
    return (0.5 * x * (1 + special.erf(x / np.sqrt(2).astype(x.dtype)))).astype(x.dtype)


def int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX integer Div truncates toward zero (C semantics), unlike numpy's floor division."""
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return (q + fix).astype(np.result_type(a, b))


def div_ref(call: OpCall, a, b):
    if np.issubdtype(a.dtype, np.integer):
        return int_div(a, b)
    return (a / b).astype(a.dtype)


def pow_ref(call: OpCall, a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.power(a, b.astype(a.dtype)) if np.issubdtype(b.dtype, np.integer) \
            else np.power(a.astype(np.float64), b).astype(a.dtype)
    return np.power(a, b.astype(a.dtype)).astype(a.dtype)


def mod_ref(call: OpCall, a, b):
    if call.attr("fmod", 0):
        return np.fmod(a, b)
    return np.mod(a, b)


def cast_ref(call: OpCall, x):
    to = onnx_dtype(call, call.attr("to"))
    if x.dtype.kind in "US" or to.kind in "US":
        return x.astype(to)
    if to == np.bool_:
        return x != 0
    return x.astype(to)


def clip_ref(call: OpCall, x, lo=None, hi=None):
    if call.opset < 11:
        lo, hi = call.attr("min", None), call.attr("max", None)
    if lo is not None and np.size(lo):
        x = np.maximum(x, np.asarray(lo, dtype=x.dtype))
    if hi is not None and np.size(hi):
        x = np.minimum(x, np.asarray(hi, dtype=x.dtype))
    return x


def variadic(fn):
    def ref(call: OpCall, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return np.asarray(out).astype(xs[0].dtype, copy=False)
    return ref


def mean_ref(call: OpCall, *xs):
    return (variadic(np.add)(call, *xs) / np.asarray(len(xs), dtype=xs[0].dtype)).astype(xs[0].dtype)


def round_half_even(x):
    return np.round(x)


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(x.dtype)


def sigmoid(x):
    # two-sided form avoids overflow warnings in exp for large |x|
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


# --------------------------------------------------------------------------- data rules
def _elementwise_data(fn: Callable, n: int | None = None):
    """Apply ``fn`` to broadcast symbolic elements; ``fn`` returns None when undecidable."""
    def rule(ctx: ShapeContext):
        vals = [ctx.values(i) for i in range(len(ctx.inputs))]
        vals = np.broadcast_arrays(*vals)
        out = np.empty(vals[0].shape, dtype=object)
        for idx in np.ndindex(out.shape):
            r = fn(ctx, *[v[idx] for v in vals])
            if r is None:
                return None
            out[idx] = r
        return [out]
    return rule


def _div_data(ctx, a, b):
    if ctx.out_dtypes[0].kind in "iu":
        if a.is_number and b.is_number:
            return sympy.Integer(int(a / b)) if b != 0 else None
        if ctx.symbols.prove_le(0, a) and ctx.symbols.prove_le(1, b):
            return sympy.floor(a / b)
        return None
    return a / b


def _compare(rel: str):
    def fn(ctx, a, b):
        r = ctx.symbols.decide(rel, a, b)
        return None if r is None else sympy.Integer(int(r))
    return fn


def _cast_data(ctx, x):
    to = ctx.out_dtypes[0]
    if to == np.bool_:
        r = ctx.symbols.decide("!=", x, 0)
        return None if r is None else sympy.Integer(int(r))
    if to.kind in "iu":
        if x.is_integer:
            return x
        if x.is_number:
            return sympy.Integer(int(x))  # truncation, as C casts do
        if ctx.symbols.prove_le(0, x):
            return sympy.floor(x)
        return None
    if to.kind == "f":
        return x
    return None


def _where_data(ctx: ShapeContext):
    cond, a, b = (ctx.values(i) for i in range(3))
    cond, a, b = np.broadcast_arrays(cond, a, b)
    out = np.empty(cond.shape, dtype=object)
    for idx in np.ndindex(out.shape):
        c = cond[idx]
        if not c.is_number:
            return None
        out[idx] = a[idx] if c != 0 else b[idx]
    return [out]


def _sym(fn):
    return lambda ctx, *xs: fn(*xs)


def _minmax_data(kind):
    def fn(ctx, *xs):
        return ctx.symbols.canon(kind(*xs))
    return fn


# --------------------------------------------------------------------------- the table
UNARY: dict[str, tuple[Callable, Callable | None]] = {
    # op: (numpy function, symbolic element function or None)
    "Relu": (lambda x: np.maximum(x, 0), _sym(lambda x: sympy.Max(x, 0))),
    "Sigmoid": (sigmoid, None),
    "Tanh": (np.tanh, None),
    "Erf": (special.erf, None),
    "Exp": (np.exp, None),
    "Log": (np.log, None),
    "Sqrt": (np.sqrt, _sym(sympy.sqrt)),
    "Neg": (np.negative, _sym(lambda x: -x)),
    "Abs": (np.abs, _sym(sympy.Abs)),
    "Reciprocal": (lambda x: 1 / x, _sym(lambda x: 1 / x)),
    "Floor": (np.floor, _sym(sympy.floor)),
    "Ceil": (np.ceil, _sym(sympy.ceiling)),
    "Round": (round_half_even, None),
    "Sign": (np.sign, None),
    "Sin": (np.sin, None),
    "Cos": (np.cos, None),
    "Tan": (np.tan, None),
    "Atan": (np.arctan, None),
    "Softplus": (softplus, None),
    "Softsign": (lambda x: x / (1 + np.abs(x)), None),
}

for _op, (_fn, _data) in UNARY.items():
    register(OpDef(_op, E, same_dtype_broadcast, _unary(_fn),
                   data_rule=_elementwise_data(_data) if _data else None, arity=(1, 1)))

register(OpDef("Not", E, same_dtype_broadcast, lambda call, x: np.logical_not(x),
               data_rule=_elementwise_data(lambda ctx, x: sympy.Integer(int(x == 0)) if x.is_number else None),
               arity=(1, 1)))
register(OpDef("IsNaN", E, bool_broadcast, lambda call, x: np.isnan(x), arity=(1, 1)))
register(OpDef("IsInf", E, bool_broadcast,
               lambda call, x: (np.isposinf(x) & bool(call.attr("detect_positive", 1)))
               | (np.isneginf(x) & bool(call.attr("detect_negative", 1))), arity=(1, 1)))
register(OpDef("Gelu", E, same_dtype_broadcast, gelu_ref, arity=(1, 1), opsets=(20, onnx.defs.onnx_opset_version())))
register(OpDef("LeakyRelu", E, same_dtype_broadcast,
               lambda call, x: np.where(x >= 0, x, x * np.asarray(_float_attr(call, "alpha", 0.01), x.dtype)),
               arity=(1, 1)))
register(OpDef("Elu", E, same_dtype_broadcast,
               lambda call, x: np.where(x >= 0, x, _float_attr(call, "alpha", 1.0) * np.expm1(x))
               .astype(x.dtype), arity=(1, 1)))
register(OpDef("HardSigmoid", E, same_dtype_broadcast,
               lambda call, x: np.clip(_float_attr(call, "alpha", 0.2) * x + _float_attr(call, "beta", 0.5),
                                       0, 1).astype(x.dtype), arity=(1, 1)))
register(OpDef("Clip", E, lambda ctx: ctx.set_output(0, ctx.dtype(0), ctx.shape(0)), clip_ref, arity=(1, 3)))

BINARY: dict[str, tuple[Callable, Callable | None]] = {
    "Add": (lambda call, a, b: np.add(a, b).astype(a.dtype, copy=False), _sym(lambda a, b: a + b)),
    "Sub": (lambda call, a, b: np.subtract(a, b).astype(a.dtype, copy=False), _sym(lambda a, b: a - b)),
    "Mul": (lambda call, a, b: np.multiply(a, b).astype(a.dtype, copy=False), _sym(lambda a, b: a * b)),
    "Div": (div_ref, _div_data),
    "Pow": (pow_ref, _sym(lambda a, b: a ** b)),
    "Mod": (mod_ref, None),
    "PRelu": (lambda call, x, s: np.where(x >= 0, x, x * s).astype(x.dtype), None),
    "BitShift": (lambda call, a, b: np.left_shift(a, b) if call.attr("direction") == "LEFT"
                 else np.right_shift(a, b), None),
}
for _op, (_ref, _data) in BINARY.items():
    register(OpDef(_op, E, same_dtype_broadcast, _ref,
                   data_rule=_elementwise_data(_data) if _data else None, arity=(2, 2)))

COMPARE: dict[str, tuple[Callable, str | None]] = {
    "Equal": (np.equal, "=="),
    "Less": (np.less, "<"),
    "LessOrEqual": (np.less_equal, "<="),
    "Greater": (np.greater, ">"),
    "GreaterOrEqual": (np.greater_equal, ">="),
    "And": (np.logical_and, None),
    "Or": (np.logical_or, None),
    "Xor": (np.logical_xor, None),
}
for _op, (_fn, _rel) in COMPARE.items():
    register(OpDef(_op, E, bool_broadcast, (lambda fn: lambda call, a, b: fn(a, b))(_fn),
                   data_rule=_elementwise_data(_compare(_rel)) if _rel else None, arity=(2, 2)))

VARIADIC: dict[str, tuple[Callable, Callable | None]] = {
    "Max": (variadic(np.maximum), _minmax_data(sympy.Max)),
    "Min": (variadic(np.minimum), _minmax_data(sympy.Min)),
    "Sum": (variadic(np.add), _sym(lambda *xs: sum(xs[1:], xs[0]))),
    "Mean": (mean_ref, None),
}
for _op, (_ref, _data) in VARIADIC.items():
    register(OpDef(_op, E, same_dtype_broadcast, _ref,
                   data_rule=_elementwise_data(_data) if _data else None, arity=(1, 2**31)))

register(OpDef("Where", E, where_shape, lambda call, c, a, b: np.where(c, a, b),
               data_rule=_where_data, arity=(3, 3)))
register(OpDef("Cast", E, cast_shape, cast_ref, data_rule=_elementwise_data(_cast_data), arity=(1, 1)))
register(OpDef("CastLike", E, castlike_shape, lambda call, x, like: x.astype(like.dtype),
               data_rule=_elementwise_data(_cast_data), arity=(2, 2)))
register(OpDef("Identity", FusionClass.INJECTIVE, lambda ctx: ctx.set_output(0, ctx.dtype(0), ctx.shape(0)),
               lambda call, x: x, data_rule=DATA_VIA_REFERENCE, arity=(1, 1)))
