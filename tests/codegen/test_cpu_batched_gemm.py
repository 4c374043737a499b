"""Batched GEMM groups (MatMul with two activation operands: attention's QKᵀ and PV, with their
fused prologues and epilogues) compiled to the CPU macro-kernel
(:mod:`tscomp.codegen.cpu_batched_gemm`), checked against the Plan interpreter on the tiny exported
models and against onnxruntime on a hand-built transposed, scaled, masked batched MatMul at awkward
sizes."""
from __future__ import annotations

import pickle

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.codegen.build import host_isa
from tscomp.codegen.cpu_batched_gemm import BatchedGemmAnalysis, compile_batched_gemm_group, candidate_configs
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion import fuse
from tscomp.graph.fusion.expr import Input, View
from tscomp.graph.reference import bind_symbols, materialize
from tests.codegen.plan_runs import check_against_interpreter, compile_gemm_groups, close, model_plan

FAMILIES = ("bert", "albert", "roberta", "distilbert", "gpt2", "vit")
MODELS = [pytest.param(f, e, id=f"{f}-{e}") for f in FAMILIES for e in ("dynamo", "torchscript")]
#: models whose attention (QKᵀ and PV of every layer) must compile
MUST_ACCEPT = {("bert", "dynamo"), ("gpt2", "dynamo"), ("vit", "dynamo")}


def _activation_matmuls(plan):
    """Names of the gemm groups whose MatMul reads two activation operands (the batched GEMMs)."""
    out = []
    for g in plan.groups:
        if g.kind != "gemm":
            continue
        _, heavy, _ = g.prologue_epilogue()
        if not heavy or heavy[0].op_type != "MatMul":
            continue
        b = heavy[0].args[1]
        while isinstance(b, View):
            b = b.src
        if isinstance(b, Input) and plan.graph.values[b.name].const is not None:
            continue
        out.append(g.name)
    return out


@pytest.mark.models
@pytest.mark.parametrize("family,exporter", MODELS)
def test_model_batched_gemm_groups_match_the_interpreter(exported_model, record_property, family, exporter):
    plan, ranges = model_plan(exported_model, family, exporter, attention=False)
    batched = _activation_matmuls(plan)
    kernels, refused = compile_gemm_groups(plan, compile_batched_gemm_group)
    # constant-weight GEMMs are CompiledGemmGroup's: never taken here
    assert set(kernels) <= set(batched), sorted(set(kernels) - set(batched))
    checked = check_against_interpreter(plan, family, ranges, kernels)
    not_taken = {n: refused[n] for n in batched if n in refused}
    summary = (f"{family}-{exporter}: {len(kernels)}/{len(batched)} batched gemm groups compiled "
               f"({', '.join(kernels) or '-'}); refused: " + ("; ".join(not_taken.values()) or "-"))
    record_property("batched_gemm_coverage", summary)
    print(summary)
    assert checked == 2 * len(kernels)
    if (family, exporter) in MUST_ACCEPT:
        assert batched and len(batched) % 2 == 0, summary    # QKᵀ and PV per layer
        assert not not_taken, summary


# ----------------------------------------------------------------------------- hand-built model
H, SCALE = 2, 0.125


