"""3-D convolutions and pools on the 2-D kernels (tscomp.graph.volumetric): every rank-5 Conv,
MaxPool, AveragePool and global pool is rewritten, the compiled model runs no numpy group, and it
computes what onnxruntime computes at awkward shapes (1, primes, range ends)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tscomp.graph import load_model

C = 4
#: (id, op, attributes, weight shape or None, whether the Conv has a bias, smallest T)
CASES = [
    ("conv-3x3x3-pad1", "Conv", dict(kernel_shape=[3, 3, 3], pads=[1] * 6), (6, C, 3, 3, 3), True, 1),
    ("conv-patch-2x4x4-stride", "Conv", dict(kernel_shape=[2, 4, 4], strides=[2, 4, 4]), (8, C, 2, 4, 4), True, 2),
    ("conv-dilated-grouped-time", "Conv", dict(kernel_shape=[3, 1, 1], dilations=[2, 1, 1], pads=[2, 0, 0, 2, 0, 0],
                                                group=2), (6, C // 2, 3, 1, 1), False, 1),
    ("conv-1x3x3-stride2", "Conv", dict(kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1]),
     (5, C, 1, 3, 3), True, 1),
    ("conv-depthwise-asymmetric", "Conv", dict(kernel_shape=[3, 3, 3], group=C, strides=[2, 1, 1],
                                               pads=[1, 1, 1, 0, 1, 1]), (C, 1, 3, 3, 3), True, 2),
    ("convtranspose-2x2x2-up", "ConvTranspose", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), (C, 3, 2, 2, 2),
     True, 1),
    ("convtranspose-grouped-padded", "ConvTranspose", dict(kernel_shape=[2, 3, 3], strides=[2, 2, 1], group=2,
                                                           pads=[0, 1, 1, 0, 1, 1], output_padding=[0, 1, 0]),
     (C, 2, 2, 3, 3), True, 1),
    ("conv-same-upper-hw-strided", "Conv", dict(kernel_shape=[3, 3, 3], strides=[1, 2, 2], auto_pad="SAME_UPPER"),
     (6, C, 3, 3, 3), True, 1),
    ("conv-same-lower-even-time", "Conv", dict(kernel_shape=[2, 3, 2], auto_pad="SAME_LOWER"), (5, C, 2, 3, 2), False, 1),
    ("maxpool-same-upper", "MaxPool", dict(kernel_shape=[2, 3, 3], strides=[1, 2, 2], auto_pad="SAME_UPPER"), None,
     False, 1),
    ("maxpool-2-ceil", "MaxPool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2], ceil_mode=1), None, False, 2),
    ("maxpool-3-dilated-time", "MaxPool", dict(kernel_shape=[3, 3, 3], strides=[1, 2, 2], pads=[2, 1, 1, 2, 1, 1],
                                               dilations=[2, 1, 1]), None, False, 1),
    ("avgpool-3-exclude-pad", "AveragePool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6,
                                                  count_include_pad=0), None, False, 1),
    ("avgpool-include-pad-ceil", "AveragePool", dict(kernel_shape=[2, 3, 3], strides=[2, 2, 2],
                                                     pads=[0, 1, 1, 1, 1, 1], count_include_pad=1, ceil_mode=1),
     None, False, 1),
    ("avgpool-1x2x2", "AveragePool", dict(kernel_shape=[1, 2, 2], strides=[1, 2, 2]), None, False, 1),
    ("global-average", "GlobalAveragePool", {}, None, False, 1),
    ("global-max", "GlobalMaxPool", {}, None, False, 1),
]
T_MAX, SIDE = 9, (5, 19)


def _model(tmp_path, op, attrs, weight_shape, bias, opset=19):
    rng = np.random.default_rng(0)
    inits, inputs = [], ["x"]
    if weight_shape is not None:
        inits.append(numpy_helper.from_array(rng.standard_normal(weight_shape).astype(np.float32), "w"))
        inputs.append("w")
        if bias:
            channels = weight_shape[1] * attrs.get("group", 1) if op == "ConvTranspose" else weight_shape[0]
            inits.append(numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b"))
            inputs.append("b")
    node = helper.make_node(op, inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", C, "T", "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "volumetric.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9), path)
    return path


def _dims(t_min):
    return ["B=1:2", f"T={t_min}:{T_MAX}", f"H={SIDE[0]}:{SIDE[1]}", f"W={SIDE[0]}:{SIDE[1]}"]


@pytest.mark.parametrize("name,op,attrs,weight_shape,bias,t_min", CASES, ids=[c[0] for c in CASES])
def test_a_3d_operator_is_rewritten_onto_2d_ones(tmp_path, name, op, attrs, weight_shape, bias, t_min):
    graph = load_model(_model(tmp_path, op, attrs, weight_shape, bias), _dims(t_min))
    ranks = [len(graph.values[n.inputs[0]].shape) for n in graph.nodes if n.op_type == op]
    assert ranks and all(r == 4 for r in ranks), (name, ranks)


@pytest.mark.parametrize("name,op,attrs,weight_shape,bias,t_min", CASES, ids=[c[0] for c in CASES])
def test_a_compiled_3d_operator_runs_natively_and_matches_onnxruntime(tmp_path, name, op, attrs, weight_shape, bias,
                                                                      t_min):
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    path = _model(tmp_path, op, attrs, weight_shape, bias)
    model = compile_model(str(path), _dims(t_min), max_variants=1)
    assert model.fallback_groups() == []
    rt = Runtime.from_compiled(model, num_threads=2)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for B, T, H, W in [(1, t_min, SIDE[0], SIDE[0]), (2, 7, 13, 17), (1, T_MAX, SIDE[1], SIDE[1]), (2, 3, 11, 5)]:
        x = rng.standard_normal((B, C, max(T, t_min), H, W)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{name} at {x.shape}")


def test_an_opset_11_export_is_rewritten_too(tmp_path):
    """Slice and Pad read their inputs since opset 11; the taps' Unsqueeze then takes its axes as an
    attribute (onnxruntime runs it, and the compiled model matches)."""
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    _, op, attrs, weight_shape, bias, t_min = CASES[0]
    path = _model(tmp_path, op, attrs, weight_shape, bias, opset=11)
    model = compile_model(str(path), _dims(t_min), max_variants=1)
    assert model.fallback_groups() == []
    rt, sess = Runtime.from_compiled(model, num_threads=2), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).standard_normal((2, C, 5, 7, 11)).astype(np.float32)
    np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
