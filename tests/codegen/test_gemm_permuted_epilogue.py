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


def _time_major_projection(tmp_path, D=32, N=48):
    """WavLM's attention output projection: rows ordered (t, b) -- a [T*B, D] Gemm -- reshaped to
    [T, B, N] and transposed to [B, T, N] before the residual Add and a LayerNorm over N: the
    epilogue reads the GEMM at row (t, b) for its element (b, t)."""
    rng = np.random.default_rng(5)
    W = rng.standard_normal((N, D)).astype(np.float32) / np.sqrt(D)
    c, g, beta = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Gather", ["xs", "i0"], ["nb"]), helper.make_node("Gather", ["xs", "i1"], ["nt"]),
             helper.make_node("Mul", ["nb", "nt"], ["rows"]),
             helper.make_node("Concat", ["rows", "d"], ["flat"], axis=0),
             helper.make_node("Reshape", ["xt", "flat"], ["a"]),
             helper.make_node("Gemm", ["a", "W", "c"], ["m"], transB=1),
             helper.make_node("Concat", ["nt", "nb", "n"], ["tbn"], axis=0),
             helper.make_node("Reshape", ["m", "tbn"], ["m3"]),
             helper.make_node("Transpose", ["m3"], ["mb"], perm=[1, 0, 2]),
             helper.make_node("Add", ["mb", "r"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    inits = [_t("W", W), _t("c", c), _t("g", g), _t("beta", beta),
             helper.make_tensor("i0", TP.INT64, [1], [0]), helper.make_tensor("i1", TP.INT64, [1], [1]),
             helper.make_tensor("d", TP.INT64, [1], [D]), helper.make_tensor("n", TP.INT64, [1], [N])]
    return _save(tmp_path, "time_major_projection", nodes,
                 [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "T", D]),
                  helper.make_tensor_value_info("r", TP.FLOAT, ["B", "T", N])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, ["B", "T", N])], inits)


def test_a_gemm_read_in_transposed_row_order_computes_its_rows_in_that_order(tmp_path):
    """The GEMM runs natively (no numpy fallback) over A read in the epilogue's row order, and the
    residual + LayerNorm are fused into it. Here A's own views (x transposed to time-major) and the
    epilogue's (back to batch-major) cancel: the kernel reads x in place."""
    rng = np.random.default_rng(6)
    shapes = [(1, 1), (1, 2), (3, 13), (2, 97), (4, 128), (4, 1)]
    model, gemm = _compare(_time_major_projection(tmp_path), ["B=1:4", "T=1:128"],
                           [{"x": rng.standard_normal((B, T, 32)).astype(np.float32),
                             "r": rng.standard_normal((B, T, 48)).astype(np.float32)} for B, T in shapes])
    assert len(gemm) == 1 and len(model.plan.groups) == 1, [g.name for g in model.plan.groups]
    assert "A = x\n" in model.kernels[gemm[0]][0].source
