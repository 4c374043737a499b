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

from tscomp.graph.ops.registry import (DATA_VIA_REFERENCE, CTypes, FusionClass, OpCall, OpDef, ShapeContext,
                                       c_type, register, same_shape)
from tscomp.graph.symbols import floor_of_root

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
    """Integer Div truncates toward zero: floor for a >= 0, ceiling for a <= 0 (b >= 1 proven by the
    ranges); a numerator whose sign the ranges do not decide gets both, chosen at run time (a traced
    "same" padding ``(67 - width) / 2`` pads small images and crops large ones)."""
    if ctx.out_dtypes[0].kind in "iu":
        if a.is_number and b.is_number:
            return sympy.Integer(int(a / b)) if b != 0 else None
        if ctx.symbols.prove_le(1, b):
            if ctx.symbols.prove_le(0, a):
                return sympy.floor(a / b)
            if ctx.symbols.prove_le(a, 0):
                return sympy.ceiling(a / b)
            return sympy.Piecewise((sympy.floor(a / b), sympy.Ge(a, 0)), (sympy.ceiling(a / b), True))
        return None
    return a / b


def _mod_data(ctx, a, b):
    """Integer Mod: ``fmod=0`` (the default) takes the divisor's sign, as ``sympy.Mod`` (floored) does,
    so any provably nonzero divisor is exact; ``fmod=1`` truncates, which is the same for a >= 0 and
    b >= 1. Range facts and padding identities come from :meth:`SymbolTable._resolve_mod`."""
    if a.is_number and b.is_number:
        if b == 0:
            return None
        if ctx.attr("fmod", 0):
            return sympy.sympify(math.fmod(a, b)) if not (a.is_Integer and b.is_Integer) else \
                sympy.Integer(int(math.copysign(abs(int(a)) % abs(int(b)), int(a))))
        return sympy.Mod(a, b)
    if ctx.out_dtypes[0].kind not in "iu":
        return None
    if ctx.attr("fmod", 0):
        return sympy.Mod(a, b) if ctx.symbols.prove_le(0, a) and ctx.symbols.prove_le(1, b) else None
    return sympy.Mod(a, b) if ctx.symbols.decide("!=", b, 0) else None


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
            return floor_of_root(x) or sympy.floor(x)
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


# --------------------------------------------------------------------------- C expressions
# ``OpDef.c_expr``: one output element as a C expression of the argument elements (identifiers or
# literals). ``{a}``, ``{b}``, ``{c}`` are the arguments, ``{f}`` the math.h suffix of the element
# type ("f" for float, "" for double), ``{T}`` the output's C type.
def _c(template: str, kinds: str = "fiub"):
    """A c_expr from a template; None (unsupported) unless argument 0's dtype kind is in ``kinds``."""
    def c_expr(args, attrs, dtypes: CTypes):
        dt = dtypes.args[0] if dtypes.args else dtypes.out
        if dt is None or dt.kind not in kinds or (dt.kind == "f" and dt.itemsize < 4):
            return None
        names = dict(zip("abc", args))
        return template.format(f=_suffix(dt), T=c_type(dtypes.out), **names)
    return c_expr


def _suffix(dt: np.dtype) -> str:
    return "f" if dt == np.float32 else ""


def _c_float(value: float, dt: np.dtype) -> str:
    """A float literal of ``dt``'s precision (attributes such as alpha)."""
    v = np.asarray(value, dtype=dt)[()]
    text = str(v) if dt == np.float32 else repr(float(v))  # the shortest form that round-trips
    if not np.isfinite(v):
        return ("-" if v < 0 else "") + "INFINITY" if np.isinf(v) else "NAN"
    return text + ("" if "." in text or "e" in text else ".0") + ("f" if dt == np.float32 else "")


def c_literal_value(text: str | None) -> float | None:
    """The number a C literal argument spells (``2.0f``, ``3``), or None for anything else."""
    if text is None:
        return None
    try:
        return float(text.rstrip("fFlLuU"))
    except ValueError:
        return None


