"""onnxruntime as an exact reference for integer GEMMs, also on CPUs where its uint8 x int8
kernels saturate.

Without VNNI (AVX2 alone, AVX-512 without avx512_vnni: AMD Zen 3, Intel Skylake-SP), onnxruntime's
MLAS computes uint8 x int8 inner products with ``vpmaddubsw``, which adds each pair of products
into a saturating int16: 255 * 127 * 2 = 64,770 reads 32,767 (onnxruntime#6004, oneDNN's "nuances
of int8 computations"). The ONNX operators define exact int32 sums, and tscomp computes them
exactly, so there the plain session is not a reference. Its uint8 x uint8 and int8 x int8 kernels
are exact (they widen to int16 before ``vpmaddwd``), and ``b - b_zero_point`` is unchanged when
both are shifted by 128 into uint8 -- the rewrite onnxruntime itself applies to QAttention under
``session.x64quantprecision``. :func:`plain_session` therefore runs, where :func:`u8s8_saturates`
(a probe: one saturating product, asked of this machine's onnxruntime), the model with every
int8 second operand of a uint8-first-operand integer GEMM shifted to uint8 (:func:`exact_u8s8`);
elsewhere the model as it is, so machines with VNNI still check tscomp against onnxruntime's own
u8 x s8 kernels.
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


def _first_operand_type(node, types, first: int, first_zp: int):
    """The first operand's element type: inferred, else its zero point's (same type by definition)."""
    if first is None:
        return TP.UINT8
    for position in (first, first_zp):
        if position < len(node.input) and node.input[position] in types:
            return types[node.input[position]]
    return None


def _shifted(name: str, graph, inits: dict, tag: str) -> str:
    """A uint8 value equal to int8 ``name`` + 128: a new initializer, else Cast/Add/Cast nodes."""
    out = f"{name}__u8_{tag}"
    if name in inits:
        array = numpy_helper.to_array(inits[name]).astype(np.int16) + 128
        graph.initializer.append(numpy_helper.from_array(array.astype(np.uint8), out))
        inits[out] = graph.initializer[-1]
        return out
    offset = f"{out}__128"
    graph.initializer.append(numpy_helper.from_array(np.array(128, np.int16), offset))
    graph.node.extend([helper.make_node("Cast", [name], [f"{out}__i16"], to=TP.INT16),
                       helper.make_node("Add", [f"{out}__i16", offset], [f"{out}__sum"]),
                       helper.make_node("Cast", [f"{out}__sum"], [out], to=TP.UINT8)])
    return out


def exact_u8s8(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose uint8 x int8 integer GEMMs are uint8 x uint8 with the same result."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    types = _element_types(model)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    original = list(graph.node)
    del graph.node[:]
    for k, node in enumerate(original):
        positions = _OPERANDS.get((node.domain, node.op_type))
        if positions is not None:
            first, first_zp, second, second_zp = positions
            if (_first_operand_type(node, types, first, first_zp) == TP.UINT8
                    and types.get(node.input[second]) == TP.INT8):
                inputs = list(node.input) + [""] * max(0, second_zp + 1 - len(node.input))
                inputs[second] = _shifted(inputs[second], graph, inits, str(k))
                if inputs[second_zp]:
                    inputs[second_zp] = _shifted(inputs[second_zp], graph, inits, f"{k}zp")
                else:
                    zero = f"{node.input[second]}__u8_{k}_zp"
                    graph.initializer.append(numpy_helper.from_array(np.array(128, np.uint8), zero))
                    inputs[second_zp] = zero
                del node.input[:]
                node.input.extend(inputs)
        graph.node.append(node)
    # the Cast/Add/Cast nodes were appended after their consumers: order the graph again
    return _topologically_sorted(model)


def _topologically_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = model.graph
    known = {i.name for i in graph.initializer} | {i.name for i in graph.input} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in known for i in n.input)]
        assert ready, "exact_u8s8: the rewritten graph has a cycle"
        for n in ready:
            ordered.append(n)
            known.update(n.output)
        taken = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in taken]
    del graph.node[:]
    graph.node.extend(ordered)
    return model


def plain_session(model: onnx.ModelProto | str | Path) -> ort.InferenceSession:
    """onnxruntime running each operator as specified (its fusions change the fp32 rounding), on
    exact integer GEMMs: ``model`` as it is, or :func:`exact_u8s8` of it where
    :func:`u8s8_saturates`."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    if u8s8_saturates():
        model = exact_u8s8(model)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
