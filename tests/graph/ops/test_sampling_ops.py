"""GridSample (tscomp/graph/ops/sampling.py): the output shape follows the grid's symbolic extents,
and the reference matches onnxruntime for every mode, padding mode and corner alignment, with grid
points well outside [-1, 1] (the padding modes' territory); compiled, its C kernel matches onnxruntime
(2-D) and the reference (3-D), and a NaN or huge coordinate reads inside the image."""
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


def _compiled(tmp_path, model, *dims):
    import onnx

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    path = tmp_path / "gs.onnx"
    onnx.save(model, path)
    compiled = compile_model(str(path), list(dims), max_variants=1)
    return compiled, Runtime.from_compiled(compiled), path


#: grid values that sit exactly on the corners, the centre and the edges of [-1, 1], besides random ones
EXACT_COORDINATES = np.array([-1.0, 1.0, 0.0, -0.5, 0.5, -3.0, 3.0], np.float32)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_compiled_grid_sample_runs_its_c_kernel_and_matches_onnxruntime(tmp_path, mode, padding_mode, align_corners):
    """No numpy group; images of 1 pixel, primes and the range ends, grid points well outside
    [-1, 1] and exactly on its corners and centre."""
    model = _model(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    compiled, rt, path = _compiled(tmp_path, model, "B=1:3", "H=1:23", "W=1:23", "gh=1:9", "gw=1:9")
    assert compiled.fallback_groups() == []
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for b, h, w, p, q in [(1, 1, 1, 1, 1), (2, 5, 7, 3, 4), (3, 23, 13, 9, 2), (1, 2, 23, 7, 9)]:
        grid = rng.uniform(-2.5, 2.5, (b, p, q, 2)).astype(np.float32)
        grid.reshape(-1)[: min(grid.size, 2 * len(EXACT_COORDINATES))] = np.repeat(EXACT_COORDINATES, 2)[: grid.size]
        feeds = {"x": rng.standard_normal((b, 3, h, w)).astype(np.float32), "grid": grid}
        np.testing.assert_allclose(rt.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{(b, h, w, p, q)}")


def test_a_nan_or_huge_grid_coordinate_reads_inside_the_image(tmp_path):
    """A NaN coordinate gives NaN at its point (as the reference), a huge one an outside tap (the
    padding mode's value), and neither an index cast out of range (the test-asan target checks
    the reads)."""
    model = _model(mode="bicubic", padding_mode="zeros", align_corners=0)
    _, rt, _ = _compiled(tmp_path, model, "B=1:2", "H=1:8", "W=1:8", "gh=1:4", "gw=1:4")
    grid = np.array([[[[np.nan, 0.0], [1e30, -1e30], [0.0, 0.0]]]], np.float32)
    x = np.arange(1 * 3 * 4 * 5, dtype=np.float32).reshape(1, 3, 4, 5)
    y = rt.run({"x": x, "grid": grid})["y"]
    assert np.isnan(y[0, :, 0, 0]).all()
    assert (y[0, :, 0, 1] == 0).all()
    np.testing.assert_allclose(y[0, :, 0, 2], run_reference_of(model, x, grid)[0, :, 0, 2], rtol=1e-6)


def run_reference_of(model, x, grid):
    g = propagate(model, "B=1:2", "H=1:8", "W=1:8", "gh=1:4", "gw=1:4")
    return run_reference(g, {"x": x, "grid": grid})["y"]


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_a_volumetric_grid_sample_matches_the_reference(tmp_path, mode):
    """Opset 20's N-D form: 3 spatial axes (64 taps per point for cubic), against the reference."""
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode="reflection", align_corners=1)
    model = make_model([node], [inp("x", ["B", 2, "D", "H", "W"]), inp("grid", ["B", "gd", "gh", "gw", 3])], ["y"],
                       opset=20)
    dims = ("B=1:2", "D=1:9", "H=1:9", "W=1:9", "gd=1:4", "gh=1:4", "gw=1:4")
    compiled, rt, _ = _compiled(tmp_path, model, *dims)
    assert compiled.fallback_groups() == []
    g = propagate(model, *dims)
    rng = np.random.default_rng(6)
    for shape in [(1, 1, 1, 1, 1, 1, 1), (2, 9, 5, 7, 3, 4, 2)]:
        b, d, h, w, p, q, s = shape
        feeds = {"x": rng.standard_normal((b, 2, d, h, w)).astype(np.float32),
                 "grid": rng.uniform(-2.5, 2.5, (b, p, q, s, 3)).astype(np.float32)}
        np.testing.assert_allclose(rt.run(feeds)["y"], run_reference(g, feeds)["y"], rtol=1e-5, atol=1e-5)
