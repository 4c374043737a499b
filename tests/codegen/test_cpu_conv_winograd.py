"""The Winograd F(2x2, 3x3) strategy of the ``conv`` family (:mod:`tscomp.codegen.cpu_conv_winograd`):
its algebra in numpy, which Convs it is offered for, the kernel against onnxruntime at awkward sizes
(1x1 images, odd sides whose last tiles hang past the image, asymmetric and SAME pads, no padding,
channels past a whole register tile, fused epilogues), and a compiled model that carries it through
the dispatch, the host program and an artifact round trip."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tscomp.codegen.cpu_conv import CompiledConv, ConvAnalysis
from tscomp.codegen.cpu_conv_winograd import (AT, BT, G_MATRIX, WinogradConfig, tile_grid, transformed_weight,
                                              winograd_applies, winograd_configs)
from tscomp.compiler import compile_model
from tscomp.graph import load_model
from tscomp.graph.fusion import fuse
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact

from tests.codegen.onnxruntime_check import assert_matches_onnxruntime
from tests.codegen.test_cpu_conv import _model


def _analysis(path, branch, channels):
    _model(path, [branch], channels=channels)
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"]))
    return plan, ConvAnalysis(plan, plan.groups[0])


def test_the_transforms_compute_a_2x2_block_of_a_3x3_correlation():
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    got = AT @ ((G_MATRIX @ g @ G_MATRIX.T) * (BT @ d @ BT.T)) @ AT.T
    want = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    U = transformed_weight(g.reshape(1, 1, 3, 3).astype(np.float32))
    np.testing.assert_allclose(U[:, 0, 0].reshape(4, 4), G_MATRIX @ g @ G_MATRIX.T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("branch,offered", [
    (("s1", 32, (3, 3), dict(pads=[1, 1, 1, 1]), ()), True),
    (("valid", 32, (3, 3), dict(), ()), True),
    (("stride2", 32, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), ()), False),
    (("dilated", 32, (3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2]), ()), False),
    (("grouped", 32, (3, 3), dict(pads=[1, 1, 1, 1], group=2), ()), False),
    (("wide", 32, (5, 5), dict(pads=[2, 2, 2, 2]), ()), False),
    (("pointwise", 32, (1, 1), dict(), ()), False),
    (("few_out", 8, (3, 3), dict(pads=[1, 1, 1, 1]), ()), False),
])
def test_the_strategy_is_offered_for_ungrouped_3x3_stride_1_convs_with_enough_channels(tmp_path, branch, offered):
    _, analysis = _analysis(tmp_path / "m.onnx", branch, channels=32)
    assert bool(winograd_configs("avx512", analysis)) == offered
    assert winograd_configs("scalar", analysis) == []


def test_a_channel_blocked_layout_takes_the_strategy_away(tmp_path):
    _, analysis = _analysis(tmp_path / "m.onnx", ("s1", 32, (3, 3), dict(pads=[1, 1, 1, 1]), ()), channels=32)
    assert winograd_applies(analysis)
    analysis.store_blocked(16)
    assert not winograd_applies(analysis) and winograd_configs("avx512", analysis) == []


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("branch,channels", [
    (("same", 40, (3, 3), dict(pads=[1, 1, 1, 1]), ("bn", "relu")), 24),      # OC off the 32-channel tiles
    (("asym", 64, (3, 3), dict(pads=[0, 1, 1, 0]), ()), 16),
    (("valid", 32, (3, 3), dict(), ("silu",)), 48),
    (("same_upper", 32, (3, 3), dict(auto_pad="SAME_UPPER"), ("relu",)), 32),
])
def test_the_kernel_matches_onnxruntime_at_awkward_sizes(tmp_path, isa, branch, channels):
    from tscomp.codegen.build import host_isa
    from tscomp.codegen.cpu_gemm import ISA_RANK
    if ISA_RANK[host_isa()] < ISA_RANK[isa]:
        pytest.skip(f"{isa} kernels do not run on this host ({host_isa()})")
    path = tmp_path / "w.onnx"
    plan, analysis = _analysis(path, branch, channels)
    lanes = {"avx512": 16, "avx2": 8}[isa]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    env0 = {name: plan.graph.values[name].const for name in plan.groups[0].inputs if name != "x"}
    for cfg in (WinogradConfig(mr=2 * lanes, nr=6, mc=4 * lanes, tiles=32), WinogradConfig(lanes, 5, lanes, 3)):
        kernel = CompiledConv(analysis, cfg, isa)
        assert "Winograd F(2x2,3x3)" in kernel.source and cfg.slug() in kernel.func
        for n, h, w in [(1, 1, 1), (1, 2, 2), (2, 7, 13), (1, 23, 17), (1, 4, 97), (3, 3, 1)]:
            if min(h, w) < {"valid": 3, "asym": 2}.get(branch[0], 1):
                continue              # an empty output: onnxruntime refuses the shape
            x = rng.standard_normal((n, channels, h, w)).astype(np.float32)
            got = kernel.run(env0 | {"x": x}, {"batch": n, "H": h, "W": w})
            want = sess.run(None, {"x": x})[0]
            np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{cfg.slug()} {n}x{h}x{w}")


def test_the_task_count_follows_the_kernels_own_split():
    cfg = WinogradConfig(mr=32, nr=8, mc=64, tiles=32)
    TH, TW, n_tb, rows, n_ob = tile_grid(14, 14, 256, cfg)
    assert (TH, TW) == (7, 7) and n_tb * rows >= TH > (n_tb - 1) * rows and n_ob == 4
    assert tile_grid(1, 1, 64, cfg)[2:] == (1, 1, 1)


def test_a_compiled_model_carries_the_strategy_through_the_host_program_and_an_artifact(tmp_path, monkeypatch):
    from tscomp.runtime import dispatch

    # every packed copy kept: on this small model the Winograd copy may not repay its memory by the
    # copy rule (dispatch.worthwhile_copies), and this test is about carrying it through
    monkeypatch.setattr(dispatch, "COPY_WORTH", -1.0)
    monkeypatch.setattr(dispatch, "COPY_WORTH_RESIDENT", -1.0)
    path = tmp_path / "m.onnx"
    spatial = _model(path, [("a", 32, (3, 3), dict(pads=[1, 1, 1, 1]), ("bn", "relu", "res"))], channels=32,
                     residual=["batch", 32, "H", "W"])
    model = compile_model(str(path), ["batch=1:2", "H=8:40", "W=8:40"], max_variants=1)
    kinds = [type(k.cfg).__name__ for k in model.kernels[model.plan.groups[0].name]]
    assert "WinogradConfig" in kinds and "TileConfig" in kinds
    out = tmp_path / "m.tsc"
    write_artifact(model, out)
    rng = np.random.default_rng(2)
    sizes = [(1, 8, 8), (2, 13, 9), (1, 40, 40), (1, 31, 37)]

    def feeds():
        for n, h, w in sizes:
            yield f"{n}x{h}x{w}", {"x": rng.standard_normal((n, 32, h, w)).astype(np.float32),
                                   "r": rng.standard_normal((n, 32, h, w)).astype(np.float32)}
    for rt in (Runtime.from_compiled(model, num_threads=2), Runtime(str(out), num_threads=2)):
        assert_matches_onnxruntime(rt, path, feeds())
    assert spatial == ["H", "W"]


def test_a_conv_that_writes_a_channel_blocked_tensor_keeps_only_its_tiles(tmp_path):
    """A 3x3 Conv feeding a depthwise Conv stores its output channel-blocked (channel_blocking.py);
    the Winograd kernel stores NCHW only, so that group's schedule drops it, and the chain still
    matches onnxruntime."""
    from onnx import TensorProto as TP
    from onnx import helper

    from tests.codegen.test_channel_blocking import _need_vectors
    from tests.codegen.test_cpu_groups import save_model
    _need_vectors()
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor(name, TP.FLOAT, shape, (rng.standard_normal(shape) * 0.2).astype(np.float32).ravel())
             for name, shape in (("w0", (32, 32, 3, 3)), ("w1", (32, 1, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w1"], ["y"], pads=[1, 1, 1, 1], group=32)]
    path = save_model(tmp_path, "chain", nodes, [("x", TP.FLOAT, ["batch", 32, "H", "W"])],
                      [("y", TP.FLOAT, ["batch", 32, "H", "W"])],
                      inits, opset=17)
    compiled = compile_model(str(path), ["batch=1:2", "H=4:30", "W=4:30"], max_variants=2)
    producer = compiled.plan.groups[0].name
    assert compiled.kernels[producer][0].analysis.y_lanes, compiled.notes
    assert not any(isinstance(k.cfg, WinogradConfig) for k in compiled.kernels[producer])
    rng2 = np.random.default_rng(1)
    assert_matches_onnxruntime(Runtime.from_compiled(compiled, num_threads=2), path,
                               ((f"{n}x{h}x{w_}", {"x": rng2.standard_normal((n, 32, h, w_)).astype(np.float32)})
                                for n, h, w_ in [(1, 4, 4), (2, 13, 7), (1, 30, 30)]))


def test_a_big_image_is_transformed_a_chunk_of_tile_rows_at_a_time(tmp_path, monkeypatch):
    """V_FLOATS bounds the transformed input one call keeps; with room for ~1.5 task blocks, a
    97x41 image (49 tile rows) runs in many chunks, the last one partial, and still matches."""
    import tscomp.codegen.cpu_conv_winograd as winograd
    from tscomp.codegen.build import host_isa
    from tscomp.codegen.tile_config import VECTOR_WIDTH
    if VECTOR_WIDTH.get(host_isa(), 1) < 8:
        pytest.skip(f"no Winograd kernel on {host_isa()}")
    path = tmp_path / "big.onnx"
    plan, analysis = _analysis(path, ("same", 32, (3, 3), dict(pads=[1, 1, 1, 1]), ("relu",)), 16)
    cfg = winograd_configs(host_isa(), analysis)[0]
    monkeypatch.setattr(winograd, "V_FLOATS", 16 * 16 * (3 * 21 // 2 + cfg.nr))
    kernel = CompiledConv(analysis, cfg, host_isa())
    assert f"#define TS_V_FLOATS {winograd.V_FLOATS}" in kernel.source
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    env0 = {name: plan.graph.values[name].const for name in plan.groups[0].inputs if name != "x"}
    for n, h, w in [(2, 97, 41), (1, 5, 41)]:
        x = np.random.default_rng(n).standard_normal((n, 16, h, w)).astype(np.float32)
        got = kernel.run(env0 | {"x": x}, {"batch": n, "H": h, "W": w})
        np.testing.assert_allclose(next(iter(got.values())), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
