"""QuantizeLinear / DequantizeLinear (tscomp/graph/ops/quantization.py): a QDQ-format model -- int8
weights behind a DequantizeLinear, activations fake-quantized by Q -> DQ pairs, per-tensor and
per-axis scales -- compiles (the weight's DequantizeLinear folds to a float constant at compile
time) and matches onnxruntime running each operator as specified (graph optimizations off)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tests.integer_gemm_reference import plain_session
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime


def test_a_qdq_matmul_compiles_and_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    k, n = 16, 8
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "wq"),
             numpy_helper.from_array(rng.uniform(0.001, 0.01, n).astype(np.float32), "w_scale"),   # per column
             numpy_helper.from_array(np.zeros(n, np.int8), "w_zp"),
             numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(3, np.uint8), "x_zp")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["w"], axis=1),
             helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
             helper.make_node("MatMul", ["xd", "w"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", k])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9), path)
    model = compile_model(str(path), ["B=1:2", "L=1:40"], max_variants=1)
    assert "DequantizeLinear" not in {n.op_type for n in model.plan.graph.nodes if n.inputs[0] == "wq"}
    rt = Runtime.from_compiled(model)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), plain, providers=["CPUExecutionProvider"])
    for b, l in [(1, 1), (2, 13), (1, 40)]:
        x = rng.uniform(-2, 2, (b, l, k)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- DynamicQuantizeLinear,
# MatMulInteger, ConvInteger: the references against onnxruntime, bit for bit
def _plain_session(nodes, inputs, outputs, opset=20):
    graph = helper.make_graph(nodes, "ops", inputs, outputs)
    return plain_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9))


def _call(op_type, num_outputs=1, **attrs):
    from tscomp.graph.ops.registry import OpCall
    return OpCall("n", op_type, attrs, 20, num_outputs)


def test_dynamic_quantize_reference_is_bit_identical_to_onnxruntime_on_every_kind_of_range():
    from tscomp.graph.ops.quantization import dynamic_quantize_ref
    sess = _plain_session([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])],
                          [helper.make_tensor_value_info("x", TP.FLOAT, None)],
                          [helper.make_tensor_value_info(n, t, None) for n, t in (("y", TP.UINT8), ("s", TP.FLOAT),
                                                                                   ("z", TP.UINT8))])
    rng = np.random.default_rng(0)
    for trial in range(400):
        x = (rng.standard_normal(int(rng.integers(1, 2000))) * rng.uniform(0.01, 100)).astype(np.float32)
        x = [x, np.abs(x), -np.abs(x), np.zeros_like(x), np.round(x * 4) / 4][trial % 5]   # + only, - only, all 0, ties
        for ours, theirs in zip(dynamic_quantize_ref(_call("DynamicQuantizeLinear", 3), x), sess.run(None, {"x": x})):
            assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), trial


def test_matmul_integer_reference_is_exact_for_every_type_pair_and_zero_point_form():
    from tscomp.graph.ops.quantization import matmul_integer_ref
    rng = np.random.default_rng(1)
    for a_type, b_type in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)):
        ta, tb = (helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in (a_type, b_type))
        ia, ib = np.iinfo(a_type), np.iinfo(b_type)
        a = rng.integers(ia.min, ia.max + 1, (3, 5, 37)).astype(a_type)
        b = rng.integers(ib.min, ib.max + 1, (37, 11)).astype(b_type)
        for b_zp_shape in ((), (11,)):        # per tensor, per column
            zps = [np.array(rng.integers(ia.min, ia.max + 1), a_type), rng.integers(ib.min, ib.max + 1, b_zp_shape).astype(b_type)]
            sess = _plain_session([helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])],
                                  [helper.make_tensor_value_info(n, t, None) for n, t in (("a", ta), ("b", tb), ("az", ta),
                                                                                           ("bz", tb))],
                                  [helper.make_tensor_value_info("y", TP.INT32, None)])
            want = sess.run(None, {"a": a, "b": b, "az": zps[0], "bz": zps[1]})[0]
            got = matmul_integer_ref(_call("MatMulInteger"), a, b, *zps)
            assert got.dtype == np.int32 and np.array_equal(got, want), (a_type, b_type, b_zp_shape)


def test_conv_integer_reference_pads_with_the_zero_point_as_onnxruntime():
    from tscomp.graph.ops.quantization import conv_integer_ref
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (2, 6, 9, 8)).astype(np.uint8)
    w = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    xz, wz = np.array(117, np.uint8), np.array(3, np.int8)
    for pads in ([0, 0, 0, 0], [1, 1, 1, 1], [2, 0, 1, 3]):
        attrs = dict(pads=pads, group=2, strides=[2, 1])
        sess = _plain_session([helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attrs)],
                              [helper.make_tensor_value_info(n, t, None) for n, t in (("x", TP.UINT8), ("w", TP.INT8),
                                                                                       ("xz", TP.UINT8), ("wz", TP.INT8))],
                              [helper.make_tensor_value_info("y", TP.INT32, None)])
        want = sess.run(None, {"x": x, "w": w, "xz": xz, "wz": wz})[0]
        assert np.array_equal(conv_integer_ref(_call("ConvInteger", **attrs), x, w, xz, wz), want), pads
