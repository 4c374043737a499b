"""The operator registry: one entry per ONNX operator.

Each :class:`OpDef` holds everything tscomp knows about one operator, in one
place (the way onnxruntime's symbolic shape inference keeps a dispatch table of
per-op handlers):

* ``shape_rule(ctx)`` — output dtypes and symbolic shapes from the inputs'
  (TSCompiler §4.1, ``ComputeSymShape``); it may unify dimensions the operator
  forces equal (``ctx.unify``), which is the sibling inference of Alg. 1;
* ``reference(call, *inputs)`` — numpy semantics, used by constant folding and
  by the reference executor (the oracle for every later stage);
* ``data_rule(ctx)`` — optional: element values of *shape-holding* outputs as
  SymPy expressions, given those of the inputs (``DATA_VIA_REFERENCE`` means the
  numpy reference already works on object arrays of SymPy expressions);
* ``fusion`` — the operator's class for the fusion stage.

Rules are written against :class:`ShapeContext` and :class:`OpCall` only; they
never see the graph.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import onnx.defs
import sympy

from tscomp.errors import ShapeError, UnsupportedOperatorError
from tscomp.graph.symbols import Constraint, SymbolTable, as_expr, shape_str

Shape = tuple[sympy.Expr, ...]


class FusionClass(enum.Enum):
    ELEMENTWISE = "elementwise"  # out[i] = f(in_k[broadcast(i)])
    INJECTIVE = "injective"      # a pure index map: Reshape, Transpose, Slice, Concat, Gather, ...
    REDUCTION = "reduction"      # Softmax, LayerNormalization, Reduce*
    BACKBONE = "backbone"        # MatMul, Gemm, Conv
    SHAPE = "shape"              # reads only its input's shape: Shape, Size
    OPAQUE = "opaque"            # runs as a group of its own: Resize, CumSum, NonZero, ...


#: Marker for ``data_rule``: the numpy reference is generic over element type.
DATA_VIA_REFERENCE = "reference"


@dataclass(frozen=True)
class OpCall:
    """What a reference implementation may know about the node it runs."""
    name: str
    op_type: str
    attrs: dict[str, Any]
    opset: int
    num_outputs: int

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


@dataclass(frozen=True)
class OpDef:
    op_type: str
    fusion: FusionClass
    shape_rule: Callable[["ShapeContext"], None]
    reference: Callable[..., Any]
    data_rule: Callable[["ShapeContext"], Sequence[np.ndarray | None]] | str | None = None
    domain: str = ""
    #: opset versions whose semantics the entry implements (inclusive); by default every
    #: version the installed onnx package defines (its conformance cases test them all)
    opsets: tuple[int, int] = (1, onnx.defs.onnx_opset_version())
    #: how many input slots there are (min, max) — checked before the rules run
    arity: tuple[int, int] | None = None
    #: injective ops that only re-address elements: ``view_rule(ctx, out_shapes)`` gives, per
    #: output, the chain of :class:`tscomp.graph.views.ViewOp` that reads it from input 0
    #: (or None when the view's parameters are not known at compile time)
    view_rule: Callable[["ShapeContext", Sequence[Shape]], list[tuple] | None] | None = None
    #: reductions: ``reduced_axes(ctx)`` gives the sorted input axes one row spans (the axes a
    #: Softmax/LayerNorm normalizes or a Reduce* folds), or None when only run time knows them;
    #: the fusion stage stitches reductions over the same rows
    reduced_axes: Callable[["ShapeContext"], list[int] | None] | None = None
    #: elementwise ops: ``c_expr(args, attrs, dtypes)`` gives the C expression of one output element
    #: from its arguments' elements. ``args`` are C identifiers or literals (so a template may repeat
    #: them), None for an omitted optional input; ``dtypes`` is a :class:`CTypes`. The expression is
    #: plain C99 + ``<math.h>`` and is assigned to a local of the output's C type (:func:`c_type`).
    #: None (or a function returning None for some dtypes) means code generation does not support it.
    c_expr: Callable[[list[str | None], dict[str, Any], "CTypes"], str | None] | None = None
    #: ops that run as a kernel of their own (opaque index ops: CumSum, Range, Scatter*, ArgMax, ...):
    #: ``c_kernel(w)`` writes the C body of a one-op kernel through ``w``, the writer of
    #: :mod:`tscomp.codegen.cpu_index` (operands, flat loads, shape printing, checked indices);
    #: attached in :mod:`tscomp.graph.ops.c_kernels`. None: no native kernel (numpy fallback).
    c_kernel: Callable[[Any], None] | None = None
    #: ops each of whose output elements is one of input 0's elements, chosen by position or by
    #: order (MaxPool, ReduceMax, ...): they commute with every non-decreasing elementwise map, so
    #: they give the same integers on a quantized tensor's float form (as views do: ``view_rule``)
    selects_elements: bool = False


class CTypes(NamedTuple):
    """Element types an :attr:`OpDef.c_expr` template sees: the output's and each argument's."""
    out: np.dtype
    args: tuple[np.dtype | None, ...]


#: numpy dtype -> C element type of generated kernels (bool is one byte holding 0 or 1)
C_TYPES = {np.dtype(k): v for k, v in (
    ("float32", "float"), ("float64", "double"), ("int64", "int64_t"), ("int32", "int32_t"),
    ("int16", "int16_t"), ("int8", "int8_t"), ("uint64", "uint64_t"), ("uint32", "uint32_t"),
    ("uint16", "uint16_t"), ("uint8", "uint8_t"), ("bool", "uint8_t"),
    # GCC's _Float16: a float16 model's inputs and outputs, read and written by Casts (the graph stage
    # computes every operator in float32: tscomp.graph.half_precision)
    ("float16", "_Float16"))}


def c_type(dtype) -> str | None:
    """The C type of one element of ``dtype``, or None when generated C cannot hold it (bfloat16, strings)."""
    try:
        return C_TYPES.get(np.dtype(dtype))
    except TypeError:
        return None


REGISTRY: dict[tuple[str, str], OpDef] = {}


def same_shape(ctx: "ShapeContext") -> None:
    """The shape rule of an operator whose output is its first input's shape and element type."""
    ctx.set_output(0, ctx.dtype(0), ctx.shape(0))