def _c_pow(args, attrs, dtypes: CTypes):
    a, b = args
    dt = dtypes.args[0]
    if dt.kind != "f":  # integer base: numpy's exact integer power (small results are exact in double)
        return f"({c_type(dt)})pow((double){a}, (double){b})"
    f = _suffix(dt)
    fast = {1.0: f"{a}", 2.0: f"({a} * {a})", 3.0: f"({a} * {a} * {a})", 0.5: f"sqrt{f}({a})",
            -1.0: f"(1 / {a})", 0.0: "1"}
    e = c_literal_value(b)
    return fast.get(e, f"pow{f}({a}, {b})")


def _c_div(args, attrs, dtypes: CTypes):
    a, b = args
    if dtypes.args[0].kind == "f":
        divisor = c_literal_value(b) if dtypes.args[0] == np.float32 and dtypes.args[1] == np.float32 else None
        if divisor is not None:
            s = np.float32(divisor)
            if 2.0 ** -100 <= abs(float(s)) <= 2.0 ** 100:   # 1/s and the remainders stay normal
                # by a constant: a product and two FMA corrections, the division's exact result
                # (codegen.c_expr.QUOTIENT_HELPER); a QDQ model's every QuantizeLinear
                return f"ts_quotient({a}, {b}, {_c_float(float(np.float32(1) / s), np.dtype(np.float32))})"
        return f"({a} / {b})"
    return f"({b} == 0 ? 0 : {a} / {b})"  # C truncates toward zero, as ONNX's integer Div


def _c_mod(args, attrs, dtypes: CTypes):
    a, b = args
    dt = dtypes.args[0]
    if attrs.get("fmod", 0):
        return f"fmod{_suffix(dt)}({a}, {b})" if dt.kind == "f" else f"({b} == 0 ? 0 : {a} % {b})"
    # numpy's mod: the result takes the divisor's sign
    r = f"fmod{_suffix(dt)}({a}, {b})" if dt.kind == "f" else f"({b} == 0 ? 0 : {a} % {b})"
    return f"({r} != 0 && (({r} < 0) != ({b} < 0)) ? {r} + {b} : {r})"


def _c_bitshift(args, attrs, dtypes: CTypes):
    op = "<<" if attrs.get("direction") == "LEFT" else ">>"
    return f"({args[0]} {op} {args[1]})"


def _c_variadic(op: str):
    def c_expr(args, attrs, dtypes: CTypes):
        dt = dtypes.out
        out = args[0]
        for x in args[1:]:
            if op == "+":
                out = f"({out} + {x})"
            else:  # Max/Min propagate NaN like numpy's maximum/minimum
                nan = f" || {out} != {out}" if dt.kind == "f" else ""
                out = f"(({out} {op}= {x}{nan}) ? {out} : {x})"
        return out
    return c_expr


def _c_mean(args, attrs, dtypes: CTypes):
    if dtypes.out.kind != "f":
        return None
    return f"(({' + '.join(args)}) / {len(args)})"


def _c_gelu(args, attrs, dtypes: CTypes):
    (a,), dt = args, dtypes.args[0]
    if dt.kind != "f":
        return None
    f, lit = _suffix(dt), (lambda v: _c_float(v, dt))
    if attrs.get("approximate", "none") == "tanh":
        inner = f"{lit(math.sqrt(2 / math.pi))} * ({a} + {lit(0.044715)} * {a} * {a} * {a})"
        return f"(0.5{f} * {a} * (1 + tanh{f}({inner})))"
    return f"(0.5{f} * {a} * (1 + {_c_erf_name(dt)}({a} * {lit(1 / math.sqrt(2))})))"


def _c_erf_name(dt: np.dtype) -> str:
    # float: the codegen's vectorizable rational erf (|error| < 5e-7); libm's erff is a scalar call
    return "tscomp_erff" if dt == np.float32 else "erf"


