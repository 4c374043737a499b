"""GridSample (tscomp/graph/ops/sampling.py): the output shape follows the grid's symbolic extents,
and the reference matches onnxruntime for every mode, padding mode and corner alignment, with grid
points well outside [-1, 1] (the padding modes' territory); a compiled model around one runs."""
from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import helper

from tests.graph.ops.test_tensor_ops import inp, make_model, propagate, shape_of, syms
from tscomp.graph.reference import run_reference


def _model(**attrs):
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], **attrs)
    return make_model([node], [inp("x", ["B", 3, "H", "W"]), inp("grid", ["B", "gh", "gw", 2])], ["y"], opset=16)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_matches_onnxruntime(mode, padding_mode, align_corners):
    model = _model(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    g = propagate(model, "B=1:3", "H=1:20", "W=1:20", "gh=1:9", "gw=1:9")
    B, P, Q = syms(g, "B", "gh", "gw")
    assert shape_of(g, "y") == (B, 3, P, Q)
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for b, h, w, p, q in [(1, 1, 1, 1, 1), (2, 5, 7, 3, 4), (3, 20, 13, 9, 2)]:
        feeds = {"x": rng.standard_normal((b, 3, h, w)).astype(np.float32),
                 "grid": rng.uniform(-2.5, 2.5, (b, p, q, 2)).astype(np.float32)}
        np.testing.assert_allclose(run_reference(g, feeds)["y"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{(b, h, w, p, q)}")


def test_a_model_sampling_its_own_features_compiles_and_matches_onnxruntime(tmp_path):
    import onnx

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    # grid = tanh of two feature channels, moved last: [B, 2, H, W] -> [B, H, W, 2]
    nodes = [helper.make_node("Slice", ["x", "s0", "s2", "ax1"], ["xy"]),
             helper.make_node("Tanh", ["xy"], ["t"]),
             helper.make_node("Transpose", ["t"], ["grid"], perm=[0, 2, 3, 1]),
             helper.make_node("GridSample", ["x", "grid"], ["y"], align_corners=0)]
    model = make_model(nodes, [inp("x", ["B", 3, "H", "W"])], ["y"],
                       {"s0": np.array([0], np.int64), "s2": np.array([2], np.int64), "ax1": np.array([1], np.int64)},
                       opset=16)
    path = tmp_path / "gs.onnx"
    onnx.save(model, path)
    rt = Runtime.from_compiled(compile_model(str(path), ["B=1:2", "H=1:16", "W=1:16"], max_variants=1))
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, h, w in [(1, 1, 1), (2, 7, 16), (1, 16, 5)]:
        x = rng.standard_normal((b, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
