"""The compiler's family choice (:func:`tscomp.compiler.choose_families`): a fused group no kernel
family accepts whole is split into its heavy op and its epilogue before anything falls back to
numpy (:func:`tscomp.graph.fusion.partition.unfused_parts`)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper

from tscomp.compiler import choose_families, compile_model
from tscomp.graph import load_model
from tscomp.graph.fusion import fuse
from tscomp.runtime import Runtime

DIMS = ["B=1:4", "L=1:64"]


def _attention_output_normalized(path):
    """p [B, 4, L, L] · v [B, 4, L, 8] -> Transpose(0, 2, 1, 3) -> Reshape [B, L, 32] -> Pow 2: the
    shape rules fuse the head-merging transpose and the Pow into the batched GEMM's epilogue (BitNet
    normalizes its attention output right after P·V), a group the batched GEMM family refuses."""
    nodes = [helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ot", "shape"], ["merged"]),
             helper.make_node("Pow", ["merged", "two"], ["y"])]
    graph = helper.make_graph(
        nodes, "pv_norm",
        [helper.make_tensor_value_info("p", TP.FLOAT, ["B", 4, "L", "L"]),
         helper.make_tensor_value_info("v", TP.FLOAT, ["B", 4, "L", 8])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [helper.make_tensor("shape", TP.INT64, [3], [0, 0, 32]), helper.make_tensor("two", TP.FLOAT, [], [2.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def _compiled_natively_matches_onnxruntime(path, shapes) -> None:
    """The model of p [B, 4, L, L] and v [B, 4, L, 8] compiles with no numpy group and matches
    onnxruntime at every (B, L) of ``shapes``."""
    rt = Runtime.from_compiled(compile_model(str(path), DIMS))
    assert all(k.family != "numpy" for ks in rt.model.kernels.values() for k in ks)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, L in shapes:
        feeds = {"p": rng.random((b, 4, L, L)).astype(np.float32), "v": rng.standard_normal((b, 4, L, 8)).astype(np.float32)}
        np.testing.assert_allclose(rt.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_gemm_group_no_family_takes_whole_splits_into_the_gemm_and_its_epilogue(tmp_path):
    path = tmp_path / "pv.onnx"
    _attention_output_normalized(path)
    plan = fuse(load_model(path, DIMS))
    fused = [g for g in plan.groups if g.kind == "gemm"]
    assert len(fused) == 1 and fused[0].unfused, plan.describe()
    split, choices = choose_families(plan)
    assert choices[fused[0].name].group is not fused[0]          # the name now holds the GEMM alone
    assert all(c.family is not None for c in choices.values()), {n: c.reasons for n, c in choices.items()}
    assert any("split-epilogue" in g.rules for g in split.groups)
    _compiled_natively_matches_onnxruntime(path, [(1, 1), (3, 7), (4, 64)])


def test_a_group_a_family_accepts_whole_is_not_split(tmp_path):
    """A GEMM with a bias + Relu epilogue keeps its fusion: the split is a fallback only."""
    w = helper.make_tensor("w", TP.FLOAT, [8, 16], np.random.default_rng(1).standard_normal(128).astype(np.float32))
    b = helper.make_tensor("b", TP.FLOAT, [16], np.ones(16, np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", 8])], [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [w, b])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    plan = fuse(load_model(path, DIMS))
    split, choices = choose_families(plan)
    assert [g.name for g in split.groups] == [g.name for g in plan.groups]
    assert not any("split-epilogue" in g.rules for g in split.groups)


def test_a_group_whose_source_the_family_refuses_splits_before_it_falls_back(tmp_path, monkeypatch):
    """Some refusals surface only while a source is generated (DiffLlama's QDQ export: P·V read
    through a view no store follows); such a group went whole to the numpy fallback at build time.
    With the target given, the family choice generates one source per splittable group, so the
    group splits into its GEMM and epilogue, and both compile. Here the batched GEMM family's
    executor is made to refuse any group with an epilogue (it accepts the analysis)."""
    import dataclasses

    import tscomp.codegen.families as families
    from tscomp.errors import UnsupportedOperatorError
    from tscomp.schedule.target import host_cpu
    w = helper.make_tensor("s", TP.FLOAT, [], [0.5])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["p", "v"], ["o"]), helper.make_node("Mul", ["o", "s"], ["y"])], "pv",
        [helper.make_tensor_value_info("p", TP.FLOAT, ["B", 4, "L", "L"]),
         helper.make_tensor_value_info("v", TP.FLOAT, ["B", 4, "L", 8])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)], [w])
    path = tmp_path / "pv_scaled.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)

    def refusing(original):
        def executor(analysis, config, target):
            if analysis.group.prologue_epilogue()[2]:
                raise UnsupportedOperatorError("group: refused while generating the source (test)")
            return original(analysis, config, target)
        return executor

    patched = [dataclasses.replace(f, executor=refusing(f.executor)) if f.name == "batched-gemm" else f
               for f in families.FAMILIES]
    monkeypatch.setattr(families, "FAMILIES", patched)
    plan = fuse(load_model(path, DIMS))
    _, without_target = choose_families(plan)
    assert all(c.family is not None for c in without_target.values())       # the analysis accepts it whole
    split, choices = choose_families(plan, host_cpu())
    assert any("split-epilogue" in g.rules for g in split.groups)
    assert all(c.family is not None for c in choices.values()), {n: c.reasons for n, c in choices.items()}
    _compiled_natively_matches_onnxruntime(path, [(1, 1), (2, 13), (4, 64)])
