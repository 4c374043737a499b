"""tscomp/exact_integer_reference.py: the uint8 x int8 -> uint8 x uint8 rewrite keeps every integer
GEMM's exact result (checked on onnxruntime's uint8 x uint8 kernels, exact on every CPU), whether
the int8 operand is an initializer or computed, with or without its zero point."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tscomp.exact_integer_reference import exact_u8s8, reference_model, u8s8_saturates


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _matmul_integer_model(b_init=None, zero_points=True):
    inputs = [helper.make_tensor_value_info("a", TP.UINT8, ["M", 40])]
    inits = [numpy_helper.from_array(np.array(131, np.uint8), "az"), numpy_helper.from_array(np.array(-7, np.int8), "bz")]
    if b_init is None:
        inputs.append(helper.make_tensor_value_info("b", TP.INT8, [40, 9]))
    else:
        inits.append(numpy_helper.from_array(b_init, "b"))
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"] if zero_points else ["a", "b"], ["y"])
    graph = helper.make_graph([node], "mmi", inputs, [helper.make_tensor_value_info("y", TP.INT32, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_the_rewrite_keeps_a_matmul_integers_exact_sums_for_computed_and_constant_weights():
    rng = np.random.default_rng(0)
    a = np.full((5, 40), 255, np.uint8)
    a[1:] = rng.integers(0, 256, (4, 40))
    b = np.full((40, 9), 127, np.int8)
    b[:, 1:] = rng.integers(-128, 128, (40, 8))
    for b_init, zero_points in ((None, True), (b, True), (b, False)):
        model = _matmul_integer_model(b_init, zero_points)
        exact = exact_u8s8(model)
        assert {n.op_type for n in exact.graph.node} >= {"MatMulInteger"}
        feeds = {"a": a} if b_init is not None else {"a": a, "b": b}
        az, bz = (131, -7) if zero_points else (0, 0)
        want = (a.astype(np.int64) - az) @ (b.astype(np.int64) - bz)
        got = _session(exact).run(None, feeds)[0]
        assert np.array_equal(got, want), (b_init is None, zero_points)


def test_a_model_without_uint8_by_int8_gemms_needs_no_reference_model():
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "u8u8", [helper.make_tensor_value_info("a", TP.UINT8, [2, 3]),
                                               helper.make_tensor_value_info("b", TP.UINT8, [3, 2])],
                              [helper.make_tensor_value_info("y", TP.INT32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    assert reference_model(model) is None
    assert exact_u8s8(model) is model


def test_the_probe_agrees_with_onnxruntimes_answer_on_a_saturating_product():
    model = _matmul_integer_model(zero_points=False)
    a, b = np.full((1, 40), 255, np.uint8), np.full((40, 9), 127, np.int8)
    plain = _session(model).run(None, {"a": a, "b": b})[0]
    assert u8s8_saturates() == (int(plain[0, 0]) != 255 * 127 * 40)
    assert (reference_model(model) is not None) == u8s8_saturates()


def test_an_int8_operand_two_gemms_read_is_shifted_once_and_both_stay_exact():
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["y"]), helper.make_node("MatMulInteger", ["a2", "b"], ["y2"])]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("a", TP.UINT8, [3, 40]),
                                                helper.make_tensor_value_info("a2", TP.UINT8, [2, 40]),
                                                helper.make_tensor_value_info("b", TP.INT8, [40, 9])],
                              [helper.make_tensor_value_info(y, TP.INT32, None) for y in ("y", "y2")])
    exact = exact_u8s8(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))
    assert [n.op_type for n in exact.graph.node].count("Cast") == 2        # one Cast/Add/Cast for b
    a, a2 = rng.integers(0, 256, (3, 40)).astype(np.uint8), rng.integers(0, 256, (2, 40)).astype(np.uint8)
    b = rng.integers(-128, 128, (40, 9)).astype(np.int8)
    y, y2 = _session(exact).run(None, {"a": a, "a2": a2, "b": b})
    assert np.array_equal(y, a.astype(np.int64) @ b) and np.array_equal(y2, a2.astype(np.int64) @ b)
