"""GEMM epilogues whose outputs read the GEMM at a permuted element (issue 11): a channels-last
ConvNeXt block's MLP ([B, H, W, C] MatMuls between two permutes of an NCHW tensor) and an attention
projection reshaped and transposed into heads with a scaling Mul. The first GEMM's output is a
reshaped view of the GEMM space (delinearized and linearized again: the row index must collapse);
the second's is a permutation of it: the tile epilogue computes element (i, j) and stores it where it
lands. Checked against onnxruntime at awkward sizes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tscomp.compiler import compile_model
from tscomp.runtime import Runtime

ort = pytest.importorskip("onnxruntime")


def _t(name, a):
    return helper.make_tensor(name, TP.FLOAT, a.shape, a.reshape(-1).tolist())


def _save(tmp_path, name, nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _convnext_tail(tmp_path, C=8, patchify=False):
    """The block alone on an [B, C, H, W] input, or (``patchify``) after a stride-4 patch Conv of an
    image, so that the block's spatial extents are ``floor(H/4)`` and ``floor(W/4)``: expressions
    whose positivity only the symbol ranges tell."""
    rng = np.random.default_rng(0)
    W1 = rng.standard_normal((C, 4 * C)).astype(np.float32) / np.sqrt(C)
    W2 = rng.standard_normal((4 * C, C)).astype(np.float32) / np.sqrt(4 * C)
    b1, b2, g = (rng.standard_normal(n).astype(np.float32) for n in (4 * C, C, C))
    stem, inits, image = [], [], ["B", C, "H", "W"]
    if patchify:
        stem = [helper.make_node("Conv", ["image", "Wp"], ["x"], kernel_shape=[4, 4], strides=[4, 4])]
        inits = [_t("Wp", rng.standard_normal((C, 3, 4, 4)).astype(np.float32) / 7)]
        image = ["B", 3, "H", "W"]
    nodes = stem + [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "W1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "W2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["a2"]),
             helper.make_node("Mul", ["a2", "g"], ["s2"]),
             helper.make_node("Transpose", ["s2"], ["p2"], perm=[0, 3, 1, 2]),
             helper.make_node("Add", ["p2", "x"], ["y"])]
    return _save(tmp_path, "convnext_tail", nodes,
                 [helper.make_tensor_value_info("image" if patchify else "x", TP.FLOAT, image)],
                 [helper.make_tensor_value_info("y", TP.FLOAT, ["B", C, "H4" if patchify else "H",
                                                               "W4" if patchify else "W"])],
                 inits + [_t("W1", W1), _t("W2", W2), _t("b1", b1), _t("b2", b2), _t("g", g)])


def _heads_projection(tmp_path, D=64, heads=4):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((D, D)).astype(np.float32) / np.sqrt(D)
    b = rng.standard_normal(D).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["q"]),
             helper.make_node("Reshape", ["q", "split"], ["qh"]),
             helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Mul", ["qt", "scale"], ["y"])]
    inits = [_t("W", W), _t("b", b), _t("scale", np.float32([0.25])),
             helper.make_tensor("split", TP.INT64, [4], [0, 0, heads, D // heads])]
    return _save(tmp_path, "heads_projection", nodes,
                 [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", D])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, ["B", heads, "L", D // heads])], inits)


def _compare(path, dims, feeds_list):
    model = compile_model(str(path), dims, max_variants=2)
    assert not model.fallback_groups(), {g: model.kernels[g][0].reasons for g in model.fallback_groups()}
    gemm = [g for g, ks in model.kernels.items() if ks[0].family == "gemm"]
    rt = Runtime.from_compiled(model, num_threads=2)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        want = sess.run(None, feeds)[0]
        got = rt.run(feeds)[rt.output_names[0]]
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str({k: v.shape for k, v in feeds.items()}))
    return model, gemm


def test_channels_last_block_runs_both_gemms_natively(tmp_path):
    rng = np.random.default_rng(2)
    shapes = [(1, 1, 1), (1, 7, 13), (3, 5, 2), (2, 31, 1), (4, 32, 32)]
    model, gemm = _compare(_convnext_tail(tmp_path), ["B=1:4", "H=1:32", "W=1:32"],
                           [{"x": rng.standard_normal((B, 8, H, W)).astype(np.float32)} for B, H, W in shapes])
    assert len(gemm) == 2
    assert any("scattered" in model.kernels[g][0].source for g in gemm)


def test_channels_last_block_after_a_strided_stem_runs_both_gemms_natively(tmp_path):
    # the row index [B*floor(H/4)*floor(W/4)] delinearized and linearized again collapses only
    # once the ranges show floor(H/4) > 0 (H >= 4): floor(floor(i/W4)/H4) is floor(i/(H4*W4))
    rng = np.random.default_rng(4)
    shapes = [(1, 4, 4), (1, 29, 53), (2, 7, 64), (3, 64, 31)]
    model, gemm = _compare(_convnext_tail(tmp_path, patchify=True), ["B=1:4", "H=4:64", "W=4:64"],
                           [{"image": rng.standard_normal((B, 3, H, W)).astype(np.float32)} for B, H, W in shapes])
    assert len(gemm) == 2


def test_projection_transposed_into_heads_with_a_scale_is_one_gemm_kernel(tmp_path):
    rng = np.random.default_rng(3)
    model, gemm = _compare(_heads_projection(tmp_path), ["B=1:4", "L=1:128"],
                           [{"x": rng.standard_normal((B, L, 64)).astype(np.float32)}
                            for B, L in [(1, 1), (1, 2), (3, 13), (2, 97), (4, 128)]])
    assert len(gemm) == 1 and "scattered" in model.kernels[gemm[0]][0].source
