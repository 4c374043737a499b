"""Operators of the QOperator quantization format, expanded at import into the float computation
they quantize: ``QuantizeLinear(f(DequantizeLinear(x1), DequantizeLinear(x2), ...))``.

A model quantized in onnxruntime's QOperator format (``quantize_static(...,
quant_format=QuantFormat.QOperator)``, and most int8 models of the ONNX model zoo) keeps its
activations as 8-bit integers between operators that each take their quantized operands with their
scales and zero points and produce a quantized result: ONNX's ``QLinearMatMul`` and ``QLinearConv``
and onnxruntime's ``com.microsoft`` ``QLinearAdd``, ``QLinearMul``, ``QLinearSigmoid``,
``QLinearLeakyRelu``, ``QLinearSoftmax``, ``QLinearConcat``, ``QLinearWhere``,
``QLinearAveragePool``, ``QLinearGlobalAveragePool`` and ``QGemm``; and,
in models saved after onnxruntime's graph optimizer ran on a dynamically quantized one,
``MatMulIntegerToFloat`` and ``DynamicQuantizeMatMul``. Each is defined (onnxruntime's contrib
operator documentation, the ONNX operator definitions) as the float operator applied to the
dequantized operands, requantized with the output's scale and zero point.

That definition is what this module writes down, one body builder per operator, in the form of an
ONNX function body (:func:`body`): the import stage's function expansion
(:mod:`tscomp.graph.functions`) replaces the node by it, as it does the standard's function
operators. What follows is the QDQ form the graph stage already compiles: constant folding
dequantizes the weights, and :mod:`tscomp.graph.quantized_arithmetic` turns the activations' Q/DQ
pairs into fused elementwise arithmetic and the MatMul of a dequantized activation and weight into
the product of their integer parts times the scales. No new kernel and no op-specific code
downstream.

Numerics: onnxruntime's kernels compute the same quantity in another order of fp32 operations
(QLinearAdd as ``a * (a_scale / c_scale) + b * (b_scale / c_scale) + shift``, the GEMMs as int32
sums times ``a_scale * b_scale / y_scale``, QLinearSigmoid through a 256-entry table), so a result
whose exact value lies within an ulp of a rounding tie may come out one quantization step apart --
as onnxruntime's own optimized and plain sessions differ on the QDQ form.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from tscomp.errors import UnsupportedOperatorError

MS = "com.microsoft"


class _Body:
    """A function body under construction for one node: its formal inputs are the node's inputs
    (``in0``, ``in1``, ...; an absent optional input stays absent), its formal output ``out0``."""

    def __init__(self, node: onnx.NodeProto, opset: dict[str, int], types: dict[str, onnx.TypeProto]):
        self.node, self.opset, self.types = node, opset, types
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    # ------------------------------------------------------------------ the node's operands
    def present(self, k: int) -> bool:
        return k < len(self.node.input) and bool(self.node.input[k])

    def input(self, k: int) -> str:
        """The formal name of input ``k`` ("" where the node omits it)."""
        return f"in{k}" if self.present(k) else ""

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def required(self, name: str):
        """An attribute the operator's definition requires (a clear error where it is missing)."""
        if name not in self.attrs:
            raise UnsupportedOperatorError(f"node {self.node.name!r} ({self.node.op_type}) lacks its required "
                                           f"attribute {name!r}")
        return self.attrs[name]

    def elem_type(self, k: int) -> int | None:
        """ONNX element type of input ``k`` where type inference (or an initializer) tells it."""
        t = self.types.get(self.node.input[k]) if self.present(k) else None
        return t.tensor_type.elem_type if t is not None and t.tensor_type.elem_type else None

    def rank(self, k: int) -> int | None:
        t = self.types.get(self.node.input[k]) if self.present(k) else None
        return len(t.tensor_type.shape.dim) if t is not None and t.tensor_type.HasField("shape") else None

    # ------------------------------------------------------------------ emitting nodes
    def emit(self, op: str, inputs: list[str], **attrs) -> str:
        self._count += 1
        out = f"t{self._count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{self._count}", **attrs))
        return out

    def constant(self, array: np.ndarray) -> str:
        self._count += 1
        out = f"c{self._count}"
        self.nodes.append(helper.make_node("Constant", [], [out], name=f"Constant_{self._count}",
                                           value=onnx.numpy_helper.from_array(np.asarray(array), out)))
        return out

    def dequantize(self, x: int, axis: int | None = None) -> str:
        """DequantizeLinear of the triple (x, scale, zero point) at inputs ``x``, ``x+1``, ``x+2``;
        ``axis``: the axis a per-axis scale runs along (a per-tensor scale ignores it)."""
        extra = {} if axis is None else {"axis": axis}
        return self.emit("DequantizeLinear", [self.input(x), self.input(x + 1), self.input(x + 2)], **extra)

    def quantize(self, y: str, scale: int, zero_point: int, like: int) -> None:
        """The body's output: ``y`` quantized with the scale and zero point at inputs ``scale`` and
        ``zero_point``. Without a zero point the result has the type of input ``like``'s (the
        operators' "T", zero point 0); QuantizeLinear alone would default to uint8."""
        zp = self.input(zero_point)
        if not zp:
            zp = self.constant(np.zeros((), helper.tensor_dtype_to_np_dtype(self.operand_type(like))))
        self.nodes.append(helper.make_node("QuantizeLinear", [y, self.input(scale), zp], ["out0"],
                                           name="QuantizeLinear_out"))

    def output(self, y: str) -> None:
        self.nodes.append(helper.make_node("Identity", [y], ["out0"], name="Identity_out"))

    def operand_type(self, x: int) -> int:
        """The integer type of the quantized operand at input ``x``: its zero point's, else its own."""
        for k in (x + 2, x):
            t = self.elem_type(k)
            if t is not None:
                return t
        raise UnsupportedOperatorError(
            f"node {self.node.name!r} ({self.node.op_type}): the type of its quantized input "
            f"{self.node.input[x]!r} is unknown and no zero point gives it, so its output type is undetermined")

    def function(self) -> onnx.FunctionProto:
        formals = [f"in{k}" for k in range(len(self.node.input))]
        return helper.make_function(self.node.domain or "", self.node.op_type, formals, ["out0"], self.nodes,
                                    [helper.make_opsetid(d, v) for d, v in self.opset.items()])

    @property
    def onnx_opset(self) -> int:
        return self.opset.get("", onnx.defs.onnx_opset_version())