def _c_erf(args, attrs, dtypes: CTypes):
    dt = dtypes.args[0]
    return f"{_c_erf_name(dt)}({args[0]})" if dt.kind == "f" and dt.itemsize >= 4 else None


def _c_sigmoid(args, attrs, dtypes: CTypes):
    # float: the codegen's vectorizable logistic (its argument clamped, no special-case selects)
    dt = dtypes.args[0]
    if dt.kind != "f" or dt.itemsize < 4:
        return None
    return f"ts_sigmoidf({args[0]})" if dt == np.float32 else f"(1 / (1 + exp(-{args[0]})))"


def _c_alpha(template: str, **defaults: float):
    """Float-only templates with float attributes ({alpha}, {beta}) as literals."""
    def c_expr(args, attrs, dtypes: CTypes):
        dt = dtypes.args[0]
        if dt.kind != "f":
            return None
        values = {k: _c_float(attrs.get(k, v), dt) for k, v in defaults.items()}
        return template.format(a=args[0], f=_suffix(dt), **values)
    return c_expr


def _c_isinf(args, attrs, dtypes: CTypes):
    (a,) = args
    if dtypes.args[0].kind != "f":
        return "0"
    pos, neg = bool(attrs.get("detect_positive", 1)), bool(attrs.get("detect_negative", 1))
    terms = ([f"{a} == INFINITY"] if pos else []) + ([f"{a} == -INFINITY"] if neg else [])
    return f"({' || '.join(terms)})" if terms else "0"


def _c_clip(args, attrs, dtypes: CTypes):
    x = args[0]
    lo = args[1] if len(args) > 1 else None
    hi = args[2] if len(args) > 2 else None
    dt = dtypes.out
    if lo is None and attrs.get("min") is not None:
        lo = _c_float(attrs["min"], dt) if dt.kind == "f" else str(int(attrs["min"]))
    if hi is None and attrs.get("max") is not None:
        hi = _c_float(attrs["max"], dt) if dt.kind == "f" else str(int(attrs["max"]))
    out = x
    if lo is not None:  # numpy's maximum/minimum: NaN stays NaN
        out = f"({out} < {lo} ? {lo} : {out})"
    if hi is not None:
        out = f"({out} > {hi} ? {hi} : {out})"
    return out


def _c_cast(args, attrs, dtypes: CTypes):
    (a,) = args[:1]
    src, to = dtypes.args[0], dtypes.out
    if c_type(src) is None or c_type(to) is None:
        return None
    if to == np.bool_:
        return f"({a} != 0)"
    return f"({c_type(to)}){a}"


