"""ONNX function operators expanded at import (tscomp/graph/functions.py): an operator the registry
does not implement whose schema defines it by a body -- static (MeanVarianceNormalization) or built
from the node and its input types (RMSNormalization, Attention at opset 23) -- compiles as that
body, fused like exported primitives, and matches onnxruntime; model-local functions are inlined;
an operator with neither an entry nor a body is refused by name. ONNX's own cases for every such
operator run in test_onnx_conformance.py."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tscomp.compiler import compile_model
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph import load_model
from tscomp.runtime import Runtime


def _save(tmp_path, name, nodes, inputs, inits=(), opset=23, functions=()):
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] +
                              ([helper.make_opsetid("local", 1)] if functions else []),
                              ir_version=10, functions=list(functions))
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _check(path, dims, shapes, rng, *, native=True):
    model = compile_model(str(path), dims, max_variants=1)
    if native:
        assert not model.fallback_groups(), model.fallback_groups()
    rt = Runtime.from_compiled(model)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    for shape_set in shapes:
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shape_set)}
        np.testing.assert_allclose(rt.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4,
                                   err_msg=str(shape_set))
    return model


def test_rms_normalization_after_a_matmul_is_one_native_gemm_group(tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "scale")]
    path = _save(tmp_path, "rms", [helper.make_node("MatMul", ["x", "w"], ["h"]),
                                   helper.make_node("RMSNormalization", ["h", "scale"], ["y"], epsilon=1e-5)],
                 [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", 32])], inits)
    graph = load_model(path, ["B=1:2", "L=1:64"])
    assert "RMSNormalization" not in {n.op_type for n in graph.nodes}
    model = _check(path, ["B=1:2", "L=1:64"], [[(1, 1, 32)], [(2, 13, 32)], [(2, 64, 32)]], rng)
    assert [ks[0].family for ks in model.kernels.values()] == ["gemm"]      # the norm is the GEMM's row pass


def test_attention_at_opset_23_compiles_and_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(1)
    q, k, v = (helper.make_tensor_value_info(n, TP.FLOAT, ["B", 2, "L", 8]) for n in "qkv")
    path = _save(tmp_path, "attention", [helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)],
                 [q, k, v])
    model = _check(path, ["B=1:2", "L=1:40"], [[(1, 2, 1, 8)] * 3, [(2, 2, 17, 8)] * 3, [(1, 2, 40, 8)] * 3], rng)
    assert "attention" in {ks[0].family for ks in model.kernels.values()}     # one fused group, as opset 20's


def test_attention_with_fewer_kv_heads_and_a_mask_at_opset_23_runs_every_group_natively(tmp_path):
    """Grouped KV heads and an additive mask, as torch's opset-23 export writes them: the body's
    CastLikes against whole score tensors are Casts (no numpy group), and with its same-type Casts
    gone and its safe-softmax Where after P.V, the fused attention family compiles it."""
    rng = np.random.default_rng(3)
    q = helper.make_tensor_value_info("q", TP.FLOAT, ["B", 4, "L", 8])
    k, v = (helper.make_tensor_value_info(n, TP.FLOAT, ["B", 2, "L", 8]) for n in "kv")
    mask = helper.make_tensor_value_info("mask", TP.FLOAT, ["B", 1, "L", "L"])
    path = _save(tmp_path, "gqa", [helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], scale=0.3)],
                 [q, k, v, mask])
    graph = load_model(path, ["B=1:2", "L=1:40"])
    assert "CastLike" not in {n.op_type for n in graph.nodes}
    model = _check(path, ["B=1:2", "L=1:40"], [[(1, 4, 1, 8), (1, 2, 1, 8), (1, 2, 1, 8), (1, 1, 1, 1)],
                                              [(2, 4, 17, 8), (2, 2, 17, 8), (2, 2, 17, 8), (2, 1, 17, 17)]], rng)
    assert "attention" in {ks[0].family for ks in model.kernels.values()}


def test_mean_variance_normalization_takes_its_default_axes(tmp_path):
    rng = np.random.default_rng(2)
    path = _save(tmp_path, "mvn", [helper.make_node("MeanVarianceNormalization", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TP.FLOAT, ["B", 3, "H", "W"])], opset=13)
    _check(path, ["B=1:3", "H=1:9", "W=1:9"], [[(1, 3, 1, 2)], [(3, 3, 9, 4)], [(2, 3, 5, 9)]], rng, native=False)


@pytest.mark.parametrize("opset", [21, 23])
def test_group_normalization_takes_the_newest_body_at_or_below_the_model_opset(tmp_path, opset):
    """GroupNormalization's schema has bodies for opsets 18 and 21 only: a model at opset 23 (torch's
    opset-23 export of HuBERT) expands the opset-21 body."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), n) for n in ("scale", "bias")]
    path = _save(tmp_path, "gn", [helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3,
                                                   epsilon=1e-5)],
                 [helper.make_tensor_value_info("x", TP.FLOAT, ["B", 6, "T"])], inits, opset=opset)
    _check(path, ["B=1:3", "T=1:50"], [[(1, 6, 1)], [(3, 6, 17)], [(2, 6, 50)]], rng)


def test_a_model_local_function_is_inlined(tmp_path):
    # local.scaled_tanh(x) = tanh(x) * 2, called from the graph
    two = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32)))
    fn = helper.make_function("local", "scaled_tanh", ["a"], ["b"],
                              [two, helper.make_node("Tanh", ["a"], ["t"]), helper.make_node("Mul", ["t", "two"], ["b"])],
                              [helper.make_opsetid("", 17)])
    path = _save(tmp_path, "local", [helper.make_node("scaled_tanh", ["x"], ["y"], domain="local")],
                 [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 5])], opset=17, functions=[fn])
    _check(path, ["N=1:8"], [[(1, 5)], [(8, 5)]], np.random.default_rng(3))


def test_an_operator_with_neither_an_entry_nor_a_function_body_is_refused_by_name(tmp_path):
    inits = [numpy_helper.from_array(np.array([4, 4], np.int64), "image"),
             numpy_helper.from_array(np.array([2, 2], np.int64), "block")]
    path = _save(tmp_path, "col2im", [helper.make_node("Col2Im", ["x", "image", "block"], ["y"], name="fold")],
                 [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 9])], inits, opset=18)
    with pytest.raises(UnsupportedOperatorError, match="node 'fold': operator Col2Im .* is not supported by tscomp"):
        load_model(path, ["N=1:4"])
