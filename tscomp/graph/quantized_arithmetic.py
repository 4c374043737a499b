"""Quantized operators as the arithmetic the kernel families compile (a graph-stage rewrite).

A quantized model's integer operators have no kernel family of their own; each is rewritten into
float arithmetic that reproduces its reference (:mod:`tscomp.graph.ops.quantization`), so the
GEMM, Conv, row and elementwise families compile the model like any other and nothing runs on
the numpy fallback:

* **per-tensor QuantizeLinear** (a scalar scale and zero point, constants or computed at run
  time): ``Cast(Min(Max(Round(x / scale) + zero_point, qmin), qmax))`` -- or, for a view
  (Reshape, Transpose, ...) of a DequantizeLinear with the same scale and zero point, the view of
  its quantized input, which is what that arithmetic gives bit for bit; **per-tensor
  DequantizeLinear** of an 8- or 16-bit tensor: ``(Cast(x) - zero_point) * scale`` -- the
  activation Q/DQ pairs of a QDQ model fuse into their neighbours' kernels;
* **DynamicQuantizeLinear**: a ReduceMin and a ReduceMax over the whole tensor, the scale and
  zero point from them in fp32 (scale 1 for an all-zero tensor, as onnxruntime), then the
  per-tensor quantization above -- the same fp32 operations in the same order as onnxruntime, so
  the quantized tensor is bit-identical;
* **MatMulInteger / ConvInteger** with a constant B (W) whose int32 result is only cast to float
  (every quantizer's pattern: ``Cast -> Mul(scale) -> Add(bias)``): a float MatMul / Conv of
  ``Cast(A) - a_zero_point`` and the constant ``B - b_zero_point`` in float32 -- for a MatMul whose
  A zero point is computed at run time (DynamicQuantizeLinear's), ``(Cast(A) - c) . W + (c -
  a_zero_point) * colsum(W)`` with c the middle of A's range, so that A spans 256 values from a
  constant (:func:`_centred_matmul`: what an int8 GEMM packs). Every operand is an
  integer below 2^8 in magnitude, so every partial sum below 2^24 is exact in fp32 (and in bf16
  operands); a sum beyond that rounds as an fp32 accumulation does, where onnxruntime rounds the
  exact int32 once in the Cast. A MatMulInteger whose int32 result is used as an integer stays as
  it is (the exact numpy reference runs it);
* **a MatMul of two dequantized operands** (a QDQ model's: an activation's per-tensor
  DequantizeLinear, a constant int8 weight's per-tensor or per-column one): the MatMul of their
  integer parts, times the product of their scales -- the form the kernel families run in bf16
  (:func:`tscomp.codegen.families.gemm_target`), where onnxruntime's optimizer fuses the same
  pattern into an integer GEMM. The sums are exact, rounded once by the scale, where a float
  MatMul of the dequantized values rounds every product: the two differ by fp32 rounding;
* **a Conv of two dequantized operands** (a QDQ or QOperator model's: an activation's per-tensor
  DequantizeLinear, a constant int8 weight's per-tensor or per-output-channel one, a float bias):
  the Conv of their integer parts (the image's zero padding is the activation's zero point, the
  integer 0) times both scales plus the bias, which the conv family runs on int8 instructions
  (:func:`tscomp.codegen.families.conv_target`);
* **a Gather of a dequantized constant** (a QDQ embedding table): the Gather of its integer part,
  then the scale -- the table stays int8 in the artifact, and one too large to fold at compile
  time (BERT-base's 23M-element word table) is no longer dequantized whole on every call.

Every other form (other per-axis or blocked scales, 32-bit quantized types, an integer product of
two activations) is left to the operators' references, which the compile summary names.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import TensorProto, helper

from tscomp.graph.ir import Graph, Node
from tscomp.graph.ops.quantization import _output_dtype, minus_zero_point
from tscomp.graph.ops.registry import REGISTRY

F32 = np.dtype(np.float32)
#: quantized element types whose values a float32 holds exactly
NARROW_TYPES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))


class _Emitter:
    """Appends the nodes of one rewrite, naming each new value after the node it replaces.

    ``twins`` maps a quantized value this pass computed to the float32 value it was cast from
    (integral and inside the type's range, so casting it back is exact): a contraction that reads
    the quantized value as float reads the twin, and the integer tensor is never stored."""

    def __init__(self, graph: Graph, stem: str, twins: dict[str, str]):
        self.graph, self.stem, self.nodes, self.twins = graph, stem, [], twins

    def const(self, tag: str, value) -> str:
        arr = np.asarray(value)
        return self.graph.add_value(f"{self.stem}/{tag}", arr.dtype, arr.shape, arr)

    def op(self, op_type: str, inputs: list[str], dtype, shape, out: str | None = None, **attrs) -> str:
        tag = f"{self.stem}/{op_type.lower()}{len(self.nodes)}"
        if not out:
            out = self.graph.add_value(tag, dtype, shape)
        self.nodes.append(Node(tag, op_type, inputs, [out], attrs))
        return out

    def as_float(self, name: str) -> str:
        """``name`` as float32 (its :attr:`~tscomp.graph.ir.Value.integer_range` recorded): a
        constant converted here, a run-time value through a Cast."""
        v = self.graph.values[name]
        if name in self.twins:
            return self.twins[name]
        if v.const is not None:
            out = self.const(f"{name}_f32", np.asarray(v.const, F32))
            self.graph.values[out].integer_range = (int(np.min(v.const)), int(np.max(v.const)))
            return out
        out = self.op("Cast", [name], F32, v.shape, to=TensorProto.FLOAT)
        info = np.iinfo(v.dtype)
        self.graph.values[out].integer_range = (int(info.min), int(info.max))
        return out

    def scalar_float(self, name: str) -> str:
        """A one-element integer tensor (a zero point) as a rank-0 float32."""
        return _reshaped_scalar(self, self.as_float(name))

    def shifted(self, x: str, zero_point: str) -> str:
        """``x - zero_point`` for two float forms of integers, its range from theirs."""
        (a_lo, a_hi), (z_lo, z_hi) = (self.graph.values[n].integer_range for n in (x, zero_point))
        out = self.op("Sub", [x, zero_point], F32, self.graph.values[x].shape)
        self.graph.values[out].integer_range = (a_lo - z_hi, a_hi - z_lo)
        return out

    def quantize(self, x: str, scale: str, zero_point: str | None, qtype: np.dtype, out: str) -> str:
        """``saturate(round(x / scale) + zero_point)`` as ``qtype`` (every rounding half to even)."""
        shape = self.graph.values[x].shape
        info = np.iinfo(qtype)
        q = self.op("Round", [self.op("Div", [x, scale], F32, shape)], F32, shape)
        if zero_point is not None:
            q = self.op("Add", [q, zero_point], F32, shape)
        q = self.op("Max", [q, self.const("qmin", F32.type(info.min))], F32, shape)
        q = self.op("Min", [q, self.const("qmax", F32.type(info.max))], F32, shape)
        self.twins[out] = q
        self.graph.values[q].integer_range = (int(info.min), int(info.max))
        return self.op("Cast", [q], qtype, shape, out=out, to=helper.np_dtype_to_tensor_dtype(qtype))

    def integers_through(self, op: Node, integers: str, out: str, qtype: np.dtype) -> None:
        """``out`` (of ``qtype``) as ``op`` -- a view or an element-selecting op, which moves values
        without changing them -- applied to ``integers``, the float form of a quantized tensor: the
        float result is ``out``'s twin (same integer range), the integer tensor its Cast."""
        shape = self.graph.values[out].shape
        moved = self.op(op.op_type, [integers, *op.inputs[1:]], F32, shape, **op.attrs)
        self.graph.values[moved].integer_range = self.graph.values[integers].integer_range
        self.twins[out] = moved
        self.op("Cast", [moved], qtype, shape, out=out, to=helper.np_dtype_to_tensor_dtype(qtype))


def _scalar(graph: Graph, name: str) -> bool:
    v = graph.values[name]
    return v.shape is not None and all(d == 1 for d in v.shape)


def _input(node: Node, i: int) -> str:
    return node.inputs[i] if len(node.inputs) > i else ""


# ---------------------------------------------------------------------------- Q / DQ, per tensor
def _quantize(p: "_Pass", node: Node) -> list[Node] | None:
    graph = p.graph
    x, scale, zp = node.inputs[0], node.inputs[1], _input(node, 2)
    xv = graph.values[x]
    qtype = np.dtype(graph.values[node.outputs[0]].dtype)
    if xv.dtype != F32 or graph.values[scale].dtype != F32 or qtype not in NARROW_TYPES \
            or not _scalar(graph, scale) or (zp and not _scalar(graph, zp)) or not xv.shape:
        return None
    e = p.emitter(node)
    source = _requantized_view(p, node)
    if source is not None:           # Q(view(DQ(q))) with DQ's scale and zero point: view(q), exactly
        view, q = source
        e.integers_through(view, e.as_float(q), node.outputs[0], qtype)
        return e.nodes
    e.quantize(x, _reshaped_scalar(e, scale), e.scalar_float(zp) if zp else None, qtype, out=node.outputs[0])
    return e.nodes


def _requantized_view(p: "_Pass", node: Node) -> tuple[Node, str] | None:
    """(the view, the quantized tensor q) when ``node`` quantizes a view (Reshape, Transpose, ...) of
    ``DequantizeLinear(q)`` with the same constant scale and zero point: QDQ graphs requantize after
    every view, and ``round((q - z) * s / s) + z`` is ``q`` for a normal scale (the two roundings
    move ``q - z``, at most 255, by far less than 1/2)."""
    graph = p.graph
    view = p.producers.get(node.inputs[0])
    opdef = REGISTRY.get(("", view.op_type)) if view is not None and not view.domain else None
    source = p.requantizable.get(view.inputs[0]) if opdef is not None and opdef.view_rule is not None else None
    if source is None or len(view.outputs) != 1 or graph.values[view.outputs[0]].dtype != F32:
        return None
    q, dq_scale, dq_zp = source
    same = [(dq_scale, node.inputs[1]), (dq_zp, _input(node, 2))]
    values = [[graph.values[n].const if n else np.zeros((), graph.values[q].dtype) for n in pair] for pair in same]
    if any(a is None or b is None or not np.array_equal(a.reshape(-1), b.reshape(-1)) for a, b in values) \
            or graph.values[node.outputs[0]].dtype != graph.values[q].dtype:
        return None
    s = float(np.asarray(values[0][0]).reshape(-1)[0])
    return (view, q) if np.isfinite(s) and s >= np.finfo(np.float32).tiny else None


def _dequantize(p: "_Pass", node: Node) -> list[Node] | None:
    graph = p.graph
    x, scale, zp = node.inputs[0], node.inputs[1], _input(node, 2)
    xv = graph.values[x]
    if xv.const is not None and (constant := _constant_dequantization(p, node)) is not None:
        # too large to fold: a MatMul or Gather reads the integer part; anything else this product
        e = p.emitter(node)
        e.op("Mul", list(constant), F32, xv.shape, out=node.outputs[0])
        return e.nodes
    out_type = _output_dtype(node.attrs.get("output_dtype", 0), graph.values[scale].dtype)
    if np.dtype(xv.dtype) not in NARROW_TYPES or out_type != F32 or graph.values[scale].dtype != F32 \
            or not _scalar(graph, scale) or (zp and not _scalar(graph, zp)) or not xv.shape:
        return None
    e = p.emitter(node)
    v = e.as_float(x)
    if zp:
        v = e.shifted(v, e.scalar_float(zp))
    p.requantizable[node.outputs[0]] = (x, node.inputs[1], zp)
    scale = _reshaped_scalar(e, scale)
    e.op("Mul", [v, scale], F32, xv.shape, out=node.outputs[0])
    p.dequantized[node.outputs[0]] = (v, scale)
    return e.nodes


def _reshaped_scalar(e: _Emitter, name: str) -> str:
    """A one-element tensor as a rank-0 one, so broadcasting it never changes the result's rank."""
    v = e.graph.values[name]
    if not v.shape:
        return name
    if v.const is not None:
        out = e.const(f"{name}_scalar", np.asarray(v.const).reshape(()))
    else:
        out = e.op("Reshape", [name, e.const("scalar_shape", np.zeros(0, np.int64))], v.dtype, ())
    e.graph.values[out].integer_range = v.integer_range
    return out


# ---------------------------------------------------------------------------- DynamicQuantizeLinear
def _dynamic_quantize(p: "_Pass", node: Node) -> list[Node] | None:
    """onnxruntime's order of fp32 operations (:func:`~tscomp.graph.ops.quantization.dynamic_quantize_parameters`)."""
    graph, x = p.graph, node.inputs[0]
    if not graph.values[x].shape:
        return None
    e = p.emitter(node)
    zero, outs = e.const("zero", F32.type(0)), list(node.outputs) + [""] * (3 - len(node.outputs))
    lo = e.op("Min", [e.op("ReduceMin", [x], F32, (), keepdims=0), zero], F32, ())
    hi = e.op("Max", [e.op("ReduceMax", [x], F32, (), keepdims=0), zero], F32, ())
    span = e.op("Sub", [hi, lo], F32, ())
    flat = e.op("Equal", [span, zero], np.bool_, ())
    scale = e.op("Where", [flat, e.const("one", F32.type(1)), e.op("Div", [span, e.const("qrange", F32.type(255))],
                                                                    F32, ())], F32, (), out=outs[1])
    start = e.op("Sub", [zero, e.op("Div", [lo, scale], F32, ())], F32, ())
    start = e.op("Min", [e.op("Max", [start, zero], F32, ()), e.const("qmax", F32.type(255))], F32, ())
    zp = e.op("Round", [start], F32, ())
    graph.values[zp].integer_range = (0, 255)
    if outs[2]:
        e.op("Cast", [zp], np.uint8, (), out=outs[2], to=TensorProto.UINT8)
        e.twins[outs[2]] = zp
    e.quantize(x, scale, zp, np.dtype(np.uint8), out=outs[0])
    return e.nodes


# ---------------------------------------------------------------------------- MatMulInteger, ConvInteger
def _float_contraction(op_type: str, weight_axis: Callable[[np.ndarray], int]):
    """The rewrite of ``op_type``Integer into ``op_type`` when its second operand is a constant and
    its result is only cast to float (the Casts it replaces join ``p.replaced``)."""
    def rewrite(p: "_Pass", node: Node) -> list[Node] | None:
        graph = p.graph
        a, b, a_zp, b_zp = (node.inputs + ["", ""])[:4]
        users = p.consumers.get(node.outputs[0], [])
        weight = graph.values[b].const
        if weight is None or (b_zp and graph.values[b_zp].const is None) or (a_zp and not _scalar(graph, a_zp)) \
                or not users or node.outputs[0] in graph.outputs \
                or any(u.op_type != "Cast" or u.attrs.get("to") != TensorProto.FLOAT for u in users):
            return None
        shifted = minus_zero_point(weight, graph.values[b_zp].const if b_zp else None, weight_axis(weight))
        e = p.emitter(node)
        lhs = e.as_float(a)
        out = users[0].outputs[0]
        weight_f32 = e.const("weight_f32", shifted.astype(F32))
        if a_zp and graph.values[a_zp].const is None and op_type == "MatMul" and shifted.ndim == 2:
            _centred_matmul(e, lhs, e.scalar_float(a_zp), weight_f32, shifted, out)
        else:
            if a_zp:
                lhs = e.shifted(lhs, e.scalar_float(a_zp))
            e.op(op_type, [lhs, weight_f32], F32, graph.values[out].shape, out=out, **node.attrs)
        for other in users[1:]:          # every further Cast reads the same float result
            e.nodes.append(Node(other.name, "Identity", [out], list(other.outputs)))
        p.replaced.update(id(u) for u in users)
        return e.nodes
    return rewrite


def _centred_matmul(e: _Emitter, a: str, zero_point: str, weight: str, w: np.ndarray, out: str) -> None:
    """``(a - zero_point) . W`` for a zero point known only at run time (DynamicQuantizeLinear's) as
    ``(a - c) . W + (c - zero_point) * colsum(W)`` with ``c`` the middle of a's range: the GEMM's A
    then spans a's 256 values from a constant offset -- what an int8 GEMM packs as bytes -- and the
    run-time zero point only scales a constant vector in the epilogue. Subtracting the zero point
    first would leave A anywhere in [-255, 255]. Every term is an integer: the sums are exact
    while below 2^24, as before."""
    graph = e.graph
    lo, hi = graph.values[a].integer_range
    centre = e.const("centre", F32.type((lo + hi + 1) // 2))
    graph.values[centre].integer_range = ((lo + hi + 1) // 2,) * 2
    shape = graph.values[out].shape
    product = e.op("MatMul", [e.shifted(a, centre), weight], F32, shape)
    colsum = e.const("weight_colsum", w.sum(axis=0, dtype=np.int64).astype(F32))
    offset = e.op("Sub", [centre, zero_point], F32, ())
    e.op("Add", [product, e.op("Mul", [offset, colsum], F32, (w.shape[1],))], F32, shape, out=out)


# ---------------------------------------------------------------------------- MatMul of dequantized operands
def _constant_dequantization(p: "_Pass", node: Node) -> tuple[str, str] | None:
    """Record (and return) the integer part and scale of a constant's DequantizeLinear: per tensor,
    or along the last axis (a weight's columns, an embedding table's features)."""
    graph = p.graph
    x, scale, zp = (graph.values[i].const if i else None for i in (node.inputs + ["", ""])[:3])
    out = graph.values[node.outputs[0]]
    if x is None or scale is None or (_input(node, 2) and zp is None) or not x.ndim \
            or np.dtype(x.dtype) not in NARROW_TYPES or out.dtype != F32 or scale.dtype != F32 \
            or node.attrs.get("block_size", 0):
        return None
    axis = int(node.attrs.get("axis", 1)) % x.ndim
    per_channel = scale.size > 1 and axis == 0 and x.ndim >= 3 and scale.size == x.shape[0]
    per_column = scale.size > 1 and not per_channel
    if per_column and not (axis == x.ndim - 1 and scale.size == x.shape[-1]):
        return None
    e = p.emitter(node)
    ints = minus_zero_point(x, zp, 0 if per_channel else x.ndim - 1)
    part = e.const("integer_part", ints.astype(F32))
    graph.values[part].integer_range = (int(ints.min()), int(ints.max()))
    scale = e.const("scale", scale.reshape(-1) if scale.size > 1 else scale.reshape(()))
    if per_channel:         # a Conv weight's output channels: only a Conv reads it (_dequantized_conv)
        p.channel_dequantized[node.outputs[0]] = part, scale
        return None
    p.dequantized[node.outputs[0]] = part, scale
    return p.dequantized[node.outputs[0]]


def _dequantized_conv(p: "_Pass", node: Node) -> list[Node] | None:
    """``Conv(DQ(x), DQ(W), bias)`` (a QDQ or QOperator model's: an activation's per-tensor
    DequantizeLinear, a constant int8 weight's per-tensor or per-output-channel one, a float bias) as
    ``Conv(x's integer part, W's integer part) * x_scale * W_scale[oc] + bias``: the Conv of two
    integer operands, exact, which the conv family runs on int8 instructions
    (:func:`tscomp.codegen.families.conv_target`), the scales and the bias its epilogue."""
    graph = p.graph
    x, w, bias = (node.inputs + ["", ""])[:3]
    a, a_scale = p.dequantized.get(x, (None, None))
    # per output channel, or per tensor (a per-column scale, along the weight's last axis, is neither)
    part, w_scale = p.channel_dequantized.get(w) or p.dequantized.get(w) or (None, None)
    out = graph.values[node.outputs[0]]
    if a is None or part is None or graph.values[a].const is not None or graph.values[part].const is None \
            or graph.values[a_scale].shape or len(out.shape) < 3 \
            or (w not in p.channel_dequantized and graph.values[w_scale].shape):
        return None
    channels = graph.values[part].shape[0]
    bias_const = graph.values[bias].const if bias else None
    if bias and (bias_const is None or bias_const.dtype != F32 or bias_const.shape != (channels,)):
        return None
    per_channel = (channels,) + (1,) * (len(out.shape) - 2)      # broadcast along [N, OC, *spatial]
    e = p.emitter(node)
    acc = e.op("Conv", [a, part], F32, out.shape, **node.attrs)
    w_scales = graph.values[w_scale].const
    scale = e.const("channel_scale", w_scales.reshape(per_channel if w_scales.size > 1 else ()))
    scaled = e.op("Mul", [e.op("Mul", [acc, a_scale], F32, out.shape), scale], F32, out.shape,
                  out=None if bias else node.outputs[0])
    if bias:
        e.op("Add", [scaled, e.const("channel_bias", bias_const.reshape(per_channel))], F32, out.shape,
             out=node.outputs[0])
    return e.nodes


def _dequantized_gather(p: "_Pass", node: Node) -> list[Node] | None:
    """``Gather(DQ(table), ids)`` as ``DQ(Gather(table, ids))``: the rows of the integer table, then
    their scale (an embedding table stays int8, and only the gathered rows are dequantized)."""
    graph = p.graph
    part, scale = p.dequantized.get(node.inputs[0], (None, None))
    axis = int(node.attrs.get("axis", 0)) % max(len(graph.values[node.inputs[0]].shape), 1)
    if part is None or graph.values[part].const is None or \
            (graph.values[scale].shape and axis == len(graph.values[part].shape) - 1):
        return None                     # a per-column scale must not move with the gathered axis
    e = p.emitter(node)
    out = graph.values[node.outputs[0]]
    rows = e.op("Gather", [part, node.inputs[1]], F32, out.shape, **node.attrs)
    graph.values[rows].integer_range = graph.values[part].integer_range
    e.op("Mul", [rows, scale], F32, out.shape, out=node.outputs[0])
    return e.nodes


def _dequantized_matmul(p: "_Pass", node: Node) -> list[Node] | None:
    graph = p.graph
    (a, a_scale), (b, b_scale) = (p.dequantized.get(i, (None, None)) for i in node.inputs[:2])
    if a is None or b is None or graph.values[a].const is not None or graph.values[b].const is None:
        return None
    e = p.emitter(node)
    out = graph.values[node.outputs[0]]
    acc = e.op("MatMul", [a, b], F32, out.shape)
    # two epilogue multiplies (no group of its own for the product of the scales)
    e.op("Mul", [e.op("Mul", [acc, a_scale], F32, out.shape), b_scale], F32, out.shape, out=node.outputs[0])
    return e.nodes


def _selection_of_quantized(p: "_Pass", node: Node) -> list[Node] | None:
    """A view (Reshape, Transpose, ...) or an element-selecting operator (MaxPool, ReduceMax, ...)
    of a quantized value this pass computed runs on the value's float twin: each picks elements by
    position or by order, which the integer-to-float cast preserves, so the twin's result holds the
    same integers and becomes the result's twin (a QOperator model max-pools and reshapes uint8
    tensors between its quantized operators)."""
    graph = p.graph
    x = node.inputs[0] if node.inputs else ""
    opdef = REGISTRY.get(("", node.op_type))
    if x not in p.twins or opdef is None or not (opdef.selects_elements or opdef.view_rule is not None) \
            or len(node.outputs) != 1 or any(i in p.twins for i in node.inputs[1:]):
        return None
    qtype = graph.values[node.outputs[0]].dtype
    if qtype != graph.values[x].dtype:
        return None
    e = p.emitter(node)
    e.integers_through(node, p.twins[x], node.outputs[0], qtype)
    return e.nodes


#: op type -> its rewrite, any other op :func:`_selection_of_quantized` (a weight's zero points lie
#: per column of a MatMul's B, per output channel of a Conv's W)
REWRITES = {"QuantizeLinear": _quantize, "DequantizeLinear": _dequantize, "DynamicQuantizeLinear": _dynamic_quantize,
            "MatMulInteger": _float_contraction("MatMul", lambda w: w.ndim - 1),
            "ConvInteger": _float_contraction("Conv", lambda w: 0),
            "MatMul": _dequantized_matmul, "Gather": _dequantized_gather, "Conv": _dequantized_conv}


class _Pass:
    """What one pass over the graph shares between rewrites: the consumers and producers of every
    value, the float twins of the quantized values it computed, the (integer part, scale) of every
    dequantized value it has seen (and the operands of the run-time ones), and the nodes a rewrite
    replaced besides its own."""

    def __init__(self, graph: Graph):
        self.graph, self.consumers, self.producers = graph, graph.consumers(), graph.producers()
        self.twins: dict[str, str] = {}
        self.dequantized: dict[str, tuple[str, str]] = {}
        #: a constant Conv weight's DequantizeLinear per output channel -> (integer part, scale)
        self.channel_dequantized: dict[str, tuple[str, str]] = {}
        #: a run-time DequantizeLinear's output -> (its quantized input, scale, zero point names)
        self.requantizable: dict[str, tuple[str, str, str]] = {}
        self.replaced: set[int] = set()

    def emitter(self, node: Node) -> _Emitter:
        return _Emitter(self.graph, node.name, self.twins)


def quantized_ops_as_arithmetic(graph: Graph) -> int:
    """Rewrite every quantized operator this module has a form for; returns how many. Runs before
    the folded nodes leave the graph: a constant weight's DequantizeLinear is still there to say
    what integers and scales the folded weight came from."""
    p = _Pass(graph)
    rewritten = 0
    nodes: list[Node] = []
    for node in graph.nodes:
        if id(node) in p.replaced:
            continue
        rewrite = None if node.domain else REWRITES.get(node.op_type, _selection_of_quantized)
        if rewrite is not None and graph.folded(node):
            if node.op_type == "DequantizeLinear":
                _constant_dequantization(p, node)
            rewrite = None                  # folded at compile time: nothing runs
        new = rewrite(p, node) if rewrite is not None else None
        if new is None:
            nodes.append(node)
            continue
        nodes += new
        rewritten += 1
    graph.nodes = nodes      # a contraction's Casts came after it: its float result still precedes their readers
    return rewritten


__all__ = ["quantized_ops_as_arithmetic"]