# --------------------------------------------------------------------------- the table
UNARY: dict[str, tuple[Callable, Callable | None, Callable | None]] = {
    # op: (numpy function, symbolic element function or None, C expression)
    "Relu": (lambda x: np.maximum(x, 0), _sym(lambda x: sympy.Max(x, 0)), _c("({a} < 0 ? 0 : {a})", "fi")),
    "Sigmoid": (sigmoid, None, _c_sigmoid),
    "Tanh": (np.tanh, None, _c("tanh{f}({a})", "f")),
    "Erf": (special.erf, None, _c_erf),
    "Exp": (np.exp, None, _c("exp{f}({a})", "f")),
    "Log": (np.log, None, _c("log{f}({a})", "f")),
    "Sqrt": (np.sqrt, _sym(sympy.sqrt), _c("sqrt{f}({a})", "f")),
    "Neg": (np.negative, _sym(lambda x: -x), _c("(-{a})", "fi")),
    "Abs": (np.abs, _sym(sympy.Abs), _c("({a} < 0 ? -{a} : {a})", "fi")),
    "Reciprocal": (lambda x: 1 / x, _sym(lambda x: 1 / x), _c("(1 / {a})", "f")),
    "Floor": (np.floor, _sym(sympy.floor), _c("floor{f}({a})", "f")),
    "Ceil": (np.ceil, _sym(sympy.ceiling), _c("ceil{f}({a})", "f")),
    "Round": (round_half_even, None, _c("nearbyint{f}({a})", "f")),
    "Sign": (np.sign, None, _c("({a} > 0 ? 1 : ({a} < 0 ? -1 : {a}))", "fi")),
    "Sin": (np.sin, None, _c("sin{f}({a})", "f")),
    "Cos": (np.cos, None, _c("cos{f}({a})", "f")),
    "Tan": (np.tan, None, _c("tan{f}({a})", "f")),
    "Atan": (np.arctan, None, _c("atan{f}({a})", "f")),
    "Softplus": (softplus, None, _c("({a} > 20 ? {a} : log1p{f}(exp{f}({a})))", "f")),
    "Softsign": (lambda x: x / (1 + np.abs(x)), None, _c("({a} / (1 + fabs{f}({a})))", "f")),
    "Sinh": (np.sinh, None, _c("sinh{f}({a})", "f")),
    "Cosh": (np.cosh, None, _c("cosh{f}({a})", "f")),
    "Asin": (np.arcsin, None, _c("asin{f}({a})", "f")),
    "Acos": (np.arccos, None, _c("acos{f}({a})", "f")),
    "Asinh": (np.arcsinh, None, _c("asinh{f}({a})", "f")),
    "Acosh": (np.arccosh, None, _c("acosh{f}({a})", "f")),
    "Atanh": (np.arctanh, None, _c("atanh{f}({a})", "f")),
    # x * tanh(softplus(x)), softplus as above (no overflow in exp for large x)
    "Mish": (lambda x: (x * np.tanh(softplus(x))).astype(x.dtype), None,
             _c("({a} * tanh{f}({a} > 20 ? {a} : log1p{f}(exp{f}({a}))))", "f")),
}

for _op, (_fn, _data, _cx) in UNARY.items():
    register(OpDef(_op, E, same_dtype_broadcast, _unary(_fn),
                   data_rule=_elementwise_data(_data) if _data else None, arity=(1, 1), c_expr=_cx))

register(OpDef("BitwiseNot", E, same_dtype_broadcast, lambda call, x: np.invert(x), arity=(1, 1),
               c_expr=_c("(({T})~{a})", "iu")))
register(OpDef("Not", E, same_dtype_broadcast, lambda call, x: np.logical_not(x),
               data_rule=_elementwise_data(lambda ctx, x: sympy.Integer(int(x == 0)) if x.is_number else None),
               arity=(1, 1), c_expr=_c("(!{a})")))
register(OpDef("IsNaN", E, bool_broadcast, lambda call, x: np.isnan(x), arity=(1, 1),
               c_expr=_c("({a} != {a})", "f")))
register(OpDef("IsInf", E, bool_broadcast,
               lambda call, x: (np.isposinf(x) & bool(call.attr("detect_positive", 1)))
               | (np.isneginf(x) & bool(call.attr("detect_negative", 1))), arity=(1, 1), c_expr=_c_isinf))
register(OpDef("Gelu", E, same_dtype_broadcast, gelu_ref, arity=(1, 1), opsets=(20, onnx.defs.onnx_opset_version()),
               c_expr=_c_gelu))
register(OpDef("LeakyRelu", E, same_dtype_broadcast,
               lambda call, x: np.where(x >= 0, x, x * np.asarray(_float_attr(call, "alpha", 0.01), x.dtype)),
               arity=(1, 1), c_expr=_c_alpha("({a} >= 0 ? {a} : {a} * {alpha})", alpha=0.01)))
register(OpDef("Elu", E, same_dtype_broadcast,
               lambda call, x: np.where(x >= 0, x, _float_attr(call, "alpha", 1.0) * np.expm1(x))
               .astype(x.dtype), arity=(1, 1),
               c_expr=_c_alpha("({a} >= 0 ? {a} : {alpha} * expm1{f}({a}))", alpha=1.0)))
