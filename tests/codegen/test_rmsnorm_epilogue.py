"""RMSNorm fused after a GEMM (Llama's post-attention / post-MLP norm, issue 11): the row pass reads
the GEMM through several pre-reduction values (``Cast(h)`` and ``Pow(Cast(h), 2)``, or ``h`` and
``Pow(h, 2)``); the tile epilogue stores the value they all read it through (the residual sum ``h``)
and the row pass recomputes the others element by element. Checked against onnxruntime at awkward
row counts and under every candidate tile configuration."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.codegen.cpu_gemm_group import candidate_configs_for, compile_gemm_group
from tscomp.graph.fusion import fuse
from tscomp.graph.fusion.expr import Op
from tscomp.graph.reference import bind_symbols, materialize
from tests.codegen.plan_runs import close


def _rmsnorm_model(tmp_path, K, N, variant):
    """MatMul + bias + residual = h (exported: the residual stream), then RMSNorm of h:

    * "torchscript": Cast(h) -> Pow 2 -> ReduceMean -> Add eps -> Sqrt -> Div(Cast(h), .) -> Cast -> Mul w
    * "dynamo":      Pow(h, 2) -> ReduceMean -> Add eps -> Sqrt -> Reciprocal -> Mul(h, .) -> Mul w
    """
    rng = np.random.default_rng(3)
    W = rng.standard_normal((K, N)).astype(np.float32) / np.sqrt(K)
    b = rng.standard_normal(N).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32)
    inits = [helper.make_tensor("W", TP.FLOAT, W.shape, W.reshape(-1).tolist()),
             helper.make_tensor("b", TP.FLOAT, b.shape, b.tolist()),
             helper.make_tensor("w", TP.FLOAT, w.shape, w.tolist()),
             helper.make_tensor("two", TP.FLOAT, [], [2.0]),
             helper.make_tensor("eps", TP.FLOAT, [], [1e-6]),
             helper.make_tensor("axes", TP.INT64, [1], [-1])]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["biased"]),
             helper.make_node("Add", ["biased", "res"], ["h"])]
    if variant == "torchscript":
        nodes += [helper.make_node("Cast", ["h"], ["hf"], to=TP.FLOAT),
                  helper.make_node("Pow", ["hf", "two"], ["sq"]),
                  helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
                  helper.make_node("Add", ["ms", "eps"], ["mse"]),
                  helper.make_node("Sqrt", ["mse"], ["rms"]),
                  helper.make_node("Div", ["hf", "rms"], ["nrm"]),
                  helper.make_node("Cast", ["nrm"], ["nrm_t"], to=TP.FLOAT),
                  helper.make_node("Mul", ["w", "nrm_t"], ["y"])]
    else:
        nodes += [helper.make_node("Pow", ["h", "two"], ["sq"]),
                  helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
                  helper.make_node("Add", ["ms", "eps"], ["mse"]),
                  helper.make_node("Sqrt", ["mse"], ["rms"]),
                  helper.make_node("Reciprocal", ["rms"], ["inv"]),
                  helper.make_node("Mul", ["h", "inv"], ["nrm"]),
                  helper.make_node("Mul", ["w", "nrm"], ["y"])]
    graph = helper.make_graph(
        nodes, f"mm_rmsnorm_{variant}",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "S", K]),
         helper.make_tensor_value_info("res", TP.FLOAT, ["B", "S", N])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["B", "S", N]),
         helper.make_tensor_value_info("h", TP.FLOAT, ["B", "S", N])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / f"mm_rmsnorm_{variant}.onnx"
    onnx.save(model, path)
    return path


_KERNELS: dict = {}


def _kernel(tmp_path_factory, K, N, variant):
    key = (K, N, variant)
    if key not in _KERNELS:
        path = _rmsnorm_model(tmp_path_factory.mktemp("rms"), K, N, variant)
        plan = fuse(G.load_model(path, ["B=1:4", "S=1:1024"]))
        gemm = [g for g in plan.groups if g.kind == "gemm"]
        assert len(gemm) == 1 and len(plan.groups) == 1, plan.describe()
        _KERNELS[key] = (path, plan, gemm[0], compile_gemm_group(plan, gemm[0]))
    return _KERNELS[key]


def _run_vs_ort(path, plan, group, kernel, B, S, K, N):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(B * 1000 + S)
    feeds = {"x": rng.standard_normal((B, S, K)).astype(np.float32),
             "res": rng.standard_normal((B, S, N)).astype(np.float32)}
    bound = bind_symbols(plan.graph, feeds)
    env = dict(feeds)
    for name in group.inputs:
        if name not in env:
            env[name] = materialize(plan.graph, plan.graph.values[name], bound)
    got = kernel.run(env, bound)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for name, ref in zip(names, sess.run(None, feeds)):
        close(got[name], ref, f"{name} at B={B}, S={S}")


@pytest.mark.parametrize("variant", ["torchscript", "dynamo"])
def test_rmsnorm_row_pass_stores_the_common_value_and_recomputes_the_others(tmp_path_factory, variant):
    K, N = 40, 72
    path, plan, group, kernel = _kernel(tmp_path_factory, K, N, variant)
    assert kernel.has_row_pass and "row_pass(Y, m0, mv" in kernel.source
    T = kernel.analysis.T
    # the value both the Pow and the normalizing Mul/Div read the GEMM through (past an identity
    # Cast): the exported residual sum, so Y is that output and no extra M x N buffer is written
    assert isinstance(T, Op) and T.op_type == "Add", T
    assert kernel.y_output == "h" and not kernel.analysis.y_inplace


@pytest.mark.parametrize("variant", ["torchscript", "dynamo"])
@pytest.mark.parametrize("B,S", [(1, 1), (1, 2), (3, 13), (2, 97), (1, 1024)])
def test_rmsnorm_epilogue_vs_onnxruntime(tmp_path_factory, variant, B, S):
    K, N = 40, 72                       # N not a multiple of the register tile: padded columns
    path, plan, group, kernel = _kernel(tmp_path_factory, K, N, variant)
    _run_vs_ort(path, plan, group, kernel, B, S, K, N)


def test_rmsnorm_epilogue_every_candidate_config(tmp_path_factory):
    """K = 300 takes several K steps before the row pass; whole-row and split-N configurations
    (the row pass after the tiles) agree with onnxruntime."""
    K, N = 300, 136
    path, plan, group, kernel = _kernel(tmp_path_factory, K, N, "torchscript")
    configs = candidate_configs_for(kernel)
    assert len(configs) >= 2
    for cfg in configs:
        k = compile_gemm_group(plan, group, cfg)
        for B, S in ((1, 1), (2, 37)):
            _run_vs_ort(path, plan, group, k, B, S, K, N)


def test_two_reductions_of_different_functions_of_the_gemm_store_the_gemm_itself(tmp_path):
    """Frontier values Mul(mm, mm) and Add(mm, b) share only the GEMM result: Y holds it and the row
    pass recomputes both (row statistics as outputs)."""
    ort = pytest.importorskip("onnxruntime")
    K, N = 24, 40
    rng = np.random.default_rng(4)
    W = rng.standard_normal((K, N)).astype(np.float32) / np.sqrt(K)
    b = rng.standard_normal(N).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("Mul", ["mm", "mm"], ["sq"]),
             helper.make_node("ReduceSum", ["sq", "axes"], ["ss"], keepdims=1),
             helper.make_node("Add", ["mm", "b"], ["h"]),
             helper.make_node("ReduceMax", ["h", "axes"], ["mx"], keepdims=1),
             helper.make_node("Sub", ["h", "mx"], ["hc"]),
             helper.make_node("Div", ["hc", "ss"], ["y"])]
    graph = helper.make_graph(
        nodes, "mm_two_frontiers", [helper.make_tensor_value_info("x", TP.FLOAT, ["S", K])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["S", N])],
        initializer=[helper.make_tensor("W", TP.FLOAT, W.shape, W.reshape(-1).tolist()),
                     helper.make_tensor("b", TP.FLOAT, b.shape, b.tolist()),
                     helper.make_tensor("axes", TP.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / "two_frontiers.onnx"
    onnx.save(model, path)
    plan = fuse(G.load_model(path, ["S=1:256"]))
    (group,) = [g for g in plan.groups if g.kind == "gemm"]
    kernel = compile_gemm_group(plan, group)
    assert kernel.has_row_pass and kernel.analysis.T is kernel.analysis.heavy
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for S in (1, 7, 97, 256):
        x = rng.standard_normal((S, K)).astype(np.float32)
        bound = bind_symbols(plan.graph, {"x": x})
        env = {"x": x, **{n: materialize(plan.graph, plan.graph.values[n], bound) for n in group.inputs if n != "x"}}
        close(kernel.run(env, bound)["y"], sess.run(None, {"x": x})[0], f"S={S}")
