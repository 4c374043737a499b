"""The attention merge (:mod:`tscomp.graph.fusion.attention`): a closed QKᵀ → softmax → P·V chain
of activations becomes one ``attention`` group that keeps its three parts; a chain whose scores or
probabilities are needed elsewhere, or whose MatMul multiplies a weight, is left alone; splitting a
merged group gives back plans that compute the same thing."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.graph.fusion import fuse, run_plan
from tests.codegen.test_cpu_attention import DIMS, attention_model, feeds_at, window_attention_model


def kinds(plan):
    return [g.kind for g in plan.groups]


def test_a_closed_attention_chain_becomes_one_group_with_its_three_parts(tmp_path):
    plan = fuse(G.load_model(attention_model(tmp_path, 16, 16), DIMS))
    assert kinds(plan) == ["attention"]
    g = plan.groups[0]
    assert [p.kind for p in g.parts] == ["gemm", "reduce", "gemm"]
    assert "attention" in g.rules
    assert list(g.outputs) == ["y"] and sorted(g.inputs) == ["k", "mask", "q", "v"]


def test_probabilities_that_are_a_graph_output_keep_the_chain_apart(tmp_path):
    plan = fuse(G.load_model(attention_model(tmp_path, 16, 16, probs_out=True), DIMS))
    assert "attention" not in kinds(plan)
    assert kinds(plan).count("gemm") == 2


def test_attention_false_keeps_the_three_groups(tmp_path):
    plan = fuse(G.load_model(attention_model(tmp_path, 16, 16), DIMS), attention=False)
    assert kinds(plan) == ["gemm", "reduce", "gemm"]


def test_a_split_plan_computes_what_the_merged_plan_computes(tmp_path):
    plan = fuse(G.load_model(attention_model(tmp_path, 16, 24), DIMS))
    split = plan.split([plan.groups[0].name])
    assert kinds(split) == ["gemm", "reduce", "gemm"]
    feeds = feeds_at(2, 9, 14, 16, 24, np.random.default_rng(0), dead_rows=(2,))
    np.testing.assert_allclose(run_plan(split, feeds)["y"], run_plan(plan, feeds)["y"], rtol=1e-6, atol=1e-6)


def test_a_chain_through_a_constant_weight_is_not_attention(tmp_path):
    """x·W → Softmax → ·W2 (a classifier head, say) has no second activation operand."""
    w = helper.make_tensor("w", TP.FLOAT, [8, 8], np.ones(64, np.float32))
    w2 = helper.make_tensor("w2", TP.FLOAT, [8, 4], np.ones(32, np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "w2"], ["y"])], "head",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 4])], initializer=[w, w2])
    path = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    plan = fuse(G.load_model(path, ["n=1:64"]))
    assert "attention" not in kinds(plan)


def test_window_attention_with_a_static_key_count_is_merged_not_stitched_into_qk(tmp_path):
    """Swin: windows of 16 tokens, so QKᵀ's last axis (the Softmax's row) is a static 16. A row
    reduction stitches onto a GEMM only when its B operand is a weight (the batched kernel has no
    row pass): here the Softmax stays its own group and the chain merges into attention."""
    path, reference = window_attention_model(tmp_path)
    plan = fuse(G.load_model(path, ["w=1:64"]))
    assert kinds(plan) == ["attention"]
    feeds = {n: np.random.default_rng(k).standard_normal((5, 2, 16, 8)).astype(np.float32) for k, n in enumerate("qkv")}
    np.testing.assert_allclose(run_plan(plan, feeds)["y"], reference(**feeds), rtol=1e-5, atol=1e-5)