# ---------------------------------------------------------------------- one builder per operator
def _qlinear_matmul(b: _Body) -> None:
    # a: per-tensor or per-row scale; b: per-tensor or per-column
    b.quantize(b.emit("MatMul", [b.dequantize(0, axis=-2), b.dequantize(3, axis=-1)]), 6, 7, like=0)


def _qlinear_conv(b: _Body) -> None:
    inputs = [b.dequantize(0), b.dequantize(3, axis=0)]      # the weight per output channel
    if b.present(8):        # int32 bias with scale x_scale * w_scale and zero point 0
        inputs.append(b.emit("DequantizeLinear", [b.input(8), b.emit("Mul", [b.input(1), b.input(4)])], axis=0))
    b.quantize(b.emit("Conv", inputs, **b.attrs), 6, 7, like=0)


def _qgemm(b: _Body) -> None:
    trans_b = int(b.attr("transB", 0))
    alpha = float(b.attr("alpha", 1.0))
    inputs = [b.dequantize(0), b.dequantize(3, axis=0 if trans_b else 1)]
    if b.present(6):        # int32 bias added to the integer sums, so scaled like them (alpha included)
        inputs.append(b.emit("DequantizeLinear", [b.input(6), b.emit("Mul", [b.input(1), b.input(4)])], axis=-1))
    y = b.emit("Gemm", inputs, alpha=alpha, beta=alpha, transA=int(b.attr("transA", 0)), transB=trans_b)
    if b.present(7):
        b.quantize(y, 7, 8, like=0)
    else:                   # no output scale: QGemm's result is the float
        b.output(y)


def _binary(op: str) -> Callable[[_Body], None]:
    def build(b: _Body) -> None:
        b.quantize(b.emit(op, [b.dequantize(0), b.dequantize(3)]), 6, 7, like=0)
    return build


def _unary(op: str, **attr_defaults) -> Callable[[_Body], None]:
    def build(b: _Body) -> None:
        attrs = {k: b.attr(k, v) for k, v in attr_defaults.items()}
        b.quantize(b.emit(op, [b.dequantize(0)], **attrs), 3, 4, like=0)
    return build


def _qlinear_softmax(b: _Body) -> None:
    x, axis = b.dequantize(0), int(b.attr("axis", -1))
    if int(b.required("opset")) < 13 <= b.onnx_opset:
        # Softmax before opset 13 normalizes the input flattened to 2-D at ``axis``
        flat = b.emit("Flatten", [x], axis=axis)
        y = b.emit("Reshape", [b.emit("Softmax", [flat], axis=1), b.emit("Shape", [x])])
    else:
        y = b.emit("Softmax", [x], axis=axis)
    b.quantize(y, 3, 4, like=0)