register(OpDef("HardSigmoid", E, same_dtype_broadcast,
               lambda call, x: np.clip(_float_attr(call, "alpha", 0.2) * x + _float_attr(call, "beta", 0.5),
                                       0, 1).astype(x.dtype), arity=(1, 1),
               c_expr=_c_alpha("({alpha} * {a} + {beta} < 0 ? 0 : "  # NaN stays NaN, as np.clip
                               "({alpha} * {a} + {beta} > 1 ? 1 : {alpha} * {a} + {beta}))", alpha=0.2, beta=0.5)))
register(OpDef("HardSwish", E, same_dtype_broadcast,    # x * HardSigmoid(x) with alpha 1/6, beta 1/2
               lambda call, x: (x * np.clip(x / 6 + 0.5, 0, 1)).astype(x.dtype), arity=(1, 1),
               c_expr=_c_alpha("({a} * ({a} / 6 + 0.5{f} < 0 ? 0 : ({a} / 6 + 0.5{f} > 1 ? 1 : {a} / 6 + 0.5{f})))")))
_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875   # the spec's defaults
register(OpDef("Selu", E, same_dtype_broadcast,
               lambda call, x: (_float_attr(call, "gamma", _SELU_GAMMA)
                                * np.where(x > 0, x, _float_attr(call, "alpha", _SELU_ALPHA) * np.expm1(x)))
               .astype(x.dtype), arity=(1, 1),
               c_expr=_c_alpha("({gamma} * ({a} > 0 ? {a} : {alpha} * expm1{f}({a})))",
                               alpha=_SELU_ALPHA, gamma=_SELU_GAMMA)))
register(OpDef("Celu", E, same_dtype_broadcast,
               lambda call, x: (np.maximum(x, 0) + np.minimum(0, _float_attr(call, "alpha", 1.0)
                                                              * np.expm1(x / _float_attr(call, "alpha", 1.0))))
               .astype(x.dtype), arity=(1, 1),
               c_expr=_c_alpha("({a} > 0 ? {a} : {alpha} * expm1{f}({a} / {alpha}))", alpha=1.0)))
register(OpDef("ThresholdedRelu", E, same_dtype_broadcast,
               lambda call, x: np.where(x > _float_attr(call, "alpha", 1.0), x, 0).astype(x.dtype), arity=(1, 1),
               c_expr=_c_alpha("({a} > {alpha} ? {a} : 0)", alpha=1.0)))
register(OpDef("Shrink", E, same_dtype_broadcast,
               lambda call, x: np.where(x < -_float_attr(call, "lambd", 0.5), x + _float_attr(call, "bias", 0.0),
                                        np.where(x > _float_attr(call, "lambd", 0.5),
                                                 x - _float_attr(call, "bias", 0.0), 0)).astype(x.dtype),
               arity=(1, 1),
               c_expr=_c_alpha("({a} < -{lambd} ? {a} + {bias} : ({a} > {lambd} ? {a} - {bias} : 0))",
                               lambd=0.5, bias=0.0)))
register(OpDef("Clip", E, same_shape, clip_ref, arity=(1, 3),
               c_expr=_c_clip))

