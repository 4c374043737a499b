"""onnxruntime as an exact reference for integer GEMMs, also on CPUs where its uint8 x int8
kernels saturate (what ``tscomp bench`` and the quantized tests compare tscomp with).

Without VNNI (AVX2 alone, AVX-512 without avx512_vnni: AMD Zen 3, Intel Skylake-SP), onnxruntime's
MLAS computes uint8 x int8 inner products with ``vpmaddubsw``, which adds each pair of products
into a saturating int16: 255 * 127 * 2 = 64,770 reads 32,767 (onnxruntime#6004, oneDNN's "nuances
of int8 computations"). The ONNX operators define exact int32 sums, and tscomp computes them
exactly, so there the plain session is not a reference. Its uint8 x uint8 and int8 x int8 kernels
are exact (they widen to int16 before ``vpmaddwd``), and ``b - b_zero_point`` is unchanged when
both are shifted by 128 into uint8 -- the rewrite onnxruntime itself applies to QAttention under
``session.x64quantprecision``. Where :func:`u8s8_saturates` (a probe: one saturating product,
asked of this machine's onnxruntime) and the model has such a GEMM, :func:`reference_model` is the
model with every int8 second operand of a uint8-first-operand integer GEMM (and its zero point)
shifted to uint8 (:func:`exact_u8s8`); elsewhere the model as it is, so machines with VNNI still
check tscomp against onnxruntime's own u8 x s8 kernels. :func:`onnxruntime_source` is what a
reference session opens: that model, serialized, or the one given.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

#: integer GEMM operators: (first operand, its zero point, second operand, its zero point) input
#: positions; None for a first operand the operator quantizes to uint8 itself
_OPERANDS = {
    ("com.microsoft", "DynamicQuantizeMatMul"): (None, None, 1, 3),
    ("", "MatMulInteger"): (0, 2, 1, 3),
    ("", "ConvInteger"): (0, 2, 1, 3),
    ("", "QLinearMatMul"): (0, 2, 3, 5),
    ("", "QLinearConv"): (0, 2, 3, 5),
    ("com.microsoft", "QGemm"): (0, 2, 3, 5),
    ("com.microsoft", "MatMulIntegerToFloat"): (0, 4, 1, 5),
}


@functools.lru_cache(maxsize=None)
def u8s8_saturates() -> bool:
    """Whether this machine's onnxruntime sums uint8 x int8 products through a saturating int16."""
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("a", TP.UINT8, None),
                                                 helper.make_tensor_value_info("b", TP.INT8, None)],
                              [helper.make_tensor_value_info("y", TP.INT32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    k = 64
    y = sess.run(None, {"a": np.full((4, k), 255, np.uint8), "b": np.full((k, 16), 127, np.int8)})[0]
    return int(y[0, 0]) != 255 * 127 * k


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {i.name: i.data_type for i in g.initializer}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    return types


#: the uint8 zero point standing for an absent int8 one
_ZERO_AT_128 = "exact_u8s8__zero_point_128"


def _first_operand_type(node, types, first: int, first_zp: int):
    """The first operand's element type: inferred, else its zero point's (same type by definition)."""
    if first is None:
        return TP.UINT8
    for position in (first, first_zp):
        if position < len(node.input) and node.input[position] in types:
            return types[node.input[position]]
    return None


def _shifted(name: str, graph, inits: dict, done: dict) -> str:
    """A uint8 value equal to int8 ``name`` + 128: a new initializer, else Cast/Add/Cast nodes
    (appended now, before the consumer being rewritten: the graph stays in topological order);
    made once per value (``done``), however many GEMMs read it."""
    if name in done:
        return done[name]
    out = done[name] = f"{name}__u8"
    if name in inits:
        array = numpy_helper.to_array(inits[name]).astype(np.int16) + 128
        graph.initializer.append(numpy_helper.from_array(array.astype(np.uint8), out))
        return out
    offset = f"{out}__128"
    graph.initializer.append(numpy_helper.from_array(np.array(128, np.int32), offset))
    graph.node.extend([helper.make_node("Cast", [name], [f"{out}__i32"], to=TP.INT32),
                       helper.make_node("Add", [f"{out}__i32", offset], [f"{out}__sum"]),
                       helper.make_node("Cast", [f"{out}__sum"], [out], to=TP.UINT8)])
    return out


def exact_u8s8(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its uint8 x int8 integer GEMMs as uint8 x uint8 ones of the same result (a
    copy where it has any)."""
    return _shifted_gemms(model)[0]


def _shifted_gemms(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(:func:`exact_u8s8` of ``model``, how many GEMMs it rewrote)."""
    if not any((n.domain, n.op_type) in _OPERANDS for n in model.graph.node):
        return model, 0
    given, model = model, onnx.ModelProto.FromString(model.SerializeToString())
    types = _element_types(model)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    original = list(graph.node)
    del graph.node[:]
    rewritten, done = 0, {}
    for node in original:
        positions = _OPERANDS.get((node.domain, node.op_type))
        if positions is not None:
            first, first_zp, second, second_zp = positions
            if (_first_operand_type(node, types, first, first_zp) == TP.UINT8
                    and types.get(node.input[second]) == TP.INT8):
                inputs = list(node.input) + [""] * max(0, second_zp + 1 - len(node.input))
                inputs[second] = _shifted(inputs[second], graph, inits, done)
                if inputs[second_zp]:
                    inputs[second_zp] = _shifted(inputs[second_zp], graph, inits, done)
                else:           # an absent int8 zero point is 0, which is 128 in uint8
                    if _ZERO_AT_128 not in done:
                        graph.initializer.append(numpy_helper.from_array(np.array(128, np.uint8), _ZERO_AT_128))
                        done[_ZERO_AT_128] = _ZERO_AT_128
                    inputs[second_zp] = _ZERO_AT_128
                del node.input[:]
                node.input.extend(inputs)
                rewritten += 1
        graph.node.append(node)
    return (model if rewritten else given), rewritten


def reference_model(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model onnxruntime must run to give the ONNX semantics' exact integer sums here: None
    where ``model`` itself does (no uint8 x int8 GEMM, or kernels that do not saturate)."""
    if not u8s8_saturates():
        return None
    exact, rewritten = _shifted_gemms(model)
    return exact if rewritten else None


def onnxruntime_source(model: onnx.ModelProto | str | Path) -> str | bytes:
    """What an onnxruntime session should open to give exact integer sums here: the model as
    given (its path, or serialized), or the serialized :func:`reference_model` where there is one
    (the model is read only where this CPU's kernels saturate)."""
    if u8s8_saturates():
        exact = reference_model(model if isinstance(model, onnx.ModelProto) else onnx.load(str(model)))
        if exact is not None:
            return exact.SerializeToString()
    return model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