def _qlinear_concat(b: _Body) -> None:
    parts = [b.dequantize(k) for k in range(2, len(b.node.input), 3)]
    b.quantize(b.emit("Concat", parts, axis=int(b.required("axis"))), 0, 1, like=2)


def _qlinear_where(b: _Body) -> None:
    b.quantize(b.emit("Where", [b.input(0), b.dequantize(1), b.dequantize(4)]), 7, 8, like=1)


def _channels_first(b: _Body, x: str) -> tuple[str, list[int] | None]:
    """``x`` in NCHW order, and the permutation back, for a ``channels_last`` pooling operator."""
    if not int(b.attr("channels_last", 0)):
        return x, None
    rank = b.rank(0)
    if rank is None:
        raise UnsupportedOperatorError(f"node {b.node.name!r} ({b.node.op_type}, channels_last): the rank of "
                                       f"its input {b.node.input[0]!r} is unknown")
    to_first = [0, rank - 1] + list(range(1, rank - 1))
    return b.emit("Transpose", [x], perm=to_first), [0] + list(range(2, rank)) + [1]


def _pool(op: str, attr_names: tuple[str, ...]) -> Callable[[_Body], None]:
    def build(b: _Body) -> None:
        x, back = _channels_first(b, b.dequantize(0))
        y = b.emit(op, [x], **{k: b.attr(k) for k in attr_names if k in b.attrs})
        b.quantize(y if back is None else b.emit("Transpose", [y], perm=back), 3, 4, like=0)
    return build


def _scaled_integer_product(b: _Body, product: str, scale: str, bias: int) -> None:
    """The int32 product as float times its scale, plus the optional float bias at input ``bias``."""
    y = b.emit("Mul", [b.emit("Cast", [product], to=TensorProto.FLOAT), scale])
    b.output(b.emit("Add", [y, b.input(bias)]) if b.present(bias) else y)


def _matmul_integer_to_float(b: _Body) -> None:
    product = b.emit("MatMulInteger", [b.input(0), b.input(1), b.input(4), b.input(5)])
    _scaled_integer_product(b, product, b.emit("Mul", [b.input(2), b.input(3)]), bias=6)


def _dynamic_quantize_matmul(b: _Body) -> None:
    # A quantized per call as DynamicQuantizeLinear does (uint8, its own range)
    aq, a_scale, a_zp = (f"t_dq{k}" for k in range(3))
    b.nodes.append(helper.make_node("DynamicQuantizeLinear", [b.input(0)], [aq, a_scale, a_zp],
                                    name="DynamicQuantizeLinear_a"))
    product = b.emit("MatMulInteger", [aq, b.input(1), a_zp, b.input(3)])
    _scaled_integer_product(b, product, b.emit("Mul", [a_scale, b.input(2)]), bias=4)


#: (domain, operator) -> the builder of its body
BUILDERS: dict[tuple[str, str], Callable[[_Body], None]] = {
    ("", "QLinearMatMul"): _qlinear_matmul,
    ("", "QLinearConv"): _qlinear_conv,
    (MS, "QGemm"): _qgemm,
    (MS, "QLinearAdd"): _binary("Add"),
    (MS, "QLinearMul"): _binary("Mul"),
    (MS, "QLinearSigmoid"): _unary("Sigmoid"),
    (MS, "QLinearLeakyRelu"): _unary("LeakyRelu", alpha=0.01),
    (MS, "QLinearSoftmax"): _qlinear_softmax,
    (MS, "QLinearConcat"): _qlinear_concat,
    (MS, "QLinearWhere"): _qlinear_where,
    (MS, "QLinearGlobalAveragePool"): _pool("GlobalAveragePool", ()),
    (MS, "QLinearAveragePool"): _pool("AveragePool", ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape",
                                                      "pads", "strides")),
    (MS, "MatMulIntegerToFloat"): _matmul_integer_to_float,
    (MS, "DynamicQuantizeMatMul"): _dynamic_quantize_matmul,
}


def body(node: onnx.NodeProto, opset: dict[str, int], types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """The node's definition as a function body over standard operators, or None when the
    operator is not one of :data:`BUILDERS`."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    build = BUILDERS.get((domain, node.op_type))
    if build is None:
        return None
    b = _Body(node, opset, types)
    build(b)
    return b.function()


__all__ = ["BUILDERS", "body"]