BINARY: dict[str, tuple[Callable, Callable | None, Callable | None]] = {
    # op: (numpy reference, symbolic element function or None, C expression)
    "Add": (lambda call, a, b: np.add(a, b).astype(a.dtype, copy=False), _sym(lambda a, b: a + b),
            _c("({a} + {b})", "fiu")),
    "Sub": (lambda call, a, b: np.subtract(a, b).astype(a.dtype, copy=False), _sym(lambda a, b: a - b),
            _c("({a} - {b})", "fiu")),
    "Mul": (lambda call, a, b: np.multiply(a, b).astype(a.dtype, copy=False), _sym(lambda a, b: a * b),
            _c("({a} * {b})", "fiu")),
    "Div": (div_ref, _div_data, _c_div),
    "Pow": (pow_ref, _sym(lambda a, b: a ** b), _c_pow),
    "Mod": (mod_ref, _mod_data, _c_mod),
    "PRelu": (lambda call, x, s: np.where(x >= 0, x, x * s).astype(x.dtype), None,
              _c("({a} >= 0 ? {a} : {a} * {b})", "fi")),
    "BitShift": (lambda call, a, b: np.left_shift(a, b) if call.attr("direction") == "LEFT"
                 else np.right_shift(a, b), None, _c_bitshift),
    "BitwiseAnd": (lambda call, a, b: np.bitwise_and(a, b), None, _c("({a} & {b})", "iu")),
    "BitwiseOr": (lambda call, a, b: np.bitwise_or(a, b), None, _c("({a} | {b})", "iu")),
    "BitwiseXor": (lambda call, a, b: np.bitwise_xor(a, b), None, _c("({a} ^ {b})", "iu")),
}
for _op, (_ref, _data, _cx) in BINARY.items():
    register(OpDef(_op, E, same_dtype_broadcast, _ref,
                   data_rule=_elementwise_data(_data) if _data else None, arity=(2, 2), c_expr=_cx))

COMPARE: dict[str, tuple[Callable, str | None, str]] = {
    # op: (numpy function, relation for symbolic data or None, C expression)
    "Equal": (np.equal, "==", "({a} == {b})"),
    "Less": (np.less, "<", "({a} < {b})"),
    "LessOrEqual": (np.less_equal, "<=", "({a} <= {b})"),
    "Greater": (np.greater, ">", "({a} > {b})"),
    "GreaterOrEqual": (np.greater_equal, ">=", "({a} >= {b})"),
    "And": (np.logical_and, None, "({a} && {b})"),
    "Or": (np.logical_or, None, "({a} || {b})"),
    "Xor": (np.logical_xor, None, "(!{a} != !{b})"),
}
for _op, (_fn, _rel, _cx) in COMPARE.items():
    register(OpDef(_op, E, bool_broadcast, (lambda fn: lambda call, a, b: fn(a, b))(_fn),
                   data_rule=_elementwise_data(_compare(_rel)) if _rel else None, arity=(2, 2), c_expr=_c(_cx)))

VARIADIC: dict[str, tuple[Callable, Callable | None, Callable]] = {
    # op: (numpy reference, symbolic element function or None, C expression)
    "Max": (variadic(np.maximum), _minmax_data(sympy.Max), _c_variadic(">")),
    "Min": (variadic(np.minimum), _minmax_data(sympy.Min), _c_variadic("<")),
    "Sum": (variadic(np.add), _sym(lambda *xs: sum(xs[1:], xs[0])), _c_variadic("+")),
    "Mean": (mean_ref, None, _c_mean),
}
for _op, (_ref, _data, _cx) in VARIADIC.items():
    register(OpDef(_op, E, same_dtype_broadcast, _ref,
                   data_rule=_elementwise_data(_data) if _data else None, arity=(1, 2**31), c_expr=_cx))

register(OpDef("Where", E, where_shape, lambda call, c, a, b: np.where(c, a, b),
               data_rule=_where_data, arity=(3, 3), c_expr=_c("({a} ? {b} : {c})")))
register(OpDef("Cast", E, cast_shape, cast_ref, data_rule=_elementwise_data(_cast_data), arity=(1, 1),
               c_expr=_c_cast))
register(OpDef("CastLike", E, castlike_shape, lambda call, x, like: x.astype(like.dtype),
               data_rule=_elementwise_data(_cast_data), arity=(2, 2), c_expr=_c_cast))
register(OpDef("Identity", FusionClass.INJECTIVE, same_shape,
               lambda call, x: x, data_rule=DATA_VIA_REFERENCE, arity=(1, 1), c_expr=_c("{a}")))