def _attention_model(tmp_path):
    """a: [batch, M, H, K] -> [batch, H, M, K] (Transpose) * scale;  b: [batch, N, H, K] ->
    [batch, H, K, N] (Transpose) * scale;  y = MatMul(a', b') + mask[batch, 1, M, N]."""
    scale = helper.make_tensor("scale", TP.FLOAT, [], [SCALE])
    nodes = [helper.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1, 3]),
             helper.make_node("Mul", ["at", "scale"], ["as"]),
             helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 3, 1]),
             helper.make_node("Mul", ["bt", "scale"], ["bs"]),
             helper.make_node("MatMul", ["as", "bs"], ["mm"]),
             helper.make_node("Add", ["mm", "mask"], ["y"])]
    graph = helper.make_graph(
        nodes, "scaled_masked_bmm",
        [helper.make_tensor_value_info("a", TP.FLOAT, ["batch", "M", H, "K"]),
         helper.make_tensor_value_info("b", TP.FLOAT, ["batch", "N", H, "K"]),
         helper.make_tensor_value_info("mask", TP.FLOAT, ["batch", 1, "M", "N"])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", H, "M", "N"])],
        initializer=[scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / "bmm.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    path = _attention_model(tmp_path_factory.mktemp("bmm"))
    plan = fuse(G.load_model(path, ["batch=1:4", "M=1:600", "N=1:600", "K=1:600"]))
    gemm = [g for g in plan.groups if g.kind == "gemm"]
    assert len(gemm) == 1 and len(plan.groups) == 1, plan.describe()
    return path, plan, gemm[0]


#: (M, N, K): every value of {1, 7, 13, 97, 511, 512, 513} on every axis, not the full product
SIZES = [(1, 1, 1), (7, 13, 97), (13, 511, 7), (97, 7, 512), (511, 97, 13), (512, 513, 1),
         (513, 1, 511), (1, 512, 513), (13, 13, 13), (97, 97, 64)]


def _ort_check(path, plan, kernel, M, N, K, batch=2, seed=0):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(seed)
    feeds = {"a": rng.standard_normal((batch, M, H, K)).astype(np.float32),
             "b": rng.standard_normal((batch, N, H, K)).astype(np.float32),
             "mask": rng.standard_normal((batch, 1, M, N)).astype(np.float32)}
    bound = bind_symbols(plan.graph, feeds)
    env = dict(feeds)
    for name in kernel.group.inputs:
        if name not in env:
            env[name] = materialize(plan.graph, plan.graph.values[name], bound)
    got = kernel.run(env, bound)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    close(got["y"], ref, f"M={M} N={N} K={K}")
    return bound


@pytest.mark.parametrize("M,N,K", SIZES)
def test_scaled_masked_batched_matmul_vs_onnxruntime(attention, M, N, K):
    path, plan, g = attention
    kernel = compile_batched_gemm_group(plan, g)
    _ort_check(path, plan, kernel, M, N, K)


def test_every_candidate_config_is_correct(attention):
    """Each tile configuration the runtime may pick computes the same thing (edge tiles, several
    K steps, N split in blocks)."""
    path, plan, g = attention
    cfgs = BatchedGemmAnalysis(plan, g).heuristic_configs(host_isa())
    assert len(cfgs) >= 2
    for cfg in cfgs:
        kernel = compile_batched_gemm_group(plan, g, cfg)
        assert kernel.cfg == cfg and cfg.slug() in kernel.func
        _ort_check(path, plan, kernel, 97, 300, 400, batch=1, seed=3)


def test_kernel_contract(attention):
    path, plan, g = attention
    kernel = compile_batched_gemm_group(plan, g)
    src = kernel.source
    assert src.startswith("/*") and g.name in src.split("*/")[0]
    for word in ("prologue A: Mul", "prologue B: Mul", "epilogue:   Add", "T_Mi x T_Ni", "DietCode 4.1"):
        assert word in src, word
    assert kernel.func.startswith(f"tscomp_{g.name}_{host_isa()}_")
    # run is memoized per binding (no sympy on a repeated binding)
    bound = _ort_check(path, plan, kernel, 100, 7, 5, batch=3)
    assert tuple(sorted(bound.items())) in kernel._sizes
    cfg = kernel.cfg
    assert kernel.tasks(bound) == 3 * H * -(-100 // cfg.mc) * -(-7 // cfg.nc)
    # pickles without the ctypes function; the runtime rebinds it from a library
    clone = pickle.loads(pickle.dumps(kernel))
    assert clone.fn is None and clone.func == kernel.func
    from tscomp.codegen.build import build_library, load_library
    clone._bind_function(load_library(build_library(clone.source, clone.func)))
    _ort_check(path, plan, clone, 13, 7, 5)


def test_candidate_configs_are_valid():
    for isa in ("avx512", "avx2", "scalar"):
        for dims in ((None, None, 64), (None, 64, None), (1, 1, 1), (512, 512, 64)):
            cfgs = candidate_configs(isa, *dims)
            assert cfgs and all(c.validate(isa) for c in cfgs)


def _plan_of(tmp_path, nodes, inputs, outputs, inits=(), dims=("S=1:64",)):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    plan = fuse(G.load_model(path, list(dims)))
    return next(g for g in plan.groups if g.kind == "gemm"), plan


def test_constant_weight_is_refused(tmp_path):
    W = helper.make_tensor("W", TP.FLOAT, [8, 4], np.ones(32, np.float32).tolist())
    g, plan = _plan_of(tmp_path, [helper.make_node("MatMul", ["a", "W"], ["y"])],
                       [helper.make_tensor_value_info("a", TP.FLOAT, ["S", 8])],
                       [helper.make_tensor_value_info("y", TP.FLOAT, ["S", 4])], [W])
    with pytest.raises(UnsupportedOperatorError, match=rf"^group {g.name}: .*constant weight"):
        compile_batched_gemm_group(plan, g)


def test_a_batched_constant_is_read_like_an_activation(tmp_path):
    """[heads, K, N] constants (no 2-D weight for the GEMM family to prepack) are the batched
    kernel's: compiled, and equal to numpy's matmul."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 8, 4)).astype(np.float32)
    W = helper.make_tensor("W", TP.FLOAT, [3, 8, 4], w.reshape(-1).tolist())
    g, plan = _plan_of(tmp_path, [helper.make_node("MatMul", ["a", "W"], ["y"])],
                       [helper.make_tensor_value_info("a", TP.FLOAT, [3, "L", 8])],
                       [helper.make_tensor_value_info("y", TP.FLOAT, [3, "L", 4])], [W], dims=("L=1:64",))
    kernel = compile_batched_gemm_group(plan, g)
    for s in (1, 5, 17):
        a = rng.standard_normal((3, s, 8)).astype(np.float32)
        np.testing.assert_allclose(kernel.run({"a": a, "W": w}, {"L": s})["y"], a @ w, rtol=1e-5, atol=1e-5)


def test_epilogue_reading_a_transposed_result_is_refused(tmp_path):
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]),
             helper.make_node("Transpose", ["mm"], ["mt"], perm=[0, 2, 1]),
             helper.make_node("Relu", ["mt"], ["y"])]
    g, plan = _plan_of(tmp_path, nodes,
                       [helper.make_tensor_value_info("a", TP.FLOAT, [2, "S", 8]),
                        helper.make_tensor_value_info("b", TP.FLOAT, [2, 8, "S"])],
                       [helper.make_tensor_value_info("y", TP.FLOAT, [2, "S", "S"])])
    if not any(o.op_type == "Relu" for o in g.prologue_epilogue()[2]):
        pytest.skip(f"fusion did not put the transposed epilogue into the gemm group: {plan.describe()}")
    with pytest.raises(UnsupportedOperatorError, match=rf"^group {g.name}: .*reads the MatMul at"):
        compile_batched_gemm_group(plan, g)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_narrower_isas(attention, isa):
    from tscomp.codegen.cpu_gemm import ISA_RANK
    if ISA_RANK[host_isa()] < ISA_RANK[isa]:
        pytest.skip(f"host ISA {host_isa()}")
    path, plan, g = attention
    kernel = compile_batched_gemm_group(plan, g, isa=isa)
    assert f"_{isa}_" in kernel.func
    _ort_check(path, plan, kernel, 97, 13, 61)
