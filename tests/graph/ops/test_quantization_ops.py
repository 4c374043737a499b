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