def register(opdef: OpDef) -> OpDef:
    key = (opdef.domain, opdef.op_type)
    if key in REGISTRY:
        raise ValueError(f"operator {opdef.op_type} registered twice")
    REGISTRY[key] = opdef
    return opdef


def attach(op_type: str, domain: str = "", **fields) -> OpDef:
    """Set fields of a registered entry (a module adding one capability to many ops, e.g. their
    C kernels, keeps one line per op instead of editing every entry's definition)."""
    import dataclasses
    key = (domain, op_type)
    REGISTRY[key] = dataclasses.replace(REGISTRY[key], **fields)
    return REGISTRY[key]


def lookup(op_type: str, domain: str, opset: int, node_name: str) -> OpDef:
    domain = "" if domain == "ai.onnx" else domain
    opdef = REGISTRY.get((domain, op_type))
    if opdef is None:
        where = f"{domain}." if domain else ""
        raise UnsupportedOperatorError(
            f"node {node_name!r}: operator {where}{op_type} (opset {opset}) is not supported by tscomp")
    lo, hi = opdef.opsets
    if not lo <= opset <= hi:
        raise UnsupportedOperatorError(
            f"node {node_name!r}: operator {op_type} at opset {opset} is not supported "
            f"(tscomp implements opsets {lo}-{hi} of it)")
    return opdef


