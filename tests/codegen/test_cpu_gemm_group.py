"""Fused gemm groups (constant-weight MatMul/Gemm + elementwise epilogue) compiled to the CPU
macro-kernel (:mod:`tscomp.codegen.cpu_gemm_group`), checked against the Plan interpreter on the
tiny exported models and against onnxruntime on a hand-built MatMul + bias + Relu + residual."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.codegen.cpu_gemm_group import CompiledGemmGroup
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion import fuse
from tscomp.graph.reference import bind_symbols, materialize
from tests.codegen.plan_runs import close, interpreted_groups, model_plan


MODELS = [pytest.param(f, e, id=f"{f}-{e}") for f in ("bert", "gpt2", "vit") for e in ("dynamo", "torchscript")]


@pytest.mark.models
@pytest.mark.parametrize("family,exporter", MODELS)
def test_model_gemm_groups_match_the_interpreter(exported_model, record_property, family, exporter):
    plan, ranges = model_plan(exported_model, family, exporter)
    kernels, refused = {}, {}
    for g in plan.groups:
        if g.kind != "gemm":
            continue
        try:
            kernels[g.name] = CompiledGemmGroup(plan, g)
        except UnsupportedOperatorError as exc:
            assert g.name in str(exc)
            refused[g.name] = str(exc)
    for binding, g, genv, bound, want in interpreted_groups(plan, family, ranges):
        if g.name in kernels:
            got = kernels[g.name].run(genv, bound)
            assert set(got) == set(want)
            for name in want:
                close(got[name], want[name], f"{g.name}:{name} at {binding}")
    summary = (f"{family}-{exporter}: {len(kernels)}/{len(kernels) + len(refused)} gemm groups compiled "
               f"({', '.join(kernels)}); refused: " + ("; ".join(refused.values()) or "-"))
    record_property("gemm_coverage", summary)
    print(summary)
    assert kernels, summary
    if family == "bert":
        by_name = {g.name: g for g in plan.groups}
        epis = {n: [o.op_type for o in by_name[n].prologue_epilogue()[2]] for n in kernels}
        widths = {n: int(list(by_name[n].outputs.values())[0].shape[-1]) for n in kernels}
        qkv = [n for n in kernels if widths[n] == 384 and epis[n] == ["Add"]]
        ffn_up = [n for n in kernels if widths[n] == 512 and "Add" in epis[n]
                  and any(op in ("Gelu", "Erf") for op in epis[n])]
        assert len(qkv) == 2, f"QKV (+bias) groups not accepted: {summary}"
        assert len(ffn_up) == 2, f"FFN-up (+bias+GELU) groups not accepted: {summary}"


def _save(tmp_path, K, N):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((K, N)).astype(np.float32) / np.sqrt(K)
    b = rng.standard_normal(N).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["biased"]),
             helper.make_node("Relu", ["biased"], ["act"]),
             helper.make_node("Add", ["act", "res"], ["y"])]
    graph = helper.make_graph(
        nodes, "mm_bias_relu_res",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "S", K]),
         helper.make_tensor_value_info("res", TP.FLOAT, ["B", "S", N])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["B", "S", N])],
        initializer=[helper.make_tensor("W", TP.FLOAT, W.shape, W.reshape(-1).tolist()),
                     helper.make_tensor("b", TP.FLOAT, b.shape, b.tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / "mm.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("M", [1, 7, 13, 97, 513])
def test_matmul_bias_relu_residual_vs_onnxruntime(tmp_path, M):
    ort = pytest.importorskip("onnxruntime")
    K, N = 40, 72
    path = _save(tmp_path, K, N)
    plan = fuse(G.load_model(path, ["B=1:4", "S=1:1024"]))
    gemm = [g for g in plan.groups if g.kind == "gemm"]
    assert len(gemm) == 1 and len(plan.groups) == 1, plan.describe()
    kernel = CompiledGemmGroup(plan, gemm[0])
    rng = np.random.default_rng(M)
    B, S = (1, M)
    feeds = {"x": rng.standard_normal((B, S, K)).astype(np.float32),
             "res": rng.standard_normal((B, S, N)).astype(np.float32)}
    bound = bind_symbols(plan.graph, feeds)
    env = dict(feeds)
    for name in gemm[0].inputs:
        if name not in env:
            env[name] = materialize(plan.graph, plan.graph.values[name], bound)
    got = kernel.run(env, bound)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    close(got["y"], ref, f"M={M}")


def test_unsupported_groups_are_refused_with_the_group_name(tmp_path):
    # batched GEMM with two activation operands
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "bmm", [helper.make_tensor_value_info("a", TP.FLOAT, ["S", 8]),
                                             helper.make_tensor_value_info("b", TP.FLOAT, [8, 4])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["S", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / "bmm.onnx"
    onnx.save(model, path)
    plan = fuse(G.load_model(path, ["S=1:64"]))
    g = next(g for g in plan.groups if g.kind == "gemm")
    with pytest.raises(UnsupportedOperatorError, match=rf"group {g.name}: .*not a constant weight"):
        CompiledGemmGroup(plan, g)