def run_reference(opdef: OpDef, call: OpCall, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Call an op's numpy reference and normalize its result to a list of arrays."""
    with np.errstate(all="ignore"):  # inf/nan results are IEEE semantics ONNX expects, not errors
        result = opdef.reference(call, *inputs)
    if isinstance(result, (tuple, list)):
        return [np.asarray(r) for r in result]
    return [np.asarray(result)]


@dataclass
class InputFacts:
    """What propagation knows about one input of a node."""
    name: str
    dtype: np.dtype | None
    shape: Shape | None
    const: np.ndarray | None = None
    symdata: np.ndarray | None = None


@dataclass
class ShapeContext:
    """The view a shape/data rule gets of one node during propagation."""
    node_name: str
    op_type: str
    attrs: dict[str, Any]
    opset: int
    inputs: list[InputFacts | None]  # None for an omitted optional input
    num_outputs: int
    symbols: SymbolTable
    out_dtypes: list[np.dtype | None] = field(default_factory=list)
    out_shapes: list[Shape | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.out_dtypes = [None] * self.num_outputs
        self.out_shapes = [None] * self.num_outputs

    # --- reading inputs -------------------------------------------------------
    @property
    def call(self) -> OpCall:
        return OpCall(self.node_name, self.op_type, self.attrs, self.opset, self.num_outputs)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def _input(self, i: int) -> InputFacts:
        if not self.has_input(i):
            self.fail(f"input {i} is required but missing")
        return self.inputs[i]

    def shape(self, i: int) -> Shape:
        facts = self._input(i)
        if facts.shape is None:
            self.fail(f"input {i} ({facts.name!r}) has an unknown shape")
        return tuple(self.symbols.canon(d) for d in facts.shape)

    def rank(self, i: int) -> int:
        return len(self.shape(i))

    def dtype(self, i: int) -> np.dtype:
        facts = self._input(i)
        if facts.dtype is None:
            self.fail(f"input {i} ({facts.name!r}) has an unknown dtype")
        return np.dtype(facts.dtype)

    def const(self, i: int) -> np.ndarray | None:
        return self.inputs[i].const if self.has_input(i) else None

    def values(self, i: int) -> np.ndarray | None:
        """Element values of input ``i`` as an object array of SymPy expressions, or None
        when they are not known at compile time."""
        if not self.has_input(i):
            return None
        facts = self.inputs[i]
        if facts.symdata is not None:
            return np.vectorize(self.symbols.canon, otypes=[object])(facts.symdata) \
                if facts.symdata.size else facts.symdata
        if facts.const is not None:
            return to_symbolic(facts.const)
        return None

    def int_list(self, i: int) -> list[sympy.Expr] | None:
        """A 0-d/1-d integer input (axes, shape, starts, ...) as a list of expressions."""
        vals = self.values(i)
        return None if vals is None else [self.symbols.canon(v) for v in vals.reshape(-1)]

    def const_ints(self, i: int, what: str) -> list[int]:
        """A 1-d input that must be known concrete integers (e.g. axes)."""
        vals = self.int_list(i)
        if vals is None or not all(v.is_Integer for v in vals):
            self.fail(f"{what} (input {i}) must be a compile-time constant")
        return [int(v) for v in vals]

    # --- writing outputs ------------------------------------------------------
    def set_output(self, i: int, dtype, shape: Sequence) -> None:
        self.out_dtypes[i] = np.dtype(dtype)
        self.out_shapes[i] = tuple(self.symbols.canon(as_expr(d)) for d in shape)

    # --- facts ----------------------------------------------------------------
    def unify(self, a, b, what: str) -> sympy.Expr:
        return self.symbols.unify(as_expr(a), as_expr(b), f"{self.where()}: {what}")

    def fresh(self, stem: str, note: str = "") -> sympy.Symbol:
        return self.symbols.fresh_symbol(stem, note=note or f"unknown dim from {self.where()}")

    def data_dependent(self, stem: str) -> sympy.Symbol:
        return self.symbols.fresh_symbol(stem, origin="data-dependent",
                                         note=f"bound at run time by {self.where()}")

    def where(self) -> str:
        return f"{self.op_type} node {self.node_name!r}"

    def fail(self, msg: str):
        raise ShapeError(f"{self.where()}: {msg}")

    def unsupported(self, msg: str):
        raise UnsupportedOperatorError(f"{self.where()} (opset {self.opset}): {msg}")

    def normalize_axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            self.fail(f"axis {axis} is out of range for rank {rank}")
        return axis % rank if rank else 0

    def broadcast(self, *shapes: Shape) -> Shape:
        """Multidirectional (numpy) broadcasting; unequal symbolic dims are unified."""
        rank = max((len(s) for s in shapes), default=0)
        padded = [(sympy.Integer(1),) * (rank - len(s)) + tuple(s) for s in shapes]
        out = []
        for axis in range(rank):
            dim = sympy.Integer(1)
            for s in padded:
                d = s[axis]
                if d == 1:
                    continue
                if dim == 1:
                    dim = d
                elif dim != d:
                    dim = self._broadcast_pair(dim, d, axis - rank, padded)
            out.append(dim)
        return tuple(out)

    def _broadcast_pair(self, a, b, axis: int, shapes) -> sympy.Expr:
        """Two unequal non-1 dims on one axis. A symbol against a constant c may still be 1 at run
        time, so the result is c and the constraint ``s in {1, c}`` is only recorded; two symbolic
        dims are unified (TSCompiler's sibling inference: exporters broadcast equal extents)."""
        what = f"broadcast of axis {axis} ({' vs '.join(shape_str(p) for p in shapes)})"
        for sym, c in ((a, b), (b, a)):
            if c.is_Integer and not sym.is_Integer:
                lo, hi = self.symbols.bounds(sym)
                if lo > 1 and not lo <= int(c) <= hi:
                    self.fail(f"{what}: {sym} in [{lo}, {hi}] can be neither 1 nor {c}")
                if lo > 1:
                    return self.unify(sym, c, what)
                self.symbols.constraints.append(Constraint(sym, sympy.FiniteSet(1, c), f"{self.where()}: {what}",
                                                           "in"))
                return c
        return self.unify(a, b, what)


def to_symbolic(arr: np.ndarray) -> np.ndarray:
    """A concrete integer/bool/float numpy array as an object array of SymPy numbers."""
    flat = [as_expr(v) for v in np.asarray(arr).reshape(-1).tolist()]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(np.shape(arr))


def from_symbolic(arr: np.ndarray, dtype) -> np.ndarray | None:
    """The concrete array if every element is a number, else None."""
    flat = arr.reshape(-1)
    if not all(getattr(v, "is_number", isinstance(v, (int, float, bool))) for v in flat):
        return None
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        conv = [int(v) for v in flat]
    else:
        conv = [float(v) for v in flat]
    return np.array(conv, dtype=dtype).reshape(arr.shape)
